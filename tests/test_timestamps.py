"""produce(timestamp=...): the Kafka record's CreateTime, read back exactly (to the millisecond)
by another client through each encoder; Delivery.timestamp on every backend that takes one;
memory:// keeps it; NATS and JetStream refuse it."""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest
from conftest import BackendCase, read_kafka

import producerkit as pk
from producerkit.backends.kafka import record_batch as _record_batch
from producerkit.backends.kafka import wire
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio

GIVEN = 1_600_000_000.123  # epoch seconds
AWARE = datetime.datetime(
    2021, 5, 4, 3, 2, 1, 987_654, tzinfo=datetime.timezone(datetime.timedelta(hours=2))
)
AWARE_MS = 1_620_090_121_987  # AWARE in epoch milliseconds (the microseconds dropped)


@pytest.mark.parametrize("encoder", ["default", "python", "gzip"])
async def test_kafka_createtime_is_read_back_exactly(
    kafka_broker: SessionBroker, topic: str, encoder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the C encoder, the Python one and a compressed batch: given CreateTimes
    (seconds, aware datetime) read back to the millisecond, the others at the produce time."""
    if encoder == "python":
        monkeypatch.setattr(_record_batch, "encode_batch", wire.PYTHON.encode_batch)
    options: dict[str, Any] = {"compression_type": "gzip"} if encoder == "gzip" else {}
    started_ms = time.time() * 1000
    async with pk.Producer(kafka_broker.url, topic=topic, **options) as producer:
        for i in range(300):
            stamp: float | datetime.datetime | None = (GIVEN + i, AWARE, None)[i % 3]
            await producer.produce(b"%d" % i, key=b"k", timestamp=stamp, nonblocking=True)
        delivery = await producer.produce(b"blocking", key=b"k", timestamp=GIVEN)
        await producer.flush()
    assert delivery is not None and delivery.timestamp == GIVEN
    records = await read_kafka(kafka_broker.url, topic, 301)
    assert len(records) == 301
    for record in records:
        if record["value"] == b"blocking":
            assert record["timestamp"] == 1_600_000_000_123
            continue
        i = int(record["value"])
        if i % 3 == 0:
            assert record["timestamp"] == 1_600_000_000_123 + i * 1000
        elif i % 3 == 1:
            assert record["timestamp"] == AWARE_MS
        else:
            assert started_ms - 1000 < record["timestamp"] < time.time() * 1000 + 1000


async def test_a_given_timestamp_is_stored_and_reported_or_refused(
    backend: BackendCase, topic: str
) -> None:
    """Where the backend takes a timestamp, the Delivery reports the one given (seconds or an
    aware datetime, to the millisecond) and a backend that stores it stores exactly that; where
    it does not, produce(timestamp=...) is a MessageError saying why, and nothing is counted."""
    told: list[pk.Delivery | pk.Failure] = []
    async with pk.Producer(
        backend.url,
        topic=topic,
        timeout=10,
        on_delivery=lambda result, _: told.append(result),
        **backend.options,
    ) as producer:
        if not backend.spec.takes_timestamps:
            for stamp in (GIVEN, AWARE):
                for nonblocking in (False, True):
                    with pytest.raises(pk.MessageError, match="timestamp="):
                        await producer.produce(b"v", timestamp=stamp, nonblocking=nonblocking)
            assert producer.stats.produced == 0
            return
        delivery = await producer.produce(b"given", key=b"k", timestamp=GIVEN)
        await producer.produce(b"aware", key=b"k", timestamp=AWARE, nonblocking=True)
        await producer.flush()
    assert delivery is not None
    if not backend.fake_append_time:
        assert delivery.timestamp == GIVEN
        assert [getattr(result, "timestamp", None) for result in told] == [GIVEN, AWARE_MS / 1000]
    if backend.spec.stores_timestamps and backend.spec.stores_records:
        stored = {r["value"]: r["timestamp"] for r in await backend.read(topic, 2)}
        assert stored == {b"given": 1_600_000_000_123, b"aware": AWARE_MS}


async def test_the_delivery_timestamp_is_what_was_stored(backend: BackendCase, topic: str) -> None:
    """Without timestamp= a blocking produce's Delivery reports the produce time the record was
    stored with, where the backend stores one (and None where it does not)."""
    if backend.fake_append_time:
        pytest.skip("the broker reports a made-up LogAppendTime (librdkafka's mock: 1234 ms)")
    started = time.time()
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        delivery = await producer.produce(b"now", key=b"k")
    assert delivery is not None
    if not backend.spec.stores_timestamps:
        assert delivery.timestamp is None
        return
    assert delivery.timestamp is not None
    assert started - 1 < delivery.timestamp < time.time() + 1
    if backend.spec.stores_records:
        (record,) = await backend.read(topic, 1)
        assert record["timestamp"] == round(delivery.timestamp * 1000)


async def test_memory_keeps_the_timestamp() -> None:
    async with pk.Producer("memory://", topic="t") as producer:
        delivery = await producer.produce(b"v", timestamp=GIVEN)
        await producer.produce(b"w", nonblocking=True)
        stored = producer.backend.records  # type: ignore[attr-defined]
    assert delivery is not None and delivery.timestamp == GIVEN
    assert stored[0].timestamp == GIVEN
    assert stored[1].timestamp is None  # nonblocking, no timestamp=: none was fixed


BAD: list[Any] = [
    datetime.datetime(2021, 5, 4),  # naive
    -1,
    float("nan"),
    float("inf"),
    True,
    "1600000000",
    253_402_300_800,  # year 10000
]


async def test_bad_timestamps_are_message_errors(backend: BackendCase, topic: str) -> None:
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        for bad in BAD:
            for nonblocking in (False, True):
                with pytest.raises(pk.MessageError, match="timestamp"):
                    await producer.produce(b"v", timestamp=bad, nonblocking=nonblocking)
        assert producer.stats.produced == 0


async def test_a_log_append_time_from_the_broker_is_what_delivery_reports() -> None:
    """A topic with message.timestamp.type=LogAppendTime stores the broker's time: the sender
    passes the response's log_append_time to the window, and the Delivery reports it (Tansu
    keeps CreateTime only, so the window is driven directly here)."""
    import asyncio

    from producerkit._record import Message
    from producerkit._window import InFlightWindow

    window = InFlightWindow(10, 30.0, 1, None)
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(2)]
    message = Message(b"v", None, "t", None, None, None, 1_000)
    records = [window.admit(message, 0, 0, future) for future in futures]
    window.acked_run(records, 40, stored_at=1_700_000_000_123)
    first, second = (future.result() for future in futures)
    assert (first.offset, second.offset) == (40, 41)
    assert first.timestamp == second.timestamp == 1_700_000_000.123
    window.stop_timer()
