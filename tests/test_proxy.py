"""The delay proxy against the session brokers: it adds the round trip it is asked for, Kafka
clients (aiokafka and librdkafka) stay behind it after reading Metadata, and pause/resume holds
traffic without closing anything."""

from __future__ import annotations

import asyncio
import struct
import threading
import time

import pytest

import producerkit as pk
from producerkit.testing import proxy as proxy_module
from producerkit.testing.brokers import LocalBroker
from producerkit.testing.proxy import DelayProxy

RTT_MS = 20.0


async def _round_trip_ms(url: str, topic: str, count: int = 10, **options: object) -> float:
    """Median time of a blocking produce (one round trip each)."""
    async with pk.Producer(url, topic=topic, **options) as producer:
        await producer.produce(b"warm-up")
        times = []
        for _ in range(count):
            started = time.perf_counter()
            await producer.produce(b"x")
            times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2] * 1000


def test_aiokafka_through_proxy_adds_the_rtt(kafka_broker: LocalBroker, topic: str) -> None:
    direct = asyncio.run(_round_trip_ms(kafka_broker.url, topic))
    with DelayProxy.for_url(kafka_broker.url, RTT_MS) as proxy:
        assert proxy.url.startswith("kafka://127.0.0.1:")
        delayed = asyncio.run(_round_trip_ms(proxy.url, topic))
        # Metadata rewritten: had the client gone around the proxy, it would see no delay.
        assert RTT_MS * 0.9 <= delayed - direct <= RTT_MS * 2
        proxy.set_rtt(0)
        assert asyncio.run(_round_trip_ms(proxy.url, topic)) < RTT_MS / 2


def test_confluent_kafka_through_proxy_adds_the_rtt(kafka_broker: LocalBroker, topic: str) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")

    def median_ms(bootstrap: str) -> float:
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1}
        )
        producer.produce(topic, b"warm-up")
        assert producer.flush(15) == 0
        times = []
        for _ in range(8):
            started = time.perf_counter()
            producer.produce(topic, b"x")
            assert producer.flush(10) == 0
            times.append(time.perf_counter() - started)
        return sorted(times)[len(times) // 2] * 1000

    direct = median_ms(kafka_broker.host_port)
    with DelayProxy.for_url(kafka_broker.url, RTT_MS) as proxy:
        delayed = median_ms(proxy.url.removeprefix("kafka://"))
    assert RTT_MS * 0.9 <= delayed - direct <= RTT_MS * 3


def test_jetstream_through_proxy_and_pause(nats_broker: LocalBroker, topic: str) -> None:
    url = nats_broker.jetstream_url
    direct = asyncio.run(_round_trip_ms(url, topic, create_stream=True))
    with DelayProxy.for_url(url, RTT_MS) as proxy:
        assert proxy.url.startswith("jetstream://")
        delayed = asyncio.run(_round_trip_ms(proxy.url, topic, create_stream=True))
        assert RTT_MS * 0.9 <= delayed - direct <= RTT_MS * 2

        async def paused_produce() -> float:
            async with pk.Producer(proxy.url, topic=topic, create_stream=True) as producer:
                await producer.produce(b"warm-up")
                proxy.pause()
                threading.Timer(0.3, proxy.resume).start()
                started = time.perf_counter()
                await producer.produce(b"held")
                return time.perf_counter() - started

        assert asyncio.run(paused_produce()) >= 0.29


def test_metadata_rewrite_flexible_version() -> None:
    """Metadata v12 (flexible: compact strings, tagged fields) as librdkafka sends it."""

    def compact(text: str | None) -> bytes:
        return bytes([0]) if text is None else bytes([len(text) + 1]) + text.encode()

    brokers = [(1, "10.0.0.1", 9092, "rack-a"), (2, "10.0.0.2", 9093, None)]
    body = b"\x00" + struct.pack(">i", 0) + bytes([len(brokers) + 1])
    for node, host, port, rack in brokers:
        body += struct.pack(">i", node) + compact(host) + struct.pack(">i", port) + compact(rack)
        body += b"\x00"
    tail = compact("cluster") + struct.pack(">i", 1) + b"\x01\x00"  # cluster, controller, topics
    payload = struct.pack(">i", 7) + body + tail
    frame = struct.pack(">i", len(payload)) + payload
    seen: list[tuple[str, int]] = []

    def advertised(host: str, port: int) -> tuple[str, int]:
        seen.append((host, port))
        return "127.0.0.1", 40000 + port - 9092

    versions = {7: (3, 12)}
    rewritten = proxy_module._rewrite_response(frame, versions, advertised)
    assert seen == [("10.0.0.1", 9092), ("10.0.0.2", 9093)]
    assert versions == {}
    reader = proxy_module._Reader(rewritten[8:])
    reader.tagged_fields()
    reader.int32()
    assert reader.uvarint() - 1 == 2
    decoded = []
    for _ in range(2):
        node = reader.int32()
        decoded.append((node, reader.string(True), reader.int32(), reader.string(True)))
        reader.tagged_fields()
    assert decoded == [(1, "127.0.0.1", 40000, "rack-a"), (2, "127.0.0.1", 40001, None)]
    assert reader.rest() == tail
    assert struct.unpack(">i", rewritten[:4])[0] == len(rewritten) - 4
