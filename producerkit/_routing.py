"""Where a message goes: a producer's router (``Router`` of its core, see ``producerkit._core``),
made with the C function that computes its key hash where there is one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from producerkit.errors import ConfigurationError

if TYPE_CHECKING:
    from producerkit._core import Core
    from producerkit.partitioners import KeylessPartitioner


def new_router(
    core: Core,
    partitioner: Callable[[bytes, int], int],
    key_hash: Callable[[bytes], int] | None,
    keyless: KeylessPartitioner,
    connections: int,
) -> Any:
    """``core``'s Router, given the C function that computes ``key_hash`` where the core is C
    and there is one (:func:`native_hash`)."""
    address = native_hash(key_hash) if core.name == "c" else 0
    return core.Router(
        partitioner, key_hash, keyless.partition, connections, ConfigurationError,
        native_hash=address,
    )  # fmt: skip


def native_hash(key_hash: Callable[[bytes], int] | None) -> int:
    """The address of the C function that computes ``key_hash``, or 0: for xxhash's
    ``xxh3_64_intdigest`` (the default partitioner's hash), xxHash's ``XXH3_64bits_withSeed``
    as the xxhash package's extension exports it, found with ctypes. The C router checks it
    against ``key_hash`` before it uses it; where the symbol is not there, 0 (the router calls
    ``key_hash`` itself)."""
    try:
        import xxhash

        extension = importlib.import_module("xxhash._xxhash")
    except ImportError:
        return 0
    if key_hash is not getattr(xxhash, "xxh3_64_intdigest", None):
        return 0
    import ctypes

    try:
        function = ctypes.CDLL(extension.__file__).XXH3_64bits_withSeed
    except (AttributeError, OSError, TypeError):
        return 0
    return ctypes.cast(function, ctypes.c_void_p).value or 0
