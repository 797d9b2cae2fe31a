"""Nonblocking SyncProducer against the async Producer and confluent-kafka, on the same broker.

    python benches/sync_throughput.py [--messages 200000] [--repeat 3] [--json results/sync.json]

One Tansu broker (null storage: the protocol path, records discarded; a topic of 4 partitions
created per run) started here from the installed wheel, and ``null://``. Every runner sends the
same 512-byte keyed values as fast as it can from one thread and counts only acknowledged
messages:

- ``SyncProducer``: ``produce(value, key=..., nonblocking=True)`` in a plain loop, then flush();
- ``Producer``: ``await produce(value, key=..., nonblocking=True)`` in a loop, then flush();
- ``confluent-kafka``: ``produce()`` + ``poll(0)``, flush() at the end, librdkafka's defaults.

producerkit runs with throughput.py's Kafka settings (both producers alike). Runners are
interleaved in rounds and each keeps its best rate (this machine is shared and noisy): compare
the ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _brokers
from throughput import (
    KAFKA_SETTINGS,
    confluent_kafka,
    delete_topic,
    make_messages,
    save_report,
)

import producerkit as pk
from producerkit.testing.brokers import create_kafka_topic

Messages = list[tuple[bytes | None, bytes]]
Runner = Callable[[], float]


def sync_producer(url: str, topic: str, messages: Messages, **options: Any) -> float:
    with pk.SyncProducer(url, topic=topic, **options) as producer:
        producer.produce(b"warm-up", key=b"warm-up")
        produce = producer.produce
        started = time.perf_counter()
        for key, value in messages:
            produce(value, key=key, nonblocking=True)
        producer.flush()
        elapsed = time.perf_counter() - started
        stats = producer.stats
    assert stats.acked == len(messages) + 1 and stats.failed == 0, stats
    return len(messages) / elapsed


def async_producer(url: str, topic: str, messages: Messages, **options: Any) -> float:
    async def run() -> float:
        async with pk.Producer(url, topic=topic, **options) as producer:
            await producer.produce(b"warm-up", key=b"warm-up")
            produce = producer.produce
            started = time.perf_counter()
            for key, value in messages:
                await produce(value, key=key, nonblocking=True)
            await producer.flush()
            elapsed = time.perf_counter() - started
            stats = producer.stats
        assert stats.acked == len(messages) + 1 and stats.failed == 0, stats
        return len(messages) / elapsed

    return asyncio.run(run())


def on_new_topic(url: str, name: str, run: Callable[[str], float]) -> Runner:
    """Each Kafka run gets a topic of its own (Tansu's null storage creates none by itself)."""

    def runner() -> float:
        topic = f"sync-{name}-{time.monotonic_ns()}"
        asyncio.run(create_kafka_topic(url, topic, 4))
        try:
            return run(topic)
        finally:
            asyncio.run(delete_topic(url, topic))

    return runner


def runners(kafka_url: str, count: int) -> dict[str, Runner]:
    keyed = make_messages(count, keyed=True)
    settings = dict(KAFKA_SETTINGS)
    return {
        "kafka: SyncProducer nonblocking": on_new_topic(
            kafka_url, "sync", lambda topic: sync_producer(kafka_url, topic, keyed, **settings)
        ),
        "kafka: Producer (async)": on_new_topic(
            kafka_url, "async", lambda topic: async_producer(kafka_url, topic, keyed, **settings)
        ),
        "kafka: confluent-kafka": on_new_topic(
            kafka_url, "ck", lambda topic: asyncio.run(confluent_kafka(kafka_url, topic, keyed))
        ),
        "null: SyncProducer nonblocking": lambda: sync_producer("null://", "t", keyed),
        "null: Producer (async)": lambda: async_producer("null://", "t", keyed),
    }


RATIOS = (
    (
        "kafka: SyncProducer / Producer",
        "kafka: SyncProducer nonblocking",
        "kafka: Producer (async)",
    ),
    (
        "kafka: SyncProducer / confluent-kafka",
        "kafka: SyncProducer nonblocking",
        "kafka: confluent-kafka",
    ),
    ("kafka: Producer / confluent-kafka", "kafka: Producer (async)", "kafka: confluent-kafka"),
    ("null: SyncProducer / Producer", "null: SyncProducer nonblocking", "null: Producer (async)"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    _brokers.add_broker_flags(parser, nats=False)
    args = parser.parse_args()

    best: dict[str, float] = {}
    with _brokers.kafka(args.kafka_url, storage="null://sink") as broker:
        table = runners(broker.kafka_url, args.messages)
        for round_number in range(1, args.repeat + 1):
            for name, run in table.items():
                rate = run()
                best[name] = max(best.get(name, 0.0), rate)
                print(f"round {round_number}  {name:<36} {rate:>12,.0f} msg/s", file=sys.stderr)

    print(f"\n{args.messages:,} keyed 512-byte messages, best of {args.repeat} interleaved rounds")
    print(f"{'runner':<40} {'msgs/s':>12}")
    for name, rate in best.items():
        print(f"{name:<40} {rate:>12,.0f}")
    ratios = {label: best[a] / best[b] for label, a, b in RATIOS}
    print()
    for label, ratio in ratios.items():
        print(f"{label:<40} {ratio:>12.2f}")
    if args.json:
        save_report(
            args.json,
            {
                "messages": args.messages,
                "repeat": args.repeat,
                "kafka_settings": KAFKA_SETTINGS,
                "speedups": pk._fast.SPEEDUPS,
                "rates": best,
                "ratios": ratios,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
