"""Headers as Kafka carries them: repeated names and None values read back by another client in
order; a Failure keeps every pair (header_pairs) and retry_kwargs() resends them, with the
partition and CreateTime; NATS and JetStream refuse a None value."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import BackendCase, read_kafka

import producerkit as pk
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio

PAIRS = [("trace", b"a"), ("trace", b"b"), ("empty", b""), ("null", None), ("text", "caf\u00e9")]
EXPECTED = (
    ("trace", b"a"),
    ("trace", b"b"),
    ("empty", b""),
    ("null", None),
    ("text", b"caf\xc3\xa9"),
)


async def read_headers(
    url: str, topic: str, expected: int
) -> list[tuple[bytes | None, list[object]]]:
    """(value, header pairs) of each record, as aiokafka's consumer reads them."""
    records = await read_kafka(url, topic, expected)
    return [(record["value"], record["header_pairs"]) for record in records]


async def test_repeated_names_and_none_values_are_kept_in_order_or_refused(
    backend: BackendCase, topic: str
) -> None:
    """Where a header may have a None value, every pair is kept in order (read back by another
    client where the backend stores); elsewhere a None value is a MessageError saying why, and
    nothing is counted, while repeated names are fine."""
    without_none = [pair for pair in PAIRS if pair[1] is not None]
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        if not backend.spec.takes_null_header_values:
            for headers in (PAIRS, {"one": b"1", "none": None}):
                for nonblocking in (False, True):
                    with pytest.raises(pk.MessageError, match="no null value"):
                        await producer.produce(b"v", headers=headers, nonblocking=nonblocking)
            assert producer.stats.produced == 0
            await producer.produce(b"repeated", key=b"k", headers=without_none)
            assert (producer.stats.produced, producer.stats.acked) == (1, 1)
            return
        await producer.produce(b"blocking", key=b"k", headers=PAIRS)
        await producer.produce(b"nonblocking", key=b"k", headers=PAIRS, nonblocking=True)
        await producer.produce(b"mapping", key=b"k", headers={"one": b"1", "none": None})
        await producer.flush()
        assert (producer.stats.acked, producer.stats.failed) == (3, 0)
    if not backend.spec.stores_records:
        return
    found = [(r["value"], r["header_pairs"]) for r in await backend.read(topic, 3)]
    assert found == [
        (b"blocking", list(EXPECTED)),
        (b"nonblocking", list(EXPECTED)),
        (b"mapping", [("one", b"1"), ("none", None)]),
    ]


async def test_a_failure_keeps_every_pair_and_its_partition_for_the_retry(
    kafka_broker: SessionBroker, topic: str
) -> None:
    """Purged before it was written: the Failure has every header pair (``headers`` keeps the
    last value of each name, as before), the partition it was routed to and its CreateTime;
    produce(value, **retry_kwargs()) stores the same message there."""
    async with pk.Producer(kafka_broker.url, topic=topic) as producer:
        await producer.partitions_for(topic)
        await producer.produce(
            b"v", key=b"k", headers=PAIRS, partition=0, timestamp=1_600_000_000.5, nonblocking=True
        )
        (failure,) = producer.purge()
        assert isinstance(failure.exception, pk.Purged)
        assert failure.header_pairs == EXPECTED
        assert failure.headers == {
            "trace": b"b",
            "empty": b"",
            "null": None,
            "text": b"caf\xc3\xa9",
        }
        assert (failure.partition, failure.timestamp) == (0, 1_600_000_000.5)
        kwargs = failure.retry_kwargs()
        assert kwargs["headers"] == list(EXPECTED)
        assert (kwargs["partition"], kwargs["timestamp"]) == (0, 1_600_000_000.5)
        delivery = await producer.produce(failure.value, **kwargs)
        assert delivery is not None and (delivery.partition, delivery.timestamp) == (
            0,
            1_600_000_000.5,
        )
    assert await read_headers(kafka_broker.url, topic, 1) == [(b"v", list(EXPECTED))]


async def test_headers_of_another_shape_are_message_errors(
    backend: BackendCase, topic: str
) -> None:
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        text: Any = "a=1"
        number: Any = [("a", 1)]
        for nonblocking in (False, True):
            with pytest.raises(pk.MessageError, match="list of \\(name, value\\) pairs"):
                await producer.produce(b"v", headers=text, nonblocking=nonblocking)
            with pytest.raises(pk.MessageError, match="bytes, str or None value"):
                await producer.produce(b"v", headers=number, nonblocking=nonblocking)
        assert producer.stats.produced == 0
        assert await producer.produce(b"v", headers=[("a", b"1")]) is not None


async def test_a_byte_bounded_producer_takes_none_header_values_where_the_backend_does(
    backend: BackendCase, topic: str
) -> None:
    async with pk.Producer(
        backend.url, topic=topic, max_in_flight_bytes=1000, timeout=10, **backend.options
    ) as producer:
        if backend.spec.takes_null_header_values:
            await producer.produce(b"v", headers=[("a", None)])
        else:
            with pytest.raises(pk.MessageError, match="no null value"):
                await producer.produce(b"v", headers=[("a", None)])
            assert producer.stats.bytes_in_flight == 0
            await producer.produce(b"v", headers=[("a", b"")])
    assert producer.stats.acked == 1


async def test_each_message_reads_back_with_its_own_headers(
    backend: BackendCase, topic: str
) -> None:
    """Messages sharing one headers object, then others, then none (with and without a message
    id where the backend takes one), each read back with exactly its own headers: NATS makes
    a shared object's header block once and must not carry it over to the next message."""
    if not backend.spec.stores_records:
        pytest.skip(f"{backend.name}:// stores nothing to read back")
    subject = topic.replace("-", "")
    shared = {"h": b"1"}
    sent: list[tuple[bytes, dict[str, bytes]]] = [
        (b"a", {}),
        (b"b", shared),
        (b"c", shared),
        (b"d", {"h": b"2", "g": b"x"}),
        (b"e", {}),
        (b"f", shared),
    ]
    takes_ids = backend.spec.takes_expectations  # JetStream: msg_id is its Nats-Msg-Id
    async with pk.Producer(backend.url, topic=subject, **backend.options) as producer:
        for number, (value, headers) in enumerate(sent):
            msg_id = f"id-{number}" if takes_ids and not number % 2 else None
            await producer.produce(value, headers=headers or None, msg_id=msg_id)
        await producer.produce(b"g")
        await producer.flush()
    stored = await backend.read(subject, len(sent) + 1)
    # In partition order where there are partitions: compared by value.
    assert sorted((r["value"], r["headers"]) for r in stored) == [*sent, (b"g", {})]
