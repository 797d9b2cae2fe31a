"""The Kafka wire's hot functions, chosen once, here: the C ones (the Kafka backend's own
extension, ``producerkit/backends/kafka/_cwire.c``) where they were built, else producerkit's own
Python encoder below, which writes the same bytes (``tests/test_record_batch.py`` compares both
with aiokafka's builder).

A :class:`Wire` is one implementation: ``encode_batch(records, start, max_bytes, time_shift) ->
(batch, end)`` (a RecordBatch v2 of ``records[start:end]``, taking records while it stays within
``max_bytes``, always at least one; a record's CreateTime is its ``timestamp`` where set, else its
deadline plus ``time_shift``; a fifth argument false leaves its CRC 0, for a batch stamped before
it is sent), ``encode_records`` (the same records section without its header,
with where it stopped and its first and max timestamps), ``frame_batch(section, codec, count,
first, latest)`` (a RecordBatch around a compressed section), ``crc32c_of(*parts)`` (CRC-32C of the
parts' concatenation) and ``partition_runs(records)`` (records grouped by topic and partition, in
first-seen order), and ``Appender``, the connection's ``send`` (see :class:`Appender`).
:data:`ACTIVE` is the one the backend uses; :data:`IMPLEMENTATIONS` lists the
ones this installation has, for tests that run both; :data:`SPEEDUPS` says whether the C one is
on (and its CRC-32C), for benchmarks and bug reports.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any, Final, NamedTuple

from producerkit._fast import load_extension
from producerkit._record import Record
from producerkit.backends.kafka import _aiokafka_compat

__all__ = ["ACTIVE", "IMPLEMENTATIONS", "PYTHON", "SPEEDUPS", "C", "Wire"]

#: RecordBatch v2: the header's length, and where the CRC and the attributes are in it.
HEADER_SIZE: Final = 61
CRC_AT: Final = 17
ATTRIBUTES_AT: Final = 21
_FRAME: Final = struct.Struct(">qiibIhiqqqhii")
_CRC: Final = struct.Struct(">I")


class Wire(NamedTuple):
    """One implementation of the Kafka wire's hot functions (see the module docstring)."""

    name: str
    encode_batch: Callable[..., tuple[bytes | bytearray, int]]
    encode_records: Callable[[list[Record], int, int, float], tuple[Any, int, int, int]]
    frame_batch: Callable[[Any, int, int, int, int], bytes]
    crc32c_of: Callable[..., int]
    partition_runs: Callable[[list[Record]], list[list[Record]]]
    Appender: Callable[..., Callable[[Record], Awaitable[None] | None]]


# --------------------------------------------------------------------------- Python


def _varint(value: int, out: bytearray) -> None:
    """``value`` as Kafka's zigzag varint, appended to ``out``."""
    value = (value << 1) ^ (value >> 63)
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _bytes_field(data: bytes | bytearray | memoryview | None, out: bytearray) -> None:
    if data is None:
        out.append(1)  # -1: null
        return
    _varint(len(data), out)
    out += data


def encode_records_in_python(
    records: list[Record], start: int, max_bytes: int, time_shift: float
) -> tuple[bytes, int, int, int]:
    """A batch's records section (no header), where it stopped, and its first and max
    timestamps: the Python twin of ``_cwire.encode_records``."""
    section = bytearray()
    size = HEADER_SIZE
    first = latest = 0
    end = start
    for index in range(start, len(records)):
        record = records[index]
        timestamp = record.timestamp
        if timestamp is None:
            timestamp = int((record.deadline + time_shift) * 1000 // 1)
        if index == start:
            first = latest = timestamp
        body = bytearray(b"\x00")  # attributes
        _varint(timestamp - first, body)
        _varint(index - start, body)  # offset delta
        _bytes_field(record.key, body)
        _bytes_field(record.value, body)
        headers = record.headers or ()
        _varint(len(headers), body)
        for name, value in headers:
            _bytes_field(name.encode(), body)
            _bytes_field(value, body)
        length = bytearray()
        _varint(len(body), length)
        if size + len(length) + len(body) > max_bytes and index > start:
            break
        section += length
        section += body
        size += len(length) + len(body)
        latest = max(latest, timestamp)
        end = index + 1
    return bytes(section), end, first, latest


def frame_batch_in_python(
    section: Any, codec: int, count: int, first_timestamp: int, max_timestamp: int
) -> bytes:
    """A RecordBatch around a records section (compressed with ``codec``, or not: 0): the
    Python twin of ``_cwire.frame_batch``."""
    return _framed(section, codec, count, first_timestamp, max_timestamp, checksum=True)


def _framed(
    section: Any,
    codec: int,
    count: int,
    first_timestamp: int,
    max_timestamp: int,
    *,
    checksum: bool,
) -> bytes:
    batch = bytearray(
        _FRAME.pack(
            0,  # base offset
            HEADER_SIZE + len(section) - 12,  # the length after the offset and this field
            -1,  # partition leader epoch
            2,  # magic
            0,  # CRC, below
            codec,
            count - 1,  # last offset delta
            first_timestamp,
            max_timestamp,
            -1,  # producer id
            -1,  # producer epoch
            -1,  # base sequence
            count,
        )
    )
    batch += section
    if checksum:
        _CRC.pack_into(batch, CRC_AT, crc32c_of_in_python(memoryview(batch)[ATTRIBUTES_AT:]))
    return bytes(batch)


def encode_batch_in_python(
    records: list[Record], start: int, max_bytes: int, time_shift: float, checksum: bool = True
) -> tuple[bytes, int]:
    """The Python twin of ``_cwire.encode_batch`` (``checksum`` false: the CRC left 0, for a
    batch stamped before it is sent)."""
    section, end, first, latest = encode_records_in_python(records, start, max_bytes, time_shift)
    return _framed(section, 0, end - start, first, latest, checksum=checksum), end


def crc32c_of_in_python(*parts: bytes | bytearray | memoryview) -> int:
    """CRC-32C of the parts' concatenation (aiokafka's CRC-32C: its C one where it has it)."""
    return _aiokafka_compat.crc32c(b"".join(bytes(part) for part in parts))


def partition_runs_in_python(records: list[Record]) -> list[list[Record]]:
    """``records`` grouped by (topic, partition): one list per pair, in the order each pair
    first appears, each in the records' order."""
    runs: dict[tuple[str, int | None], list[Record]] = {}
    for record in records:
        run = runs.get((record.topic, record.partition))
        if run is None:
            runs[(record.topic, record.partition)] = [record]
        else:
            run.append(record)
    return list(runs.values())


class Appender:
    """``append(record)``, a Kafka connection's ``send``: ``record`` added to its partition's
    open records (``queues[topic][partition]``, else ``queue_of(record)``, which makes the
    queue), its first one's time taken (``queue.opened_at = clock()``) where the sender
    lingers, and its ship arranged: a full batch (``gathering.batch_records`` records) goes to
    ``batch_full(queue)``, which seals and ships it, and its awaitable is returned (the caller
    yields to the loop); else, unless a ship is due (``gathering.ship_due``), one is scheduled
    after the linger if the partition has nothing in flight (with a request in flight, its
    answers ship what gathered: ``Sender.ship_all``). None otherwise. The C twin
    (``_cwire.Appender``) reads the slots of ``queue_type`` and the gathering in place."""

    __slots__ = (
        "_batch_full",
        "_clock",
        "_gathering",
        "_lingers",
        "_queue_of",
        "_queues",
        "_sender",
    )

    def __init__(
        self,
        queues: dict[str, dict[int, Any]],
        queue_of: Callable[[Record], Any],
        gathering: Any,
        sender: Any,
        batch_full: Callable[[Any], Awaitable[None]],
        clock: Callable[[], float],
        queue_type: type,
    ) -> None:
        self._queues = queues
        self._queue_of = queue_of
        self._gathering = gathering
        self._sender = sender
        self._batch_full = batch_full
        self._clock = clock
        self._lingers = sender.linger > 0

    def __call__(self, record: Record) -> Awaitable[None] | None:
        try:
            queue = self._queues[record.topic][record.partition]  # type: ignore[index]
        except KeyError:
            queue = self._queue_of(record)
        records = queue.records
        records.append(record)
        if len(records) == 1 and self._lingers:
            queue.opened_at = self._clock()
        gathering = self._gathering
        if len(records) >= gathering.batch_records:
            return self._batch_full(queue)
        if not gathering.ship_due and not queue.in_flight:
            sender = self._sender
            sender.schedule_ship(sender.linger)
        return None


PYTHON = Wire(
    "python",
    encode_batch_in_python,
    encode_records_in_python,
    frame_batch_in_python,
    crc32c_of_in_python,
    partition_runs_in_python,
    Appender,
)

# --------------------------------------------------------------------------- C

_cwire, SPEEDUPS = load_extension("producerkit.backends.kafka._cwire")
C: Wire | None = None
if _cwire is not None:
    SPEEDUPS += f" (crc32c: {_cwire.CRC32C})"
    _crc32c = _cwire.crc32c

    def _crc32c_of_in_c(*parts: bytes | bytearray | memoryview) -> int:
        crc = 0
        for part in parts:
            crc = _crc32c(part, crc)
        return int(crc)

    C = Wire(
        "c",
        _cwire.encode_batch,
        _cwire.encode_records,
        _cwire.frame_batch,
        _crc32c_of_in_c,
        _cwire.partition_runs,
        _cwire.Appender,
    )

#: The implementations this installation has: Python, and C where it was built.
IMPLEMENTATIONS: tuple[Wire, ...] = (PYTHON,) if C is None else (PYTHON, C)
#: The one the backend uses.
ACTIVE: Final[Wire] = C if C is not None else PYTHON
