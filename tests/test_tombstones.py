"""produce(None, key=k): a Kafka tombstone (a null value), read back by another client as a null
value through each encoder, and on every backend that takes one; the others (NATS, JetStream,
null://) refuse it with their reason."""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import BackendCase, read_kafka

import producerkit as pk
from producerkit.backends.kafka import record_batch as _record_batch
from producerkit.backends.kafka import wire
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("encoder", ["default", "python", "gzip"])
async def test_a_kafka_tombstone_is_read_back_as_a_null_value(
    kafka_broker: SessionBroker, topic: str, encoder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if encoder == "python":
        monkeypatch.setattr(_record_batch, "encode_batch", wire.PYTHON.encode_batch)
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


async def test_a_tombstone_is_stored_or_refused(backend: BackendCase, topic: str) -> None:
    """Where the backend takes tombstones, produce(None, key=k) stores a null value (a value
    serializer leaves None alone) and reads back as one; elsewhere it is a MessageError giving
    the backend's reason, and nothing is counted."""
    async with pk.Producer(
        backend.url, topic=topic, value_serializer="json", timeout=10, **backend.options
    ) as producer:
        if not backend.spec.takes_tombstones:
            refusal = re.escape(backend.spec.tombstone_refusal or "")
            for nonblocking in (False, True):
                with pytest.raises(pk.MessageError, match=refusal):
                    await producer.produce(None, key=b"k", nonblocking=nonblocking)
            assert producer.stats.produced == 0
            return
        await producer.produce({"a": 1}, key=b"k")
        delivery = await producer.produce(None, key=b"k")
        await producer.produce(None, key="text key", nonblocking=True)
        await producer.flush()
        assert producer.stats.acked == 3
    assert delivery is not None
    if backend.spec.stores_records:
        records = await backend.read(topic, 3)
        assert [(r["key"], r["value"]) for r in records] == [
            (b"k", b'{"a":1}'),
            (b"k", None),
            (b"text key", None),
        ]


async def test_a_tombstone_needs_a_key(backend: BackendCase, topic: str) -> None:
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        reason = "needs the key" if backend.spec.takes_tombstones else "None"
        for nonblocking in (False, True):
            with pytest.raises(pk.MessageError, match=reason):
                await producer.produce(None, nonblocking=nonblocking)
        assert producer.stats.produced == 0


async def test_a_byte_bounded_producer_counts_a_tombstone_by_its_key(
    backend: BackendCase, topic: str
) -> None:
    async with pk.Producer(
        backend.url, topic=topic, max_in_flight_bytes=1000, timeout=10, **backend.options
    ) as producer:
        if not backend.spec.takes_tombstones:
            with pytest.raises(pk.MessageError):
                await producer.produce(None, key=b"k", headers=[("h", b"")])
            assert producer.stats.bytes_in_flight == 0 and producer.stats.produced == 0
            return
        await producer.produce(None, key=b"k", headers=[("h", b"")])
        assert producer.stats.peak_bytes_in_flight == 2  # the key and the header's name
    assert producer.stats.acked == 1
