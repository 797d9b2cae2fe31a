"""``linger_ms`` on Kafka means what librdkafka's and the Java client's ``linger.ms`` mean: a
partition's batch waits up to that long after its first message for more, unless it fills or
the producer flushes. Whatever came before (a pause, or the previous message's ack), a blocking
produce waits the linger out, and messages that come within it share a request. Requests are
counted at the wire (``ProduceWire.write``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import producerkit as pk
from producerkit.backends.kafka import _aiokafka_compat

pytestmark = pytest.mark.anyio

LINGER_MS = 20


@pytest.fixture(params=["kafka_broker", "kafka_cluster"])
def kafka_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(request.param).url
    return url


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The number of partitions each Produce request written carried."""
    written: list[int] = []
    write = _aiokafka_compat.ProduceWire.write

    def counting(self: Any, conn: Any, batches: Any) -> Any:
        written.append(len(batches))
        return write(self, conn, batches)

    monkeypatch.setattr(_aiokafka_compat.ProduceWire, "write", counting)
    yield written


async def _fast_path(producer: pk.Producer) -> None:
    if producer.backend.client_path != "fast":
        pytest.skip("requests are counted on producerkit's own path (aiokafka lingers itself)")


async def _blocking_produces(url: str, topic: str, pause: float) -> tuple[list[float], str]:
    async with pk.Producer(url, topic=topic, linger_ms=LINGER_MS) as producer:
        await producer.produce(b"warm-up", key=b"k")
        took = []
        for number in range(10):
            if pause:
                await asyncio.sleep(pause)
            started = time.monotonic()
            await producer.produce(b"%d" % number, key=b"k")
            took.append(time.monotonic() - started)
        return took, producer.backend.client_path or ""


@pytest.mark.parametrize("pause", [0.0, 0.05], ids=["back-to-back", "after-a-pause"])
def test_a_blocking_produce_waits_the_linger_out_whatever_came_before(
    kafka_url: str, topic: str, requests: list[int], pause: float
) -> None:
    """In a plain asyncio program, as a user runs one (anyio's test runner adds a wake-up of
    its own between an ack and the caller, which hid the difference): a produce right after
    the previous one's ack went out at once, ignoring the linger (0.3 ms each with
    ``linger_ms=20``), while one after a pause waited it out (21 ms)."""
    took, path = asyncio.run(_blocking_produces(kafka_url, topic, pause))
    if path != "fast":
        pytest.skip("requests are counted on producerkit's own path (aiokafka lingers itself)")
    assert len(requests) == 11  # the warm-up and one each: nothing else came within a linger
    assert min(took) >= LINGER_MS / 1000 * 0.9, took


async def test_messages_within_the_linger_share_a_request_and_without_it_do_not(
    kafka_url: str, topic: str, requests: list[int]
) -> None:
    counts = {}
    for linger_ms in (LINGER_MS, 0):
        async with pk.Producer(kafka_url, topic=topic, linger_ms=linger_ms) as producer:
            await _fast_path(producer)
            await producer.produce(b"warm-up", key=b"k")
            requests.clear()
            for number in range(40):
                await producer.produce(b"%d" % number, key=b"k", nonblocking=True)
                await anyio.sleep(0.002)
            await producer.flush()
            counts[linger_ms] = len(requests)
    # 40 messages over ~100 ms: a request per linger at most (and the flush's), against one
    # per message, or nearly, when nothing lingers.
    assert counts[LINGER_MS] <= 100 // LINGER_MS + 3, counts
    assert counts[0] >= 20, counts


async def test_a_flush_ships_a_lingering_batch_at_once(
    kafka_url: str, topic: str, requests: list[int]
) -> None:
    async with pk.Producer(kafka_url, topic=topic, linger_ms=5_000) as producer:
        await _fast_path(producer)
        started = time.monotonic()
        await producer.produce(b"v", key=b"k", nonblocking=True)
        await producer.flush()
        assert time.monotonic() - started < 2.0


async def test_a_full_window_does_not_wait_for_the_linger(kafka_url: str, topic: str) -> None:
    """With the window full no message can come to fill a lingering batch, so it goes at once:
    2,000 messages through a window of 100 with a 1 s linger take well under the 20 s that
    lingering at every refill would."""
    async with pk.Producer(
        kafka_url, topic=topic, linger_ms=1_000, max_in_flight_messages=100
    ) as producer:
        started = time.monotonic()
        for number in range(2_000):
            await producer.produce(b"%d" % number, key=b"k-%d" % (number % 7), nonblocking=True)
        await producer.flush()
        assert producer.stats.acked == 2_000
        assert time.monotonic() - started < 5.0
