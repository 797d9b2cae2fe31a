"""purge(): fail at once what is not yet written (and, by default, what waits for its ack), return
the Failures; partitions_for(topic)."""

from __future__ import annotations

import time

import pytest

import producerkit as pk
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio


async def test_purge_against_a_frozen_broker_is_immediate_and_exact(
    kafka_broker: SessionBroker, topic: str
) -> None:
    async with pk.Producer(kafka_broker.url, topic=topic, timeout=5.0) as producer:
        await producer.produce(b"warm-up")
        kafka_broker.local.freeze()
        try:
            for number in range(900):  # within the window: no produce waits for room
                await producer.produce(b"v%d" % number, key=b"%d" % number, nonblocking=True)
            started = time.monotonic()
            purged = producer.purge()
            elapsed = time.monotonic() - started
        finally:
            kafka_broker.local.thaw()
        stats = producer.stats
        assert elapsed < 0.1, elapsed
        assert stats.in_flight == 0
        assert stats.produced == stats.acked + stats.failed == 901
        assert len(purged) == stats.failed == 900
        assert all(isinstance(failure.exception, pk.Purged) for failure in purged)
        assert {failure.value for failure in purged} <= {b"v%d" % n for n in range(900)}
        await producer.flush()  # the purged are not raised again
        assert await producer.produce(b"after") is not None  # still usable


async def test_purge_unsent_only_leaves_what_is_in_flight(
    kafka_broker: SessionBroker, topic: str
) -> None:
    async with pk.Producer(kafka_broker.url, topic=topic, linger_ms=10_000) as producer:
        await producer.produce(b"warm-up", nonblocking=True)
        await producer.flush()  # ships at once (a blocking produce would wait out the linger)
        for number in range(100):  # gathered, not yet sent: the linger holds them
            await producer.produce(b"v%d" % number, nonblocking=True)
        purged = producer.purge(in_flight=False)
        assert len(purged) == 100
        assert "before it was sent" in str(purged[0].exception)
        await producer.flush()
        stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed) == (101, 1, 100)


async def test_purge_fails_a_blocking_produce_with_purged(
    kafka_broker: SessionBroker, topic: str
) -> None:
    import anyio

    async with pk.Producer(kafka_broker.url, topic=topic) as producer:
        await producer.produce(b"warm-up")
        kafka_broker.local.freeze()
        try:
            async with anyio.create_task_group() as group:

                async def blocking() -> None:
                    with pytest.raises(pk.Purged):
                        await producer.produce(b"blocked")

                group.start_soon(blocking)
                await anyio.sleep(0.05)
                assert len(producer.purge()) == 1
        finally:
            kafka_broker.local.thaw()


async def test_partitions_for(
    kafka_broker: SessionBroker, nats_broker: SessionBroker, topic: str
) -> None:
    async with pk.Producer(kafka_broker.url, topic=topic) as producer:
        partitions = await producer.partitions_for(topic)
        assert partitions and partitions == frozenset(range(len(partitions)))
        delivery = await producer.produce(b"v", key=b"k")
        assert delivery is not None and delivery.partition in partitions
    async with pk.Producer("memory://", topic="t", partitions=4) as memory:
        assert await memory.partitions_for("t") == frozenset(range(4))
    async with pk.Producer(nats_broker.url, topic="s") as nats:
        assert await nats.partitions_for("s") is None
