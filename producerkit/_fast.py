"""The optional C speedups (``producerkit/_speedups.c``), loaded once for the whole package.

They are built at install time where a C compiler and Python's headers are; without them, or
with ``PRODUCERKIT_NO_SPEEDUPS=1``, producerkit runs the same logic in Python (the tests run it
both ways). ``SPEEDUPS`` says which, for benchmarks and bug reports.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from producerkit._types import (
    CONNECTION,
    DEADLINE,
    FUTURE,
    HEADERS,
    KEY,
    MSG_ID,
    PARTITION,
    SEQ,
    TIMESTAMP,
    TOPIC,
    VALUE,
)

if TYPE_CHECKING:
    from types import ModuleType


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get("PRODUCERKIT_NO_SPEEDUPS"):
        return None, "off (PRODUCERKIT_NO_SPEEDUPS is set)"
    try:
        from producerkit import _speedups
    except ImportError:
        return None, "off (producerkit._speedups was not built: no C compiler at install?)"
    # The C functions read records by position: it must agree with producerkit._types.
    positions = (
        _speedups.RECORD_SEQ,
        _speedups.RECORD_VALUE,
        _speedups.RECORD_KEY,
        _speedups.RECORD_TOPIC,
        _speedups.RECORD_PARTITION,
        _speedups.RECORD_HEADERS,
        _speedups.RECORD_MSG_ID,
        _speedups.RECORD_DEADLINE,
        _speedups.RECORD_CONNECTION,
        _speedups.RECORD_FUTURE,
        getattr(_speedups, "RECORD_TIMESTAMP", None),  # absent from a build older than it
    )
    expected = (
        SEQ,
        VALUE,
        KEY,
        TOPIC,
        PARTITION,
        HEADERS,
        MSG_ID,
        DEADLINE,
        CONNECTION,
        FUTURE,
        TIMESTAMP,
    )
    if positions != expected or not hasattr(_speedups, "WindowCore"):
        return None, "off (producerkit._speedups is out of date: reinstall producerkit)"
    return _speedups, f"on (crc32c: {_speedups.CRC32C})"


speedups, SPEEDUPS = _load()

#: ``untracked(record) -> record``, or None: the GC stops tracking a record that holds only
#: bytes, str, numbers and None, so the records a batching backend holds cost collections nothing.
untracked: Any = speedups.untracked if speedups is not None else None

#: ``pop_run(pending, records) -> (count, waiting)``, or None: see InFlightWindow.acked_run.
pop_run: Any = speedups.pop_run if speedups is not None else None

#: ``Admission(router, window, sends, send_failed, topics, default_topic, max_payload)``, or
#: None: Producer.produce's common case in one call, composed of the C Router.route and
#: WindowCore.admit (the twins of producerkit._routing and producerkit._window).
Admission: Any = speedups.Admission if speedups is not None else None

#: What ``Admission.admit`` returns when it leaves a message to the Python path.
DECLINED: Any = speedups.DECLINED if speedups is not None else object()

#: ``Gather(queues, send)``, or None: the Kafka backend's send() when it only appends.
Gather: Any = speedups.Gather if speedups is not None else None
