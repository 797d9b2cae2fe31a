"""Where a message goes: its partition among its topic's, and which connection carries it.

:class:`PyRouter` is the one place this is decided; ``producerkit._speedups.Router`` is its C
twin (same constructor, same ``route()``), used where it was built. ``Router`` is whichever
this installation has; the differential tests compare the two.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from producerkit import _fast
from producerkit.errors import ConfigurationError

if TYPE_CHECKING:
    from producerkit.partitioners import KeylessPartitioner


class PyRouter:
    """Routes messages for one producer.

    ``partitioner(key, n)`` places keyed messages (``key_hash(key) % n`` when it is a plain
    modulo of a C hash, one Python call less); ``keyless.partition(topic, n)`` places the rest.
    A partition always uses connection ``partition % connections``; an unpartitioned keyed
    message (NATS) uses ``partitioner(key, connections)``, so one key keeps one connection and
    its order; the rest take the connections in turn.
    """

    __slots__ = ("_connections", "_key_hash", "_keyless", "_partitioner", "_round_robin")

    def __init__(
        self,
        partitioner: Callable[[bytes, int], int],
        key_hash: Callable[[bytes], int] | None,
        keyless: KeylessPartitioner,
        connections: int,
        native_hash: int = 0,
    ) -> None:
        """``native_hash``: taken by the C twin (see :func:`native_hash`); unused here."""
        if connections < 1:
            raise ValueError("Router: connections must be at least 1")
        self._partitioner = partitioner
        self._key_hash = key_hash
        self._keyless = keyless
        self._connections = connections
        self._round_robin = 0

    def route(
        self, topic: str, key: bytes | None, partition: int | None, num_partitions: int | None
    ) -> tuple[int | None, int]:
        """``(partition, connection)``: the given partition (checked by the caller) or the one
        chosen for the key or for a keyless message; None where the topic is unpartitioned."""
        if partition is None and num_partitions is not None:
            if key is None:
                partition = self._keyless.partition(topic, num_partitions)
            elif self._key_hash is not None:
                partition = self._key_hash(key) % num_partitions
            else:
                partition = self._partitioner(key, num_partitions)
        connections = self._connections
        if connections == 1:
            return partition, 0
        if partition is not None:
            return partition, self._connection_of(partition)
        if key is not None:
            return partition, self._connection_of(self._partitioner(key, connections))
        self._round_robin = (self._round_robin + 1) % connections
        return partition, self._round_robin

    def _connection_of(self, number: Any) -> int:
        if type(number) is not int:
            raise ConfigurationError(
                f"the partitioner returned {number!r}, which is not a partition number (an int)"
            )
        return number % self._connections


#: The router this installation runs: the C twin where it was built.
Router: Any = _fast.speedups.Router if _fast.speedups is not None else PyRouter


def new_router(
    partitioner: Callable[[bytes, int], int],
    key_hash: Callable[[bytes], int] | None,
    keyless: KeylessPartitioner,
    connections: int,
) -> Any:
    """A :data:`Router`, given the C function that computes ``key_hash`` where there is one
    (:func:`native_hash`)."""
    address = native_hash(key_hash) if Router is not PyRouter else 0
    return Router(partitioner, key_hash, keyless, connections, native_hash=address)


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
