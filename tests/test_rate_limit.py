"""max_rate / max_bytes_rate: a token bucket shared by every connection, in every produce mode."""

from __future__ import annotations

import asyncio
import time

import pytest
from conftest import BackendCase

from producerkit import ConfigurationError, Producer, ProducerClosed
from producerkit._rate import RateLimit


def test_max_rate_5000_over_20000_messages_takes_four_seconds(
    backend: BackendCase, topic: str
) -> None:
    async def main() -> tuple[float, int]:
        async with Producer(
            backend.url, topic=topic, max_rate=5000, connections=2, **backend.options
        ) as producer:
            await producer.produce(b"warm-up")  # connect and learn the topic outside the clock
            await asyncio.sleep(0.1)  # let the bucket fill to its burst, as a fresh one is
            started = time.monotonic()
            for number in range(20_000):
                await producer.produce(b"x" * 100, key=b"%d" % number, nonblocking=True)
            await producer.flush()
            elapsed = time.monotonic() - started
            stats = producer.stats
        assert stats.acked == 20_001 and stats.failed == 0
        return elapsed, stats.rate_waits

    elapsed, waits = asyncio.run(main())
    assert 3.8 <= elapsed <= 4.2, elapsed  # 4.0 s +- 5 %
    assert waits > 0


def test_max_bytes_rate_limits_bytes(topic: str) -> None:
    async def main() -> float:
        async with Producer("null://", topic=topic, max_bytes_rate=1_000_000) as producer:
            started = time.monotonic()
            for _ in range(1_000):
                await producer.produce(b"v" * 1_000, nonblocking=True)  # 1 MB in all
            await producer.flush()
            return time.monotonic() - started

    elapsed = asyncio.run(main())
    assert 0.9 <= elapsed <= 1.15, elapsed  # the first 50 ms are the initial burst


def test_concurrent_blocking_produces_share_the_limit_in_order(topic: str) -> None:
    async def main() -> tuple[float, list[int]]:
        order: list[int] = []
        async with Producer("memory://", topic=topic, max_rate=1000, rate_burst=1) as producer:

            async def one(number: int) -> None:
                await producer.produce(b"%d" % number)
                order.append(number)

            started = time.monotonic()
            await asyncio.gather(*(one(number) for number in range(500)))
            return time.monotonic() - started, order

    elapsed, order = asyncio.run(main())
    assert 0.45 <= elapsed <= 1.0, elapsed  # at least 499 intervals of 1 ms; a busy machine adds
    assert order == sorted(order)  # first come, first served


def test_a_cancelled_waiter_takes_nothing_and_the_queue_goes_on(topic: str) -> None:
    async def main() -> None:
        async with Producer("memory://", topic=topic, max_rate=10, rate_burst=1) as producer:
            await producer.produce(b"first")  # empties the bucket
            waiting = asyncio.ensure_future(producer.produce(b"cancelled"))
            await asyncio.sleep(0.01)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            started = time.monotonic()
            await producer.produce(b"next")  # served at the first refill, not one later
            assert time.monotonic() - started < 0.15
            stats = producer.stats
            assert stats.produced == stats.acked == 2

    asyncio.run(main())


def test_close_wakes_rate_waiters_with_producer_closed(topic: str) -> None:
    async def main() -> None:
        producer = Producer("memory://", topic=topic, max_rate=1, rate_burst=1)
        await producer.start()
        await producer.produce(b"first")
        waiting = asyncio.ensure_future(producer.produce(b"late", nonblocking=True))
        await asyncio.sleep(0.01)
        started = time.monotonic()
        await producer.close()
        with pytest.raises(ProducerClosed):
            await waiting
        assert time.monotonic() - started < 0.5
        assert producer.stats.produced == producer.stats.acked == 1

    asyncio.run(main())


@pytest.mark.parametrize(
    "settings",
    [
        {"max_rate": 0},
        {"max_rate": -5},
        {"max_rate": float("inf")},
        {"max_rate": "100"},
        {"max_bytes_rate": True},
        {"max_rate": 10, "rate_burst": 0.5},
        {"rate_burst": 10},
    ],
)
def test_bad_rate_settings_are_configuration_errors(settings: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        Producer("null://", topic="t", **settings)  # type: ignore[arg-type]


def test_a_message_larger_than_the_byte_burst_waits_for_a_full_bucket() -> None:
    async def main() -> float:
        limit = RateLimit(None, 1000, None)  # burst: 50 bytes
        await limit.acquire(10)
        started = time.monotonic()
        await limit.acquire(500)  # larger than the bucket: waits until it is full, then owes
        await limit.acquire(1)  # the debt is paid before the next one goes
        return time.monotonic() - started

    elapsed = asyncio.run(main())
    assert 0.45 <= elapsed <= 0.7, elapsed
