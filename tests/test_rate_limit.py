"""max_rate / max_bytes_rate: a token bucket shared by every connection, in every produce mode,
on every backend."""

from __future__ import annotations

import time
from types import SimpleNamespace

import anyio
import pytest
from conftest import BackendCase

from producerkit import ConfigurationError, Delivery, Producer, ProducerClosed, _rate
from producerkit._rate import RateLimit

pytestmark = pytest.mark.anyio


async def test_max_rate_5000_over_10000_messages_takes_two_seconds(
    backend: BackendCase, topic: str
) -> None:
    async with Producer(
        backend.url, topic=topic, max_rate=5000, connections=2, timeout=10, **backend.options
    ) as producer:
        await producer.produce(b"warm-up")  # connect and learn the topic outside the clock
        await anyio.sleep(0.1)  # let the bucket fill to its burst, as a fresh one is
        started = time.monotonic()
        for number in range(10_000):
            await producer.produce(b"x" * 100, key=b"%d" % number, nonblocking=True)
        await producer.flush()
        elapsed = time.monotonic() - started
        stats = producer.stats
    assert stats.acked == 10_001 and stats.failed == 0
    # Never faster than the rate: 2.0 s, less the burst (50 ms). How much longer a loaded
    # machine takes says nothing of the limiter; that it waits no longer than its tokens need
    # is test_the_buckets_admit_at_their_rate_no_slower's, on a clock of its own.
    assert elapsed >= 1.9, elapsed
    assert stats.rate_waits > 0


async def test_max_bytes_rate_limits_bytes(backend: BackendCase, topic: str) -> None:
    async with Producer(
        backend.url, topic=topic, max_bytes_rate=1_000_000, timeout=10, **backend.options
    ) as producer:
        await producer.produce(b"warm-up")  # counts 7 bytes against the bucket
        await anyio.sleep(0.1)  # the bucket full again
        started = time.monotonic()
        for _ in range(500):
            await producer.produce(b"v" * 1_000, nonblocking=True)  # 0.5 MB in all
        await producer.flush()
        elapsed = time.monotonic() - started
    assert elapsed >= 0.42, elapsed  # the first 50 ms are the initial burst


async def test_concurrent_blocking_produces_share_the_limit_in_order(
    backend: BackendCase, topic: str
) -> None:
    acked: list[tuple[int, Delivery]] = []  # in the order the produce() calls returned
    async with Producer(
        backend.url, topic=topic, max_rate=1000, rate_burst=1, timeout=10, **backend.options
    ) as producer:
        await producer.produce(b"warm-up")
        await anyio.sleep(0.01)

        async def one(number: int) -> None:
            delivery = await producer.produce(b"%d" % number)
            assert delivery is not None
            acked.append((number, delivery))

        started = time.monotonic()
        async with anyio.create_task_group() as group:
            for number in range(200):
                group.start_soon(one, number)
                await anyio.sleep(0)  # each one queued before the next (first come...)
        elapsed = time.monotonic() - started
    assert elapsed >= 0.18, elapsed  # at least 199 intervals of 1 ms
    # ... first served: each partition's messages were sent, stored and acked in the order they
    # were produced. Across partitions the acks may come in any order: Kafka's sticky keyless
    # partitioning puts runs of these messages on different partitions, each batch acked alone
    # (an ack order of [0, 1, 14, 2, ...] is no rate limiter out of turn).
    assert sorted(number for number, _ in acked) == list(range(200))
    by_partition: dict[int | None, list[tuple[int, Delivery]]] = {}
    for number, delivery in acked:
        by_partition.setdefault(delivery.partition, []).append((number, delivery))
    for runs in by_partition.values():
        numbers = [number for number, _ in runs]
        offsets = [delivery.offset for _, delivery in runs]
        # the offsets in the failure say whether the stream stored them out of order too
        assert numbers == sorted(numbers), list(zip(numbers, offsets, strict=True))
        if None not in offsets:  # stored in produce order too
            assert offsets == sorted(offsets), (numbers, offsets)


async def test_a_cancelled_waiter_takes_nothing_and_the_queue_goes_on(
    backend: BackendCase, topic: str
) -> None:
    async with Producer(
        backend.url, topic=topic, max_rate=5, rate_burst=1, timeout=10, **backend.options
    ) as producer:
        await producer.produce(b"first")  # empties the bucket: the next token in 0.2 s
        emptied = time.monotonic()
        with anyio.move_on_after(0.05) as scope:
            await producer.produce(b"cancelled")
        assert scope.cancelled_caught
        # Admitted at the first refill (0.2 s), not one later (0.4 s): measured to its
        # admission, not its ack (a loaded broker's round trip is no rate limiter's).
        await producer.produce(b"next", nonblocking=True)
        assert time.monotonic() - emptied < 0.3
        await producer.flush()
        stats = producer.stats
        assert stats.produced == stats.acked == 2


async def test_close_wakes_rate_waiters_with_producer_closed(
    backend: BackendCase, topic: str
) -> None:
    producer = Producer(
        backend.url, topic=topic, max_rate=1, rate_burst=1, timeout=10, **backend.options
    )
    await producer.start()
    await producer.produce(b"first")
    closed_after: list[float] = []

    async def waiting() -> None:
        with pytest.raises(ProducerClosed):
            await producer.produce(b"late", nonblocking=True)
        closed_after.append(time.monotonic() - started)

    async with anyio.create_task_group() as group:
        group.start_soon(waiting)
        await anyio.sleep(0.01)
        started = time.monotonic()
        await producer.close()
    assert closed_after and closed_after[0] < 0.5
    assert producer.stats.produced == producer.stats.acked == 1


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


def _admit_on_a_clock_of_its_own(
    monkeypatch: pytest.MonkeyPatch, limit_args: tuple[float | None, float | None], sizes: list[int]
) -> float:
    """Admit messages of ``sizes`` one after another through ``RateLimit(*limit_args)`` on a
    virtual clock that moves only by the waits the buckets ask for (no machine's load in it):
    the seconds it took."""
    clock = [0.0]
    monkeypatch.setattr(_rate, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    limit = RateLimit(*limit_args)
    for size in sizes:
        while not limit.try_acquire(size):
            # (at least a nanosecond: a float's rounding may leave a wait too small to move it)
            clock[0] += max(limit._wait_time(size, clock[0]), 1e-9)
    return clock[0]


@pytest.mark.parametrize(
    ("limit_args", "sizes", "seconds"),
    [
        ((5000, None), [100] * 10_000, (10_000 - 250) / 5000),  # burst: 50 ms of the rate
        ((None, 1_000_000), [1_000] * 500, (500_000 - 50_000) / 1_000_000),
        ((1000, 100_000), [100] * 2_000, (2_000 - 50) / 1000),  # the messages bound it
        ((1000, 50_000), [100] * 2_000, (200_000 - 2_500) / 50_000),  # the bytes do
    ],
    ids=["messages", "bytes", "both-messages-bound", "both-bytes-bound"],
)
def test_the_buckets_admit_at_their_rate_no_slower(
    monkeypatch: pytest.MonkeyPatch,
    limit_args: tuple[float | None, float | None],
    sizes: list[int],
    seconds: float,
) -> None:
    """Each message waits exactly what its tokens need: the run takes its size over the rate,
    less the burst a full bucket starts with, to a tenth of a millisecond."""
    took = _admit_on_a_clock_of_its_own(monkeypatch, limit_args, sizes)
    assert took == pytest.approx(seconds, abs=1e-4)


def test_a_message_larger_than_the_byte_burst_waits_for_a_full_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # burst: 50 bytes. 10 taken; the 500 waits until the bucket is full (10 ms), takes it and
    # owes 450; the 1 waits until the debt is paid and it has its token (451 ms).
    took = _admit_on_a_clock_of_its_own(monkeypatch, (None, 1000), [10, 500, 1])
    assert took == pytest.approx(0.461, abs=1e-4)
