"""propagate_trace=True: every message carries the producing span's W3C traceparent, which a
consumer reads back from Kafka and JetStream headers; off by default."""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest
from conftest import BackendCase, read_jetstream, read_kafka

import producerkit as pk

pytestmark = pytest.mark.anyio

otel_trace = pytest.importorskip("opentelemetry.trace")
otel_sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


@pytest.fixture(scope="module")
def tracer() -> Any:
    provider = otel_sdk_trace.TracerProvider()
    return provider.get_tracer("producerkit-tests")


@pytest.mark.parametrize("scheme", ["kafka", "jetstream"])
async def test_every_message_carries_the_current_traceparent(
    scheme: str, kafka_broker: Any, nats_broker: Any, topic: str, tracer: Any
) -> None:
    if scheme == "kafka":
        url, options = kafka_broker.url, {}
    else:
        url, options = nats_broker.jetstream_url, {"create_stream": True}

    async def main() -> tuple[str, list[dict[str, Any]]]:
        async with pk.Producer(url, topic=topic, propagate_trace=True, **options) as producer:
            with tracer.start_as_current_span("publish-orders") as span:
                trace_id = format(span.get_span_context().trace_id, "032x")
                for i in range(100):
                    headers = {"n": str(i)} if i % 2 else None
                    await producer.produce(b"%d" % i, key=b"k", headers=headers, nonblocking=True)
                await producer.flush()
            await producer.produce(b"untraced", key=b"k")  # no span: no header
        reader = read_kafka if scheme == "kafka" else read_jetstream
        return trace_id, await reader(url, topic, 101)

    trace_id, records = await main()
    assert len(records) == 101
    for record in records:
        headers = {
            k: (v.decode() if isinstance(v, bytes) else v) for k, v in record["headers"].items()
        }
        if record["value"] == b"untraced":
            assert "traceparent" not in headers
            continue
        match = TRACEPARENT.match(headers["traceparent"])
        assert match is not None and match[1] == trace_id
        if int(record["value"]) % 2:
            assert headers["n"] == record["value"].decode()


async def test_headers_the_caller_gives_win_and_it_is_off_by_default(
    backend: BackendCase, topic: str, tracer: Any
) -> None:
    async with pk.Producer(
        backend.url, topic=topic, propagate_trace=True, timeout=10, **backend.options
    ) as traced:
        with tracer.start_as_current_span("s"):
            await traced.produce(b"a", headers=[("traceparent", b"mine")])
            await traced.produce(b"b", headers={"x": b"1"})
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as plain:
        with tracer.start_as_current_span("s"):
            await plain.produce(b"c")
    assert (traced.stats.acked, plain.stats.acked) == (2, 1)
    if not backend.spec.stores_records:
        return
    stored = {record["value"]: record["headers"] for record in await backend.read(topic, 3)}
    assert stored[b"a"]["traceparent"] == b"mine"
    assert set(stored[b"b"]) >= {"x", "traceparent"}
    assert "traceparent" not in stored[b"c"]


def test_a_batch_carries_the_callers_traceparent_from_a_sync_producer(
    backend: BackendCase, topic: str, tracer: Any
) -> None:
    """SyncProducer.produce_batch runs on the producer's loop thread, yet its messages carry the
    span current in the calling thread, once per batch as for an async produce_batch."""
    with pk.SyncProducer(
        backend.url, topic=topic, propagate_trace=True, timeout=10, **backend.options
    ) as sync:
        with tracer.start_as_current_span("s") as span:
            trace_id = format(span.get_span_context().trace_id, "032x")
            sync.produce_batch([b"a", b"b"], keys=[b"k", b"k"])
        sync.produce_batch([b"untraced"])
        sync.flush()
    assert (sync.stats.acked, sync.stats.failed) == (3, 0)
    if not backend.spec.stores_records:
        return
    stored = {record["value"]: record["headers"] for record in anyio.run(backend.read, topic, 3)}
    for value in (b"a", b"b"):
        match = TRACEPARENT.match(stored[value]["traceparent"].decode())
        assert match is not None and match[1] == trace_id
    assert "traceparent" not in stored[b"untraced"]
