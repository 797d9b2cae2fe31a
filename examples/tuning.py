"""The measurements behind docs/tuning.md, one recipe each, on brokers started from the wheels.

    python examples/tuning.py            # all recipes, about a minute
    python examples/tuning.py rtt window # some of them

Each recipe prints one small table. Numbers depend on the machine; the ratios are the lesson.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import producerkit as pk
from producerkit.testing.brokers import LocalBroker, start_kafka, start_nats
from producerkit.testing.proxy import FaultProxy

VALUE = b"x" * 512


async def publish(
    url: str, count: int, *, nonblocking: bool, keyed: bool = True, **kwargs: Any
) -> tuple[float, pk.Stats]:
    """Messages per second for ``count`` messages (after one warm-up), and the final stats."""
    async with pk.Producer(url, topic=kwargs.pop("topic", "tuning"), **kwargs) as producer:
        await producer.produce(VALUE, key=b"warm-up")
        started = time.perf_counter()
        for i in range(count):
            key = b"user-%d" % (i % 1000) if keyed else None
            await producer.produce(VALUE, key=key, nonblocking=nonblocking)
        with contextlib.suppress(pk.ProduceError):  # failures are counted in stats.failed
            await producer.flush()
        elapsed = time.perf_counter() - started
    return count / elapsed, producer.stats


@contextmanager
def delayed(url: str, rtt_ms: float) -> Iterator[str]:
    if not rtt_ms:
        yield url
        return
    with FaultProxy.for_url(url, rtt_ms=rtt_ms) as proxy:
        yield proxy.url


def recipe_rtt(kafka: LocalBroker, nats: LocalBroker) -> None:
    print("\n## nonblocking vs sync across a round trip (JetStream, 512 B)")
    print(f"{'RTT ms':>7} {'sync msg/s':>11} {'nonblocking msg/s':>18} {'speed-up':>9}")
    for rtt in (0, 1, 10):
        with delayed(nats.url, rtt) as url:
            sync, _ = asyncio.run(
                publish(
                    url,
                    3000 if rtt == 0 else 300 // max(rtt // 2, 1),
                    nonblocking=False,
                    create_stream=True,
                )
            )
            fast, _ = asyncio.run(publish(url, 30_000, nonblocking=True, create_stream=True))
        print(f"{rtt:>7} {sync:>11,.0f} {fast:>18,.0f} {fast / sync:>8.0f}x")


def recipe_window(kafka: LocalBroker, nats: LocalBroker) -> None:
    print("\n## window size vs timeout (JetStream behind a 20 ms RTT, timeout=0.25 s, 100k msgs)")
    print(f"{'limit':>7} {'msg/s':>9} {'failed':>7} {'max in flight':>14} {'window waits':>13}")
    with delayed(nats.url, 20) as url:
        for limit in (100, 1000, 5000, 100_000):
            rate, stats = asyncio.run(
                publish(
                    url,
                    100_000,
                    nonblocking=True,
                    max_in_flight_messages=limit,
                    timeout=0.25,
                    create_stream=True,
                    topic=f"window{limit}",
                )
            )
            print(
                f"{limit:>7} {rate:>9,.0f} {stats.failed:>7,} {stats.peak_in_flight:>14,} "
                f"{stats.window_waits:>13,}"
            )


def recipe_connections(kafka: LocalBroker, nats: LocalBroker) -> None:
    print("\n## connections x partitions (nonblocking, 512 B keyed, 10 ms RTT)")
    print(f"{'backend':<10} {'connections':>11} {'partitions':>10} {'msg/s':>9}")
    with delayed(nats.url, 10) as url:
        for connections, partitions in ((1, 1), (1, 4), (4, 4)):
            rate, _ = asyncio.run(
                publish(
                    url,
                    40_000,
                    nonblocking=True,
                    connections=connections,
                    partitions=partitions,
                    create_stream=True,
                    topic=f"conn{connections}p{partitions}",
                )
            )
            print(f"{'jetstream':<10} {connections:>11} {partitions:>10} {rate:>9,.0f}")


def recipe_linger(kafka: LocalBroker, nats: LocalBroker) -> None:
    print("\n## linger_ms: latency of a sync produce vs nonblocking throughput (Kafka, loopback)")
    print(f"{'linger_ms':>9} {'sync ms/msg':>12} {'nonblocking msg/s':>18}")
    for linger in (0, 5, 20):
        sync, _ = asyncio.run(publish(kafka.url, 200, nonblocking=False, linger_ms=linger))
        fast, _ = asyncio.run(publish(kafka.url, 50_000, nonblocking=True, linger_ms=linger))
        print(f"{linger:>9} {1000 / sync:>12.2f} {fast:>18,.0f}")


def recipe_hot_path(kafka: LocalBroker, nats: LocalBroker) -> None:
    print("\n## the producer's own cost per message (null://: no I/O at all)")
    count = 200_000
    rate, _ = asyncio.run(publish("null://", count, nonblocking=True))
    rate_keyless, _ = asyncio.run(publish("null://", count, nonblocking=True, keyed=False))

    async def allocations() -> float:
        async with pk.Producer("null://", topic="tuning") as producer:
            keys = [b"user-%d" % i for i in range(1000)]
            await producer.produce(VALUE, key=keys[0])
            tracemalloc.start()
            before = tracemalloc.take_snapshot()
            n = 20_000
            for i in range(n):
                await producer.produce(VALUE, key=keys[i % 1000], nonblocking=True)
            await producer.flush()
            after = tracemalloc.take_snapshot()
            tracemalloc.stop()
            stats = after.compare_to(before, "filename")
            return sum(stat.count_diff for stat in stats if stat.count_diff > 0) / n

    print(f"keyed    {rate:>10,.0f} msg/s  ({1e6 / rate:.2f} µs/msg)")
    print(f"keyless  {rate_keyless:>10,.0f} msg/s  ({1e6 / rate_keyless:.2f} µs/msg)")
    print(f"objects still alive per message after flush: {asyncio.run(allocations()):.3f}")


RECIPES: dict[str, Callable[[LocalBroker, LocalBroker], None]] = {
    "rtt": recipe_rtt,
    "window": recipe_window,
    "connections": recipe_connections,
    "linger": recipe_linger,
    "hot_path": recipe_hot_path,
}


def main(names: list[str]) -> None:
    unknown = set(names) - set(RECIPES)
    if unknown:
        raise SystemExit(f"unknown recipe(s) {sorted(unknown)}; choose from {list(RECIPES)}")
    with start_kafka() as kafka, start_nats(jetstream=True) as nats:
        for name in names or RECIPES:
            RECIPES[name](kafka, nats)


if __name__ == "__main__":
    main(sys.argv[1:])
