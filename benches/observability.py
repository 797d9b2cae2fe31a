"""What observability costs: producerkit's throughput with no hook, with ProducerMetrics, and
with propagate_trace=True inside an active span, on null:// and on Kafka (Tansu).

    python benches/observability.py [--messages 100000] [--kafka-messages 100000]
                                    [--jetstream-messages 100000] [--repeat 3]
                                    [--json results/observability.json]

Runners are interleaved in rounds and each keeps its best rate (this machine is shared and
noisy): compare ratios within one run. The variants:

- ``off``: no hook, no tracing (the baseline);
- ``empty hook``: ``on_outcome=lambda outcome: None``, the producer's own cost of building an
  Outcome per group of settled messages (per message on null://, per batch on Kafka);
- ``metrics``: a ``ProducerMetrics`` at its defaults (``latency_every="auto"``) watching the
  producer, on an SDK MeterProvider with an InMemoryMetricReader (default views and exemplar
  filter), collected once after the run;
- ``metrics, every latency``: the same with ``latency_every=1``, a histogram value per message;
- ``metrics, latency 1/100``: the same with ``latency_every=100``, the latency of one message in
  100 in the histogram;
- ``metrics, no latency``: with ``latency_every=None``, the counters without the histogram;
- ``trace``: ``propagate_trace=True`` with an SDK span current around the whole run, so every
  message carries a traceparent header.

Kafka is Tansu with null storage (the broker discards records, so the producer is what is
measured) and producerkit's throughput settings from throughput.py. JetStream (a memory stream
per run, deleted after it) acknowledges each message on its own, so there the hook runs once
per message, as on null://. Besides the rates, the
script times the pieces alone: one ``ProducerMetrics`` call per acked message (its histogram
record) and one trace injection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _brokers
from throughput import KAFKA_SETTINGS, delete_topic, make_messages

import producerkit as pk
from producerkit.testing.brokers import create_kafka_topic

Runner = Callable[[], Awaitable[int]]
Messages = list[tuple[bytes | None, bytes]]


def sdk_metrics() -> tuple[Any, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


def sdk_tracer() -> Any:
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider().get_tracer("producerkit-bench")


async def run(url: str, topic: str, messages: Messages, variant: str, **options: Any) -> int:
    """Produce ``messages`` nonblocking and flush; the rate of acked messages."""
    reader = None
    if variant == "empty hook":
        options["on_outcome"] = lambda outcome: None
    elif variant.startswith("metrics"):
        from producerkit.otel import ProducerMetrics

        provider, reader = sdk_metrics()
        metrics = ProducerMetrics(provider, latency_every=LATENCY_EVERY[variant])
        options["on_outcome"] = metrics
    elif variant == "trace":
        options["propagate_trace"] = True
    producer = pk.Producer(url, topic=topic, **options)
    if reader is not None:
        metrics.watch(producer)
    span = sdk_tracer().start_as_current_span("bench") if variant == "trace" else None
    async with producer:
        await producer.produce(b"warm-up", key=b"warm-up")
        if span is not None:
            span.__enter__()
        started = time.perf_counter()
        produce = producer.produce
        for key, value in messages:
            await produce(value, key=key, nonblocking=True)
        await producer.flush()
        elapsed = time.perf_counter() - started
        if span is not None:
            span.__exit__(None, None, None)
        assert producer.stats.acked == len(messages) + 1, producer.stats
    if reader is not None:
        check_counts(reader, len(messages) + 1, LATENCY_EVERY[variant])
    return round(len(messages) / elapsed)


def check_counts(reader: Any, acked: int, every: int | str | None) -> None:
    """The metrics saw every message (a bench that measured a broken hook would be no use)."""
    sums: dict[str, float] = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "count", None) or getattr(point, "value", 0)
                    sums[metric.name] = sums.get(metric.name, 0) + value
    assert sums["producerkit.messages.acked"] == acked, sums
    assert sums["producerkit.messages.produced"] == acked, sums
    recorded = sums.get("producerkit.ack.latency", 0)
    if every == "auto":  # every latency in the first second, then a sample
        assert 0 < recorded <= acked, sums
        return
    expected = 0 if every is None else acked / int(every)  # numbers n with n % every == 0
    assert abs(recorded - expected) <= 1, sums


LATENCY_EVERY: dict[str, int | str | None] = {
    "metrics": "auto",
    "metrics, every latency": 1,
    "metrics, latency 1/100": 100,
    "metrics, no latency": None,
}
VARIANTS = ("off", "empty hook", *LATENCY_EVERY, "trace")


def null_runners(count: int) -> dict[str, Runner]:
    keyed = make_messages(count, True)
    return {
        f"null:// {variant}": (
            lambda variant=variant: run(
                "null://?partitions=12", "bench", keyed, variant, max_in_flight_messages=10_000
            )
        )
        for variant in VARIANTS
    }


def kafka_runners(url: str, count: int) -> dict[str, Runner]:
    keyed = make_messages(count, True)

    def on_new_topic(variant: str) -> Runner:
        async def runner() -> int:
            topic = f"obs-{time.monotonic_ns()}"
            await create_kafka_topic(url, topic, 4)
            try:
                return await run(url, topic, keyed, variant, **KAFKA_SETTINGS)
            finally:
                await delete_topic(url, topic)

        return runner

    return {f"kafka {variant}": on_new_topic(variant) for variant in VARIANTS}


def jetstream_runners(url: str, count: int) -> dict[str, Runner]:
    keyed = make_messages(count, True)

    def on_new_stream(variant: str) -> Runner:
        async def runner() -> int:
            subject = f"obs-{time.monotonic_ns()}"
            try:
                return await run(url, subject, keyed, variant, create_stream=True)
            finally:
                await delete_stream(url, subject)

        return runner

    return {f"jetstream {variant}": on_new_stream(variant) for variant in VARIANTS}


async def delete_stream(url: str, subject: str) -> None:
    import nats

    nc = await nats.connect(url.replace("jetstream://", "nats://"))
    try:
        manager = nc.jsm()
        await manager.delete_stream(await nc.jetstream().find_stream_name_by_subject(subject))
    finally:
        await nc.close()


def best_of(runners: dict[str, Runner], repeat: int) -> dict[str, int]:
    best: dict[str, int] = {}
    for round_number in range(repeat):
        for name, runner in runners.items():
            rate = asyncio.run(runner())
            best[name] = max(best.get(name, 0), rate)
            print(f"  round {round_number + 1} {name:<32} {rate:>10,} msg/s", flush=True)
    return best


# --------------------------------------------------------------------------- the pieces alone


def per_call_ns(call: Callable[[], object], calls: int, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, time.perf_counter() - started)
    return best / calls * 1e9


def pieces(calls: int = 50_000) -> dict[str, float]:
    """ns per message of the metrics hook (Outcomes of 1 and of 100 acked messages, as on
    JetStream and in a Kafka batch) and of one trace injection (OpenTelemetry's propagator into
    a fresh dict, inside a span)."""
    from opentelemetry import propagate

    from producerkit.otel import ProducerMetrics

    provider, _ = sdk_metrics()
    out: dict[str, float] = {}
    for every, size in ((1, 1), (1, 100), (100, 100), (None, 1), (None, 100)):
        metrics = ProducerMetrics(provider, latency_every=every)
        numbers = tuple(range(1, size + 1))
        now = time.monotonic()
        outcome = pk.Outcome(numbers, (now,) * size, now + 0.001, "t", 0, 0)
        name = f"ProducerMetrics latency_every={every}, Outcome of {size}"
        out[name] = per_call_ns(lambda m=metrics, o=outcome: m(o), calls // size) / size
    with sdk_tracer().start_as_current_span("bench"):
        out["trace inject, per message"] = per_call_ns(lambda: propagate.inject({}), calls)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000, help="per null:// run")
    parser.add_argument("--kafka-messages", type=int, default=100_000, help="per Kafka run")
    parser.add_argument("--jetstream-messages", type=int, default=100_000, help="per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--calls", type=int, default=50_000, help="calls per piece timed alone (50000)"
    )
    parser.add_argument("--skip-kafka", action="store_true")
    parser.add_argument("--skip-jetstream", action="store_true")
    parser.add_argument("--json", type=Path)
    _brokers.add_broker_flags(parser)
    args = parser.parse_args()

    results: dict[str, Any] = {"pieces (ns per message)": pieces(args.calls)}
    for name, ns in results["pieces (ns per message)"].items():
        print(f"{name:<46} {ns:>8,.0f} ns")
    print(f"null:// ({args.messages:,} keyed messages, best of {args.repeat})")
    results["null"] = best_of(null_runners(args.messages), args.repeat)
    if not args.skip_kafka:
        print(f"Kafka, Tansu null storage ({args.kafka_messages:,} keyed messages)")
        with _brokers.kafka(args.kafka_url, storage="null://sink") as broker:
            runners = kafka_runners(broker.kafka_url, args.kafka_messages)
            results["kafka"] = best_of(runners, args.repeat)
    if not args.skip_jetstream:
        print(f"JetStream, memory streams ({args.jetstream_messages:,} keyed messages)")
        with _brokers.nats(args.nats_url) as broker:
            runners = jetstream_runners(broker.jetstream_url, args.jetstream_messages)
            results["jetstream"] = best_of(runners, args.repeat)

    print("\nratio to off, and ns per message over off")
    for backend in ("null", "kafka", "jetstream"):
        table = results.get(backend, {})
        prefix = "null://" if backend == "null" else backend
        off = table.get(f"{prefix} off")
        if not off:
            continue
        for variant in VARIANTS[1:]:
            rate = table[f"{prefix} {variant}"]
            extra = (1 / rate - 1 / off) * 1e9
            print(f"  {prefix:<9} {variant:<22} {rate / off:5.2f}  {extra:+7,.0f} ns/msg")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    sys.exit(main())
