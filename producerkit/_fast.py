"""The optional C extensions, each loaded once: the core's (``producerkit/_speedups.c``) here,
the Kafka wire's (``producerkit/backends/kafka/_cwire.c``) by ``producerkit.backends.kafka.wire``
through :func:`load_extension`.

They are built at install time where a C compiler and Python's headers are; without one, or with
``PRODUCERKIT_NO_SPEEDUPS=1``, it is None. ``producerkit._core`` chooses the core's
implementation from ``speedups`` (C, else ``producerkit._core_py``), and ``serializers`` its C
twin. ``SPEEDUPS`` says whether the core's is on, for benchmarks and bug reports.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from producerkit._record import Message, Record

if TYPE_CHECKING:
    from types import ModuleType

#: The positions the C code reads records and messages by (``RECORD_SEQ``, ``MESSAGE_KEY``, ...;
#: a record's ``slot`` is ``RECORD_FUTURE`` there).
POSITIONS: Mapping[str, int] = {
    **{
        f"RECORD_{'FUTURE' if name == 'slot' else name.upper()}": index
        for index, name in enumerate(Record._fields)
    },
    **{f"MESSAGE_{name.upper()}": index for index, name in enumerate(Message._fields)},
}


def load_extension(name: str, *, types: tuple[str, ...] = ()) -> tuple[ModuleType | None, str]:
    """The C extension ``name`` and a word on it (``"on"``, or ``"off (why)"``): None where it
    was not built, is out of date (a position it reads records by, one of :data:`POSITIONS` it
    exports, or a field of the ``types`` it exports, differs from ``producerkit._record``'s), or
    ``PRODUCERKIT_NO_SPEEDUPS`` is set."""
    if os.environ.get("PRODUCERKIT_NO_SPEEDUPS"):
        return None, "off (PRODUCERKIT_NO_SPEEDUPS is set)"
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None, f"off ({name} was not built: no C compiler at install?)"
    exported = {key: getattr(module, key) for key in POSITIONS if hasattr(module, key)}
    out_of_date = any(index != POSITIONS[key] for key, index in exported.items()) or any(
        not hasattr(getattr(module, kind, None), field)
        for kind in types
        for field in Record._fields
    )
    if not exported or out_of_date:
        return None, f"off ({name} is out of date: reinstall producerkit)"
    return module, "on"


speedups, SPEEDUPS = load_extension("producerkit._speedups", types=("Record",))
