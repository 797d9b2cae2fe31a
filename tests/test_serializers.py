"""Serializers: values and keys turned into bytes before they are produced, read back by other
clients on real brokers; a serializer that raises fails only that call."""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import pytest
from conftest import BackendCase, read_kafka

import producerkit as pk
from producerkit import serializers

pytestmark = pytest.mark.anyio

ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "amount", "type": "double"},
    ],
}


async def test_built_in_serializers_read_back_by_another_client(
    backend: BackendCase, topic: str
) -> None:
    """value_serializer="json" and key_serializer="str": what is stored is the compact JSON and
    the UTF-8 key (read back where the backend stores; keys where it keeps them)."""
    orders = [{"id": i, "user": f"u{i % 3}", "items": [i, i + 1], "c": "é"} for i in range(200)]
    async with pk.Producer(
        backend.url,
        topic=topic,
        value_serializer="json",
        key_serializer="str",
        timeout=10,
        **backend.options,
    ) as producer:
        await producer.produce([1, None, True], key=b"raw")
        for order in orders:
            await producer.produce(order, key=order["user"], nonblocking=True)
        await producer.produce("text")
        await producer.flush()
        assert (producer.stats.acked, producer.stats.failed) == (202, 0)
    if not backend.spec.stores_records:
        return
    records = await backend.read(topic, 202)
    values = [record["value"] for record in records]  # in partition order on Kafka
    assert {b"[1,null,true]", b'"text"'} <= set(values) and len(values) == 202
    stored = [json.loads(v) for v in values if v.startswith(b"{")]
    assert sorted(stored, key=lambda o: o["id"]) == orders
    assert all('"c":"é"'.encode() in v for v in values if v.startswith(b"{"))
    if backend.spec.partitioned:
        keys = {r["key"] for r in records}
        assert keys == {b"raw", b"u0", b"u1", b"u2", None}


async def test_a_failing_serializer_fails_only_that_call(backend: BackendCase, topic: str) -> None:
    def picky(obj: Any) -> bytes:
        if obj == "bad":
            raise ValueError("no bad values")
        return str(obj).encode()

    async with pk.Producer(
        backend.url, topic=topic, value_serializer=picky, timeout=10, **backend.options
    ) as producer:
        await producer.produce("ok-1", key=b"k1")
        for nonblocking in (False, True):
            with pytest.raises(pk.SerializationError, match="value_serializer") as caught:
                await producer.produce("bad", key=b"k2", nonblocking=nonblocking)
            assert isinstance(caught.value, pk.MessageError)
            assert isinstance(caught.value.__cause__, ValueError)
            assert "b'k2'" in str(caught.value) and repr(topic) in str(caught.value)
        with pytest.raises(pk.SerializationError, match="not JSON serializable"):
            await pk.Producer(backend.url, topic=topic, value_serializer="json").produce(
                {1, 2}  # a set is not JSON
            )
        await producer.produce("ok-2", key=b"k3")
        stats = producer.stats
        assert (stats.produced, stats.acked, stats.failed) == (2, 2, 0)
    if backend.spec.stores_records:
        assert sorted(r["value"] for r in await backend.read(topic, 2)) == [b"ok-1", b"ok-2"]


def test_bad_serializer_settings_are_configuration_errors() -> None:
    with pytest.raises(pk.ConfigurationError, match="unknown value_serializer 'yaml'"):
        pk.Producer("memory://", topic="t", value_serializer="yaml")
    with pytest.raises(pk.ConfigurationError, match="key_serializer must be a callable"):
        pk.Producer("memory://", topic="t", key_serializer=42)  # type: ignore[arg-type]
    with pytest.raises(pk.ConfigurationError, match="schema_id"):
        serializers.avro(ORDER_SCHEMA, schema_id=-1)
    with pytest.raises(pk.ConfigurationError, match="invalid Avro schema"):
        serializers.avro({"type": "no-such-type"}, schema_id=1)


def test_produce_is_the_class_method_whatever_the_settings() -> None:
    """No method is assigned on an instance: what a reader sees in the class is what runs."""
    for settings in ({}, {"value_serializer": "json"}, {"propagate_trace": False}):
        producer = pk.Producer("memory://", topic="t", **settings)
        assert "produce" not in vars(producer) if hasattr(producer, "__dict__") else True
        assert producer.produce.__func__ is pk.Producer.produce  # type: ignore[attr-defined]


async def test_avro_in_the_confluent_frame_read_back_by_fastavro(
    kafka_broker: Any, topic: str
) -> None:
    import fastavro

    orders = [{"id": i, "user": f"u{i}", "amount": i / 4} for i in range(50)]

    async def main() -> list[dict[str, Any]]:
        async with pk.Producer(
            kafka_broker.url,
            topic=topic,
            value_serializer=serializers.avro(ORDER_SCHEMA, schema_id=42),
        ) as producer:
            for order in orders:
                await producer.produce(order, key=order["user"], nonblocking=True)
            await producer.flush()
        return await read_kafka(kafka_broker.url, topic, len(orders))

    decoded = []
    parsed = fastavro.parse_schema(ORDER_SCHEMA)
    for record in await main():
        magic, schema_id = struct.unpack(">bI", record["value"][:5])
        assert (magic, schema_id) == (0, 42)
        decoded.append(fastavro.schemaless_reader(io.BytesIO(record["value"][5:]), parsed))
    assert sorted(decoded, key=lambda o: o["id"]) == orders


def test_json_gives_each_value_in_bytes_of_its_own_size() -> None:
    """The built-in json serializer's bytes equal orjson's, each a new object no larger than
    its content needs (orjson's own are cut from a larger buffer), and what orjson raises
    passes through."""
    orjson = pytest.importorskip("orjson")
    import sys

    dumps = serializers.resolve("json", "value_serializer")
    assert dumps is not None
    value = {"id": 7, "note": "x" * 440, "tags": ["a", "b"]}
    made = dumps(value)
    assert made == orjson.dumps(value) and type(made) is bytes
    assert sys.getsizeof(made) == sys.getsizeof(b"") + len(made)
    with pytest.raises(TypeError):
        dumps({"not json": object()})
    from producerkit._fast import speedups

    if speedups is not None:
        copying = speedups.ExactBytes(lambda obj: obj)
        assert copying(5) == 5  # not bytes: as it is
        held = b"held"
        assert copying(held) == held and copying(held) is not held
        with pytest.raises(TypeError, match="not callable"):
            speedups.ExactBytes(3)
