"""produce(None, key=k): a Kafka tombstone (a null value), read back by another client as a null
value through each encoder; memory:// keeps it; NATS, JetStream and null:// refuse it (NATS's
refusals of a timestamp and of a None header value are tested here too)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import read_kafka

import producerkit as pk
from producerkit.backends.kafka import record_batch as _record_batch
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("encoder", ["default", "aiokafka", "gzip"])
async def test_a_kafka_tombstone_is_read_back_as_a_null_value(
    kafka_broker: SessionBroker, topic: str, encoder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if encoder == "aiokafka":
        monkeypatch.setattr(_record_batch, "encode_batch", _record_batch.encode_batch_with_aiokafka)
    options: dict[str, Any] = {"compression_type": "gzip"} if encoder == "gzip" else {}
    async with pk.Producer(kafka_broker.url, topic=topic, **options) as producer:
        for i in range(100):
            await producer.produce(b"v%d" % i, key=b"k%d" % i, nonblocking=True)
            await producer.produce(None, key=b"k%d" % i, nonblocking=True)
        delivery = await producer.produce(None, key="text key")
        await producer.flush()
        assert producer.stats.acked == 201
    assert delivery is not None and delivery.offset is not None
    records = await read_kafka(kafka_broker.url, topic, 201)
    assert sum(record["value"] is None for record in records) == 101
    assert {record["key"] for record in records if record["value"] is None} == {
        b"k%d" % i for i in range(100)
    } | {b"text key"}


async def test_memory_keeps_a_tombstone() -> None:
    async with pk.Producer("memory://", topic="t", value_serializer="json") as producer:
        await producer.produce(None, key=b"k")  # the serializer leaves None alone
        (stored,) = producer.backend.records  # type: ignore[attr-defined]
    assert (stored.key, stored.value) == (b"k", None)


async def test_a_tombstone_needs_a_key() -> None:
    async with pk.Producer("memory://", topic="t") as producer:
        with pytest.raises(pk.MessageError, match="needs the key"):
            await producer.produce(None)
        assert producer.stats.produced == 0


async def test_null_refuses_a_tombstone() -> None:
    async with pk.Producer("null://", topic="t") as producer:
        with pytest.raises(pk.MessageError, match="null:// stores nothing"):
            await producer.produce(None, key=b"k", nonblocking=True)


async def test_a_byte_bounded_producer_counts_a_tombstone_by_its_key() -> None:
    async with pk.Producer("memory://", topic="t", max_in_flight_bytes=1000) as producer:
        await producer.produce(None, key=b"k", headers=[("h", None)])
        assert producer.stats.peak_bytes_in_flight == 2  # the key and the header's name
    assert producer.stats.acked == 1


@pytest.mark.parametrize("scheme", ["nats", "jetstream"])
async def test_nats_refuses_what_it_cannot_store(
    nats_broker: SessionBroker, topic: str, scheme: str
) -> None:
    """A tombstone, a CreateTime and a None header value: each a MessageError saying why,
    nothing counted; repeated header names are fine."""
    options = {"create_stream": True} if scheme == "jetstream" else {}
    url = f"{scheme}://{nats_broker.host_port}"
    async with pk.Producer(url, topic=topic, **options) as producer:
        with pytest.raises(pk.MessageError, match="no null value"):
            await producer.produce(None, key=b"k")
        with pytest.raises(pk.MessageError, match=r"timestamp= is for Kafka.*header"):
            await producer.produce(b"v", timestamp=1_600_000_000)
        with pytest.raises(pk.MessageError, match="no null value"):
            await producer.produce(b"v", headers=[("a", b"1"), ("b", None)])
        assert producer.stats.produced == 0
        await producer.produce(b"v", headers=[("a", b"1"), ("a", b"2")])
        assert (producer.stats.produced, producer.stats.acked) == (1, 1)
