"""The optional C extension (``producerkit/_speedups.c``), loaded once for the whole package.

It is built at install time where a C compiler and Python's headers are; without it, or with
``PRODUCERKIT_NO_SPEEDUPS=1``, ``speedups`` is None. ``producerkit._core`` chooses the core's
implementation from it (C, else ``producerkit._core_py``); the Kafka backend's leaf functions
(record_batch, accumulator, idempotence) and ``serializers`` choose their C twins from it too.
``SPEEDUPS`` says whether it is on, for benchmarks and bug reports.
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
