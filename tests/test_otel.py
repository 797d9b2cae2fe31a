"""producerkit.otel.ProducerMetrics, read back through the OpenTelemetry SDK's in-memory reader:
10,000 messages of which 100 fail for real (Kafka: the broker frozen while they are in flight,
so they time out; JetStream: a subject no stream stores, so the server answers 503) count
10,000 produced, 9,900 acked, 100 failed, and 9,900 ack latencies."""

from __future__ import annotations

import gc
import subprocess
import sys
import uuid
from collections import defaultdict
from typing import Any

import pytest
from conftest import BackendCase

import producerkit as pk
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio

sdk_metrics = pytest.importorskip("opentelemetry.sdk.metrics")
sdk_export = pytest.importorskip("opentelemetry.sdk.metrics.export")
otel = pytest.importorskip("producerkit.otel")

COUNT, FAILING = 10_000, 100


class Reader:
    """An SDK MeterProvider with an InMemoryMetricReader, and its points by metric name."""

    def __init__(self) -> None:
        self.reader = sdk_export.InMemoryMetricReader()
        self.provider = sdk_metrics.MeterProvider(metric_readers=[self.reader])

    def points(self) -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = defaultdict(list)
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                assert scope.scope.name == "producerkit"
                for metric in scope.metrics:
                    found[metric.name].extend(metric.data.data_points)
        return found

    def total(self, name: str, **attributes: Any) -> float:
        """The sum of ``name``'s values (a histogram's counts) over the points with
        ``attributes``."""
        return sum(
            getattr(point, "count", None) or point.value
            for point in self.points()[name]
            if all(point.attributes.get(key) == value for key, value in attributes.items())
        )


async def produce_with_failures(
    scheme: str, kafka: SessionBroker, nats: SessionBroker
) -> tuple[Reader, pk.Stats]:
    """10,000 messages on ``scheme``, the 100 in the middle failing for real."""
    metrics = Reader()
    good = f"good-{uuid.uuid4().hex[:8]}"

    options: dict[str, Any] = {}
    if scheme == "kafka":
        url, options["timeout"] = kafka.url, 3.0
    else:
        url = f"jetstream://{nats.host_port}"
        async with pk.Producer(url, topic=good, create_stream=True) as setup:
            await setup.produce(b"a stream for the good subject")
    measured = otel.ProducerMetrics(metrics.provider)
    producer = pk.Producer(url, topic=good, on_outcome=measured, **options)
    async with measured.watch(producer):
        for i in range(COUNT // 2):
            await producer.produce(b"%d" % i, key=b"%d" % (i % 64), nonblocking=True)
        await producer.flush()
        with pytest.raises(pk.ProduceError) as caught:
            await fail_some(producer, scheme, kafka)
        assert len(caught.value.failures) == FAILING
        for i in range(COUNT // 2, COUNT - FAILING):
            await producer.produce(b"%d" % i, key=b"%d" % (i % 64), nonblocking=True)
        await producer.flush()
        stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed) == (COUNT, COUNT - FAILING, FAILING)
    return metrics, stats


async def fail_some(producer: pk.Producer, scheme: str, kafka: SessionBroker) -> None:
    if scheme == "jetstream":  # a subject no stream stores: 503, "no responders"
        for i in range(FAILING):
            await producer.produce(b"lost %d" % i, topic="nostream-x", nonblocking=True)
        await producer.flush()
        return
    kafka.local.freeze()  # accepts the bytes, never answers: each message times out
    try:
        for i in range(FAILING):
            await producer.produce(b"lost %d" % i, key=b"%d" % (i % 64), nonblocking=True)
        await producer.flush()
    finally:
        kafka.local.thaw()


@pytest.mark.parametrize("scheme", ["kafka", "jetstream"])
async def test_counts_and_latencies_on_real_brokers(
    scheme: str, kafka_broker: SessionBroker, nats_broker: SessionBroker
) -> None:
    metrics, stats = await produce_with_failures(scheme, kafka_broker, nats_broker)
    assert metrics.total("producerkit.messages.produced") == COUNT
    assert metrics.total("producerkit.messages.acked") == COUNT - FAILING
    assert metrics.total("producerkit.messages.failed") == FAILING
    assert metrics.total("producerkit.ack.latency") == COUNT - FAILING
    assert metrics.total("producerkit.messages.in_flight") == 0
    assert metrics.total("producerkit.window.waits") == stats.window_waits

    error = "ProduceTimeout" if scheme == "kafka" else "DeliveryError"
    assert metrics.total("producerkit.messages.failed", **{"error.type": error}) == FAILING
    if scheme == "jetstream":
        failed = metrics.points()["producerkit.messages.failed"]
        assert {p.attributes["messaging.destination.name"] for p in failed} == {"nostream-x"}
    for name, points in metrics.points().items():
        for point in points:
            assert point.attributes["messaging.system"] == scheme, (name, point.attributes)
            if name not in ("producerkit.window.waits", "producerkit.window.wait"):
                assert point.attributes["producerkit.connection"] == 0, (name, point.attributes)
    (latency,) = metrics.points()["producerkit.ack.latency"]
    assert 0 < latency.min <= latency.max < 3.0
    assert latency.sum / latency.count < 1.0


async def test_latency_sampling_and_off(backend: BackendCase, topic: str) -> None:
    """latency_every=10 records one message in ten (by number); None records none."""
    every, none = Reader(), Reader()

    async def main() -> None:
        for reader, latency_every in ((every, 10), (none, None)):
            metrics = otel.ProducerMetrics(reader.provider, latency_every=latency_every)
            producer = pk.Producer(
                backend.url, topic=topic, on_outcome=metrics, timeout=10, **backend.options
            )
            async with metrics.watch(producer):
                for i in range(200):
                    await producer.produce(b"%d" % i, nonblocking=True)

    await main()
    assert every.total("producerkit.ack.latency") == 20
    assert every.total("producerkit.messages.acked") == 200
    assert none.points()["producerkit.ack.latency"] == []
    assert none.total("producerkit.messages.acked") == 200
    with pytest.raises(ValueError, match="latency_every"):
        otel.ProducerMetrics(every.provider, latency_every=0)


async def test_several_producers_on_one_provider_are_all_read(
    backend: BackendCase, topic: str
) -> None:
    """OpenTelemetry keeps the first instrument of a name: a second ProducerMetrics on the same
    provider must still be read, and the attributes tell the producers apart."""
    reader = Reader()
    seen: list[pk.Outcome] = []
    system = backend.url.partition("://")[0]
    options = {"timeout": 10, **backend.options}

    async def main() -> None:
        orders = otel.ProducerMetrics(reader.provider, attributes={"service.component": "a"})
        producer = pk.Producer(backend.url, topic=f"{topic}orders", on_outcome=orders, **options)
        async with orders.watch(producer) as p:
            for _ in range(30):
                await p.produce(b"o", nonblocking=True)
        # the helper, with a hook of the caller's own
        async with otel.instrumented(
            backend.url,
            topic=f"{topic}audit",
            meter_provider=reader.provider,
            on_outcome=seen.append,
            **options,
        ) as q:
            for _ in range(20):
                await q.produce(b"a", nonblocking=True)
            assert q.closed is False

    await main()
    assert reader.total("producerkit.messages.produced", **{"messaging.system": system}) == 50
    assert reader.total("producerkit.messages.acked", **{"service.component": "a"}) == 30
    assert (
        reader.total(
            "producerkit.messages.acked", **{"messaging.destination.name": f"{topic}audit"}
        )
        == 20
    )
    assert sum(len(outcome.numbers) for outcome in seen) == 20


def test_a_collection_right_after_a_metrics_is_gone_counts_it_in_every_counter() -> None:
    """A ProducerMetrics garbage-collected before the first collection (a cycle collected at
    any moment) is in every counter of that collection, the first one read included."""
    reader = Reader()

    def short_lived() -> None:
        metrics = otel.ProducerMetrics(reader.provider)
        with metrics.watch(
            pk.SyncProducer(f"memory://{uuid.uuid4().hex}", topic="t", on_outcome=metrics)
        ) as p:
            for _ in range(25):
                p.produce(b"v", nonblocking=True)

    short_lived()
    gc.collect()
    totals = {
        name: sum(point.value for point in points)
        for name, points in reader.points().items()
        if name in ("producerkit.messages.produced", "producerkit.messages.acked")
    }
    assert totals == {"producerkit.messages.produced": 25, "producerkit.messages.acked": 25}


def test_one_backend_per_instance_and_unwatch() -> None:
    """Outcomes do not say which producer they came from, so one ProducerMetrics serves one
    backend; a producer unwatched is no longer read."""
    reader = Reader()
    metrics = otel.ProducerMetrics(reader.provider)
    producer = metrics.watch(pk.Producer("memory://", topic="t", on_outcome=metrics))
    with pytest.raises(ValueError, match="memory://"):
        metrics.watch(pk.Producer("null://", topic="t"))
    assert [p.value for p in reader.points()["producerkit.messages.in_flight"]] == [0]
    metrics.unwatch(producer)
    assert reader.points()["producerkit.messages.in_flight"] == []
    with pytest.raises(TypeError, match="Producer"):
        metrics.watch(object())  # type: ignore[type-var]


async def test_without_an_sdk_it_records_nothing_and_works(
    backend: BackendCase, topic: str
) -> None:
    """The API alone (no SDK configured): instruments are no-ops."""

    async def main() -> pk.Stats:
        async with otel.instrumented(
            backend.url, topic=topic, timeout=10, **backend.options
        ) as producer:
            for _ in range(10):
                await producer.produce(b"v", nonblocking=True)
        return producer.stats  # once closed: every message settled

    stats = await main()
    assert (stats.produced, stats.acked, stats.failed) == (10, 10, 0)


def test_import_producerkit_imports_no_telemetry_library() -> None:
    code = (
        "import sys, producerkit, producerkit.serializers; "
        "bad = sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('opentelemetry', 'prometheus_client')); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_counts_outlive_the_producer_and_its_metrics(backend: BackendCase, topic: str) -> None:
    """Counters never go down: once a producer and its ProducerMetrics are garbage-collected,
    their counts stay in the provider's totals (here with a SyncProducer)."""
    reader = Reader()
    system = backend.url.partition("://")[0]

    def short_lived(topic: str) -> None:
        metrics = otel.ProducerMetrics(reader.provider)
        with metrics.watch(
            pk.SyncProducer(
                backend.url, topic=topic, on_outcome=metrics, timeout=10, **backend.options
            )
        ) as p:
            for _ in range(25):
                p.produce(b"v", nonblocking=True)

    short_lived(f"{topic}a")
    before = reader.total("producerkit.messages.acked")
    short_lived(f"{topic}b")
    gc.collect()
    assert before == 25
    assert reader.total("producerkit.messages.acked") == 50
    assert reader.total("producerkit.messages.produced", **{"messaging.system": system}) == 50
    assert reader.total("producerkit.ack.latency") == 50
    assert reader.points()["producerkit.messages.in_flight"] == []


async def test_watching_without_the_hook_is_reported(
    backend: BackendCase, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    reader = Reader()

    async def main() -> None:
        metrics = otel.ProducerMetrics(reader.provider)
        producer = pk.Producer(backend.url, topic=topic, timeout=10, **backend.options)
        async with metrics.watch(producer):
            await producer.produce(b"v")
            reader.points()
            reader.points()

    await main()
    lines = [r.getMessage() for r in caplog.records if r.name == "producerkit.otel"]
    assert len(lines) == 1 and "on_outcome" in lines[0], lines
