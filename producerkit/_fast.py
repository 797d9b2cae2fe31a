"""The optional C speedups (``producerkit/_speedups.c``), loaded once for the whole package.

They are built at install time where a C compiler and Python's headers are; without them, or
with ``PRODUCERKIT_NO_SPEEDUPS=1``, producerkit runs the same logic in Python (the tests run it
both ways). Each C function is chosen, over its Python twin, in the module that owns the twin
(``_window``, ``_routing``, ``backends.kafka.record_batch``, ``_producer``). ``SPEEDUPS`` says
whether they are on, for benchmarks and bug reports.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from producerkit._record import Message, Record

if TYPE_CHECKING:
    from types import ModuleType


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get("PRODUCERKIT_NO_SPEEDUPS"):
        return None, "off (PRODUCERKIT_NO_SPEEDUPS is set)"
    try:
        from producerkit import _speedups
    except ImportError:
        return None, "off (producerkit._speedups was not built: no C compiler at install?)"
    # The C functions read records and messages by position: they must agree with _record.
    positions = {
        **{f"RECORD_{name.upper()}": Record._fields.index(name) for name in Record._fields},
        **{f"MESSAGE_{name.upper()}": Message._fields.index(name) for name in Message._fields},
    }
    positions["RECORD_FUTURE"] = positions.pop("RECORD_SLOT")
    if any(getattr(_speedups, name, None) != index for name, index in positions.items()) or any(
        not hasattr(getattr(_speedups, "Record", None), name) for name in Record._fields
    ):
        return None, "off (producerkit._speedups is out of date: reinstall producerkit)"
    return _speedups, f"on (crc32c: {_speedups.CRC32C})"


speedups, SPEEDUPS = _load()
