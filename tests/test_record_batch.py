"""The Kafka record-batch encoders: producerkit's wire encoders (C, and its own Python one)
write exactly the bytes aiokafka's builder writes, and each reads back (keys, values, headers,
timestamps, offsets, CRC) with aiokafka's own batch reader. A Kafka round trip through each
encoder is in test_fast_paths.py."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("aiokafka")

from aiokafka.record.default_records import DefaultRecordBatch

from producerkit._record import Record
from producerkit.backends.kafka import _aiokafka_compat, wire

try:
    from producerkit.backends.kafka import _cwire
except ImportError:  # no compiler at install time: only the fallback is there to test
    _cwire = None  # type: ignore[assignment]

needs_cwire = pytest.mark.skipif(_cwire is None, reason=f"the C Kafka wire: {wire.SPEEDUPS}")

TIMEOUT = 30.0


def record(
    seq: int,
    value: bytes | None,
    key: bytes | None = None,
    headers: tuple[tuple[str, bytes | None], ...] | None = None,
    produced_at: float = 1000.0,
    timestamp_ms: int | None = None,
) -> Record:
    return Record(
        seq,
        value,  # None: a tombstone
        key,
        "t",
        0,
        headers,  # type: ignore[arg-type]  # a None header value: Kafka's null
        None,
        produced_at + TIMEOUT,
        0,
        None,
        timestamp_ms,
    )


def read_back(
    data: bytes | bytearray,
) -> list[tuple[int, int, bytes | None, bytes | None, list[object]]]:
    batch = DefaultRecordBatch(bytes(data))
    assert batch.validate_crc()
    return [
        (item.offset, item.timestamp, item.key, item.value, list(item.headers)) for item in batch
    ]


def encode_batch_with_aiokafka(
    records: list[Record], start: int, max_bytes: int, time_shift: float
) -> tuple[bytes | bytearray, int]:
    """The same batch through aiokafka's builder: the reference."""
    builder = _aiokafka_compat.new_record_batch_builder(0, max_bytes)
    end = _aiokafka_compat.append_records(builder.append, records, start, time_shift)
    return builder.build(), end


ENCODERS = {"aiokafka": encode_batch_with_aiokafka} | {
    each.name: each.encode_batch for each in wire.IMPLEMENTATIONS
}


@pytest.mark.parametrize("encode", ENCODERS.values(), ids=ENCODERS.keys())
def test_a_batch_reads_back_with_aiokafkas_reader(encode: object) -> None:
    shift = 1_700_000_000.0 - 1000.0 - TIMEOUT  # produced at monotonic 1000.0 -> that wall time
    records = [
        record(1, b"v1", b"k1", produced_at=1000.0),
        record(2, b"", None, produced_at=1000.0042),
        record(3, b"x" * 300, b"k" * 200, (("h", b"1"), ("\u00e9t\u00e9", b"")), 1000.5),
        record(
            4, None, b"gone", (("h", None), ("h", b"2")), 1000.6, timestamp_ms=1_600_000_000_123
        ),
    ]
    data, end = encode(records, 0, 1 << 20, shift)  # type: ignore[operator]
    assert end == 4
    assert read_back(data) == [
        (0, 1_700_000_000_000, b"k1", b"v1", []),
        (1, 1_700_000_000_004, None, b"", []),
        (2, 1_700_000_000_500, b"k" * 200, b"x" * 300, [("h", b"1"), ("\u00e9t\u00e9", b"")]),
        (3, 1_600_000_000_123, b"gone", None, [("h", None), ("h", b"2")]),
    ]


@pytest.mark.parametrize("encode", ENCODERS.values(), ids=ENCODERS.keys())
def test_a_batch_stops_before_max_bytes_and_always_takes_one(encode: object) -> None:
    records = [record(i, b"v" * 100, b"k%d" % i) for i in range(50)]
    data, end = encode(records, 0, 1000, 0.0)  # type: ignore[operator]
    assert 1 < end < 50 and len(data) <= 1000
    rest, next_end = encode(records, end, 1000, 0.0)  # type: ignore[operator]
    assert [item[3] for item in read_back(rest)] == [b"v" * 100] * (next_end - end)
    huge = [record(1, b"v" * 5000)]
    data, end = encode(huge, 0, 1000, 0.0)  # type: ignore[operator]
    assert end == 1 and read_back(data)[0][3] == b"v" * 5000


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.none() | st.binary(max_size=300),
            st.none() | st.binary(max_size=40),
            st.none()
            | st.lists(
                st.tuples(st.text(min_size=1, max_size=8), st.none() | st.binary(max_size=20)),
                max_size=3,
            ),
            st.floats(min_value=0, max_value=5),
            st.none() | st.integers(min_value=0, max_value=2**41),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(min_value=61, max_value=4000),
    st.integers(min_value=0, max_value=5),
)
def test_every_wire_encoder_writes_aiokafkas_bytes(
    messages: list[
        tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None, float, int | None]
    ],
    max_bytes: int,
    start_at: int,
) -> None:
    """Tombstones, null header values and given CreateTimes among them."""
    records = [
        record(i, value, key, tuple(headers) if headers else None, 500.0 + delay, timestamp)
        for i, (value, key, headers, delay, timestamp) in enumerate(
            sorted(messages, key=lambda m: m[3])
        )
    ]
    start = min(start_at, len(records) - 1)
    data, end = wire.ACTIVE.encode_batch(records, start, max_bytes, 1e9)
    assert end > start and (len(data) <= max_bytes or end == start + 1)
    if end < len(records):  # it stopped because the next record would not fit
        assert len(wire.ACTIVE.encode_batch(records[: end + 1], start, 1 << 30, 1e9)[0]) > max_bytes
    for other in wire.IMPLEMENTATIONS:  # each implementation cuts at the same record
        assert tuple(map(bytes, other.encode_batch(records, start, max_bytes, 1e9)[:1])) == (
            bytes(data),
        )
        assert other.encode_batch(records, start, max_bytes, 1e9)[1] == end
    # The same records through aiokafka's builder: the same bytes. (Where to cut is each
    # encoder's own: aiokafka's compiled builder estimates a record's size, this one counts it.)
    expected, expected_end = encode_batch_with_aiokafka(records[:end], start, 1 << 30, 1e9)
    assert (bytes(data), end) == (bytes(expected), expected_end)


@needs_cwire
def test_the_c_encoder_names_a_record_it_cannot_read() -> None:
    assert _cwire is not None
    with pytest.raises(TypeError, match="not a producerkit Record"):
        _cwire.encode_batch([("not", "a record")], 0, 1000, 0.0)
    with pytest.raises(IndexError):
        _cwire.encode_batch([], 0, 1000, 0.0)
    bad_headers = record(1, b"v", None, (("name", "not bytes"),))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"\(str, bytes or None\) pairs"):
        _cwire.encode_batch([bad_headers], 0, 1000, 0.0)


@needs_cwire
def test_crc32c_matches_aiokafkas() -> None:
    from aiokafka.record.util import calc_crc32c

    assert _cwire is not None
    for data in (b"", b"a", b"123456789", bytes(range(256)) * 33):
        assert _cwire.crc32c(data) == calc_crc32c(data)
    assert _cwire.crc32c(b"123456789") == 0xE3069283  # the standard check value
    # Around the lengths where the hardware CRC runs three streams at once (3 x 256 and
    # 3 x 8192 bytes), from unaligned starts, and continued from a CRC given.
    data = bytes(random.Random(7).getrandbits(8) for _ in range(3 * 8192 * 2 + 1000))
    for length in (767, 768, 769, 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 9, len(data) - 3):
        for start in (0, 1, 3):
            part = data[start : start + length]
            assert _cwire.crc32c(part) == calc_crc32c(part), (length, start)
            half = length // 2
            assert _cwire.crc32c(part[half:], _cwire.crc32c(part[:half])) == calc_crc32c(part)


def test_pop_run_settles_a_run_and_names_the_blocking_ones(core: Any) -> None:
    import asyncio

    pop_run = core.pop_run
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        records = [record(seq, b"v") for seq in range(1, 6)]
        records[3] = records[3]._replace(slot=future)
        pending = {record_.seq: record_ for record_ in records}
        del pending[2]  # failed (timed out) before the ack came: not counted again
        assert pop_run(pending, records) == (4, [3])
        assert pending == {}
        assert pop_run(pending, records) == (0, None)
        if core.name == "c":
            with pytest.raises(TypeError, match="not a producerkit Record"):
                pop_run({}, [(1, 2)])
    finally:
        loop.close()


@settings(max_examples=200, deadline=None)
@given(
    places=st.lists(
        st.tuples(
            st.sampled_from(["tt", "uu"]),
            st.booleans(),
            st.integers(min_value=0, max_value=40) | st.integers(min_value=1020, max_value=1030),
        ),
        max_size=300,
    )
)
def test_partition_runs_groups_in_first_seen_order_on_both_twins(
    places: list[tuple[str, bool, int]],
) -> None:
    """Records grouped by (topic, partition) in the order each pair first appears, each group
    in the records' order: the C twin equals the Python one and the definition, with more
    groups than the C twin scans one by one, partitions past those it indexes, and topics and
    partitions that are equal but not the same object."""
    records = [
        record(seq, b"v")._replace(
            topic=(topic + "!")[:-1] if copied else topic, partition=int(str(partition))
        )
        for seq, (topic, copied, partition) in enumerate(places)
    ]
    expected: dict[tuple[str, int], list[int]] = {}
    for each in records:
        expected.setdefault((each.topic, each.partition), []).append(each.seq)
    python = wire.PYTHON.partition_runs(records)
    assert [[each.seq for each in run] for run in python] == list(expected.values())
    if _cwire is not None:
        assert _cwire.partition_runs(records) == python
        with pytest.raises(TypeError, match="not a producerkit Record"):
            _cwire.partition_runs([(1, 2)])


def test_sealing_a_count_of_open_records_leaves_the_rest_open() -> None:
    """Accumulator.seal(queue, count) encodes the first ``count`` open records into batches
    and leaves the rest open for the next records (what a handed-over chunk does: only whole
    batches are sealed, as one record at a time would seal them)."""
    from types import SimpleNamespace

    from producerkit.backends.kafka.accumulator import Accumulator, Gathering

    records = [record(seq, b"v%d" % seq, b"k") for seq in range(10)]
    reports = SimpleNamespace(failed_count=0, pending={r.seq: r for r in records})
    accumulator = Accumulator(
        queues={},
        encode=wire.PYTHON.encode_batch,
        max_batch_size=1 << 20,
        request_timeout=TIMEOUT,
        timeout=TIMEOUT,
        gathering=Gathering(),
        fail=lambda records, exc: pytest.fail(f"{len(records)} records failed: {exc}"),
        reports=reports,  # type: ignore[arg-type]
    )
    queue = accumulator.queue_of(records[0])
    queue.records += records
    accumulator.seal(queue, 8)
    assert [[r.seq for r in batch.records] for batch in queue.full] == [list(range(8))]
    assert [r.seq for r in queue.records] == [8, 9]
    accumulator.seal(queue)
    assert [[r.seq for r in batch.records] for batch in queue.full] == [list(range(8)), [8, 9]]
    assert queue.records == []
    assert [value for *_, value, _ in read_back(queue.full[1].data)] == [b"v8", b"v9"]


@pytest.mark.parametrize("implementation", wire.IMPLEMENTATIONS, ids=lambda w: w.name)
def test_a_batch_left_without_its_crc_is_stamped_as_one_with_it(implementation: Any) -> None:
    """``encode_batch(..., False)`` (an idempotent producer's: its stamp makes the CRC) leaves
    the CRC 0 and nothing else changed, and the stamp makes both batches the same bytes."""
    from producerkit.backends.kafka import idempotence

    records = [record(i, b"v%d" % i, b"k") for i in range(20)]
    checked, end = implementation.encode_batch(records, 0, 1 << 20, 0.0)
    unchecked, unchecked_end = implementation.encode_batch(records, 0, 1 << 20, 0.0, False)
    assert unchecked_end == end
    assert bytes(unchecked[17:21]) == b"\0\0\0\0"
    assert bytes(unchecked[:17]) + bytes(unchecked[21:]) == bytes(checked[:17]) + bytes(
        checked[21:]
    )
    producer = idempotence.ProducerId(7, 1)
    heads = [idempotence.stamp(data, producer, 40) for data in (checked, unchecked)]
    assert heads[0] == heads[1]
    assert DefaultRecordBatch(heads[1] + bytes(unchecked[61:])).validate_crc()


class _Sender:
    """What an Appender reads of the sender, and the ships it schedules."""

    def __init__(self, linger: float) -> None:
        self.linger = linger
        self.max_batches_in_flight = 2
        self.ships: list[float] = []

    def schedule_ship(self, delay: float = 0.0) -> None:
        self.ships.append(delay)


@pytest.mark.parametrize("linger", [0.0, 0.005])
def test_both_appenders_append_and_arrange_ships_alike(linger: float) -> None:
    """The C and the Python ``Appender`` (a Kafka connection's ``send``), fed the same records:
    the same queues, first-record times, full batches and scheduled ships."""
    from producerkit.backends.kafka.accumulator import Gathering, PartitionQueue

    seen = []
    for implementation in wire.IMPLEMENTATIONS:
        queues: dict[str, dict[int, PartitionQueue]] = {}

        def queue_of(record: Record, queues: dict[str, dict[int, PartitionQueue]] = queues) -> Any:
            queue = PartitionQueue(record.topic, record.partition)  # type: ignore[arg-type]
            queues.setdefault(record.topic, {})[record.partition] = queue  # type: ignore[index]
            return queue

        gathering, sender, full = Gathering(), _Sender(linger), []
        gathering.batch_records = 3

        def batch_full(queue: PartitionQueue, full: list[int] = full) -> Any:
            full.append(len(queue.records))
            queue.records.clear()  # sealed
            return "yield"

        ticks = iter(range(100))
        append = implementation.Appender(
            queues, queue_of, gathering, sender, batch_full,
            lambda ticks=ticks: float(next(ticks)), PartitionQueue,
        )  # fmt: skip
        outcomes = []
        for seq in range(8):
            if seq == 4:
                gathering.ship_due = True  # a ship is due: none more is scheduled
            if seq == 6:
                gathering.ship_due = False
                for queue in queues["t"].values():
                    queue.in_flight = 1  # its answers ship what gathers
            message = record(seq, b"v", b"k")
            outcomes.append(append(message._replace(partition=seq % 2)))
        seen.append(
            (
                outcomes,
                {p: [r.seq for r in q.records] for p, q in queues["t"].items()},
                {p: q.opened_at for p, q in queues["t"].items()},
                full,
                sender.ships,
            )
        )
    if len(seen) == 2:
        assert seen[0] == seen[1]
    outcomes, records, opened_at, full, ships = seen[0]
    assert outcomes == [None] * 4 + ["yield", "yield", None, None]
    assert records == {0: [6], 1: [7]} and full == [3, 3]  # 0, 2, 4 and 1, 3, 5 sealed
    assert opened_at == ({0: 2.0, 1: 3.0} if linger else {0: 0.0, 1: 0.0})
    assert ships == [linger] * 4
