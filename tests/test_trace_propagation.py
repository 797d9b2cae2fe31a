"""propagate_trace=True: every message carries the producing span's W3C traceparent, which a
consumer reads back from Kafka and JetStream headers; off by default."""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import read_jetstream, read_kafka

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


async def test_headers_the_caller_gives_win_and_it_is_off_by_default(tracer: Any) -> None:
    async def main() -> list[Any]:
        async with pk.Producer("memory://", topic="t", propagate_trace=True) as traced:
            with tracer.start_as_current_span("s"):
                await traced.produce(b"a", headers=[("traceparent", b"mine")])
                await traced.produce(b"b", headers={"x": b"1"})
        async with pk.Producer("memory://", topic="t") as plain:
            with tracer.start_as_current_span("s"):
                await plain.produce(b"c")
        return [traced.backend.records, plain.backend.records]

    traced, plain = await main()
    assert dict(traced[0].headers)["traceparent"] == b"mine"
    assert {name for name, _ in traced[1].headers} >= {"x", "traceparent"}
    assert plain[0].headers is None


def test_a_batch_carries_the_callers_traceparent_from_a_sync_producer(tracer: Any) -> None:
    """SyncProducer.produce_batch runs on the producer's loop thread, yet its messages carry the
    span current in the calling thread, once per batch as for an async produce_batch."""
    with pk.SyncProducer("memory://", topic="t", propagate_trace=True) as sync:
        with tracer.start_as_current_span("s") as span:
            trace_id = format(span.get_span_context().trace_id, "032x")
            sync.produce_batch([b"a", b"b"], keys=[b"k", b"k"])
        sync.produce_batch([b"untraced"])
        sync.flush()
        records = sync.producer.backend.records
    for record in records[:2]:
        match = TRACEPARENT.match(dict(record.headers)["traceparent"].decode())
        assert match is not None and match[1] == trace_id
    assert records[2].headers is None
