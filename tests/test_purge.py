"""purge(): fail at once what is not yet written (and, by default, what waits for its ack), return
the Failures; partitions_for(topic)."""

from __future__ import annotations

import time

import anyio
import pytest
from conftest import BackendCase

import producerkit as pk
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio


async def test_purge_fails_what_waits_and_the_producer_goes_on(
    backend: BackendCase, topic: str
) -> None:
    """On every backend: what purge() returns is exactly what it failed (each with Purged, told
    to on_error, never raised again by flush), the ledger stays exact with nothing in flight, and
    the producer goes on. Backends that ack at once have nothing left to purge."""
    told: list[pk.Failure] = []
    async with pk.Producer(
        backend.url, topic=topic, timeout=10, on_error=told.append, **backend.options
    ) as producer:
        await producer.produce(b"warm-up", key=b"k")
        for number in range(200):  # within the window: no produce waits for room
            await producer.produce(b"v%d" % number, key=b"%d" % number, nonblocking=True)
        purged = producer.purge()
        stats = producer.stats
        assert stats.in_flight == 0
        assert stats.produced == stats.acked + stats.failed == 201
        assert len(purged) == stats.failed == len(told)
        assert {failure.value for failure in purged} == {failure.value for failure in told}
        assert all(isinstance(failure.exception, pk.Purged) for failure in purged)
        assert {failure.value for failure in purged} <= {b"v%d" % n for n in range(200)}
        assert producer.purge() == []  # nothing left
        await producer.flush()  # the purged are not raised again
        assert await producer.produce(b"after") is not None  # still usable
    assert producer.stats.acked == 202 - len(purged)


async def test_purge_against_a_stalled_link_is_immediate_and_exact(
    backend: BackendCase, topic: str
) -> None:
    """Every message waits on a link that carries nothing: purge() fails each of them at once,
    exactly, and the producer goes on once the link carries again."""
    if not backend.real:
        pytest.skip(f"{backend.name}:// acks at once: nothing waits for a purge")
    async with pk.Producer(
        backend.faulty_url, topic=topic, timeout=5.0, **backend.options
    ) as producer:
        await producer.produce(b"warm-up")
        backend.faults.pause()
        for number in range(900):  # within the window: no produce waits for room
            await producer.produce(b"v%d" % number, key=b"%d" % number, nonblocking=True)
        started = time.monotonic()
        purged = producer.purge()
        elapsed = time.monotonic() - started
        stats = producer.stats
        # No wait for the 5 s timeout (0.1 s is usual): half of it, which load cannot reach.
        assert elapsed < 2.5, elapsed
        assert stats.in_flight == 0
        assert stats.produced == stats.acked + stats.failed == 901
        assert len(purged) == stats.failed == 900
        assert all(isinstance(failure.exception, pk.Purged) for failure in purged)
        assert {failure.value for failure in purged} == {b"v%d" % n for n in range(900)}
        backend.faults.resume()
        await producer.flush()  # the purged are not raised again
        assert await producer.produce(b"after") is not None  # still usable


async def test_purge_fails_a_blocking_produce_with_purged(backend: BackendCase, topic: str) -> None:
    if not backend.real:
        pytest.skip(f"{backend.name}:// acks at once: a blocking produce never waits")
    async with pk.Producer(
        backend.faulty_url, topic=topic, timeout=10, **backend.options
    ) as producer:
        await producer.produce(b"warm-up")
        backend.faults.pause()
        async with anyio.create_task_group() as group:

            async def blocking() -> None:
                with pytest.raises(pk.Purged):
                    await producer.produce(b"blocked")

            group.start_soon(blocking)
            await anyio.sleep(0.05)
            assert len(producer.purge()) == 1
        backend.faults.resume()
        assert producer.stats.failed == 1


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
        assert not any(failure.possibly_stored for failure in purged)
        await producer.flush()
        stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed) == (101, 1, 100)


async def test_partitions_for(backend: BackendCase, topic: str) -> None:
    """The partitions of a topic where the backend has them without options, else None; with
    ``partitions=N`` memory:// (and NATS, by subject suffix) have N."""
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        partitions = await producer.partitions_for(topic)
        if not backend.spec.partitioned:
            assert partitions is None
            return
        assert partitions and partitions == frozenset(range(len(partitions)))
        delivery = await producer.produce(b"v", key=b"k")
        assert delivery is not None and delivery.partition in partitions


async def test_partitions_for_with_partitions_option(backend: BackendCase, topic: str) -> None:
    """Where the backend takes ``partitions=N``, the topic has N partitions and a keyed message
    lands in one of them."""
    if "partitions" not in backend.spec.options:
        pytest.skip("this backend takes no partitions option (its topics have their own)")
    async with pk.Producer(
        backend.url, topic=topic, partitions=4, timeout=10, **backend.options
    ) as producer:
        assert await producer.partitions_for(topic) == frozenset(range(4))
        delivery = await producer.produce(b"v", key=b"k")
        assert delivery is not None and delivery.partition in range(4)
