"""JetStream atomic batches: ``async with producer.atomic_batch() as batch`` stores its messages
all together at the end of the block, or none of them; each way it can end without a commit is
an AtomicBatchError with the server's code; read back independently with nats-py."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from typing import Any

import anyio
import pytest
from conftest import read_jetstream

import producerkit as pk
from producerkit.testing.pytest_plugin import NatsSessionBroker

pytestmark = pytest.mark.anyio


def _subject() -> str:
    return f"atom{uuid.uuid4().hex[:10]}"


async def _stored(url: str, subject: str, expected: int) -> list[dict[str, Any]]:
    return await read_jetstream(url, f"{subject}.orders", expected)


def _producer(broker: NatsSessionBroker, subject: str, **settings: Any) -> pk.Producer:
    return pk.Producer(
        broker.jetstream_url,
        topic=f"{subject}.orders",
        create_stream=True,
        allow_atomic=True,
        **settings,
    )


async def test_a_batch_is_stored_whole_at_its_commit(nats_broker: NatsSessionBroker) -> None:
    subject = _subject()
    deliveries: list[pk.Delivery] = []
    async with _producer(
        nats_broker, subject, on_delivery=lambda result, context: deliveries.append(result)
    ) as producer:
        await producer.produce(b"before")  # the stream, and one message in it
        async with producer.atomic_batch() as batch:
            for number in range(5):
                await batch.produce(b"m-%d" % number, headers={"n": b"%d" % number})
            assert producer.stats.acked == 1  # nothing of the batch is acked before its commit
        stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed) == (6, 6, 0)
    sequences = [d.offset for d in deliveries[1:]]
    assert sequences == [2, 3, 4, 5, 6]
    stored = await _stored(nats_broker.jetstream_url, subject, 6)
    assert [r["value"] for r in stored][1:] == [b"m-%d" % n for n in range(5)]
    assert stored[-1]["headers"]["Nats-Batch-Commit"] == "1"


async def test_a_flush_inside_the_batch_does_not_wait_for_its_commit(
    nats_broker: NatsSessionBroker,
) -> None:
    """flush() in the block that opened the batch: the producer's other messages acked, the
    batch's written and left for the commit, which comes when the block ends (it waited for
    their deadlines, then the batch failed)."""
    subject = _subject()
    async with _producer(nats_broker, subject, timeout=10.0) as producer:
        async with producer.atomic_batch() as batch:
            for number in range(5):
                await producer.produce(b"outside-%d" % number, nonblocking=True)
                await batch.produce(b"m-%d" % number)
            with anyio.fail_after(5):
                await producer.flush()
            stats = producer.stats
            assert (stats.acked, stats.failed) == (5, 0)  # the batch's four admitted: in flight
        stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed) == (10, 10, 0)


async def test_the_hundred_batches_of_the_issue(nats_broker: NatsSessionBroker) -> None:
    """100 batches of 500: batch 37's first message expects a wrong last sequence (10071),
    batch 61's block raises after 250 messages. 98 x 500 stored, no partial batch."""
    subject = _subject()
    outcomes: dict[int, str] = {}
    async with _producer(nats_broker, subject, max_in_flight_messages=1000) as producer:
        for number in range(100):
            try:
                async with producer.atomic_batch() as batch:
                    for index in range(500):
                        expect = None
                        if number == 37 and index == 0:
                            expect = pk.Expect(last_sequence=123_456_789)
                        if number == 61 and index == 250:
                            raise RuntimeError("the application gave up")
                        await batch.produce(b"%d-%d" % (number, index), key=b"k", expect=expect)
                outcomes[number] = "committed"
            except pk.AtomicBatchError as error:
                outcomes[number] = f"refused {error.code}"
            except RuntimeError:
                outcomes[number] = "raised"
        stats = producer.stats
    assert outcomes[37] == "refused 10071" and outcomes[61] == "raised"
    assert [n for n, outcome in outcomes.items() if outcome != "committed"] == [37, 61]
    assert stats.acked == 49_000 and stats.acked + stats.failed == stats.produced
    stored = await _stored(nats_broker.jetstream_url, subject, 49_000)
    by_batch: dict[int, list[int]] = defaultdict(list)
    for record in stored:
        number, index = map(int, record["value"].split(b"-"))
        by_batch[number].append(index)
    assert sorted(by_batch) == [n for n in range(100) if n not in (37, 61)]
    assert all(indexes == list(range(500)) for indexes in by_batch.values())


async def test_a_batch_of_1500_fails_typed_with_nothing_stored(
    nats_broker: NatsSessionBroker,
) -> None:
    subject = _subject()
    async with _producer(nats_broker, subject) as producer:
        await producer.produce(b"before")
        with pytest.raises(pk.AtomicBatchError, match="at most 1000 messages"):
            async with producer.atomic_batch() as batch:
                for number in range(1500):
                    await batch.produce(b"%d" % number)
        stats = producer.stats
    assert stats.acked == 1 and stats.acked + stats.failed == stats.produced
    assert len(await _stored(nats_broker.jetstream_url, subject, 1)) == 1


async def test_a_stream_without_atomic_batches_refuses_with_10174(
    nats_broker: NatsSessionBroker,
) -> None:
    subject = _subject()
    async with pk.Producer(
        nats_broker.jetstream_url, topic=f"{subject}.x", create_stream=True
    ) as producer:
        with pytest.raises(pk.AtomicBatchError) as caught:
            async with producer.atomic_batch() as batch:
                await batch.produce(b"one")
                await batch.produce(b"two")
        assert caught.value.code == 10174
        assert caught.value.kind == "unsupported"
        stats = producer.stats
    # Each message produced into the batch is counted, and fails with it.
    assert stats.acked == 0 and stats.failed == stats.produced == 2


async def test_what_a_batch_cannot_carry_is_said_before_sending(
    nats_broker: NatsSessionBroker,
) -> None:
    subject = _subject()
    async with _producer(nats_broker, subject) as producer:
        async with producer.atomic_batch() as batch:
            with pytest.raises(pk.AtomicBatchError, match="10177"):
                await batch.produce(b"x", expect=pk.Expect(last_msg_id="a"))
            await batch.produce(b"first", expect=pk.Expect(last_sequence=0))
            with pytest.raises(pk.AtomicBatchError, match="10164"):
                await batch.produce(b"second", expect=pk.Expect(last_sequence=1))
        assert producer.stats.acked == 1


@pytest.mark.parametrize("url", ["null://", "nats://127.0.0.1:1"])
def test_other_backends_refuse_atomic_batches(url: str) -> None:
    with pytest.raises(pk.ConfigurationError, match="atomic_batch is JetStream's"):
        pk.Producer(url, topic="t").atomic_batch()


def test_kafka_atomic_batches_are_transactions() -> None:
    """On Kafka an atomic batch is a transaction (tests/test_transactions.py): asking for one
    connects nothing until its block begins."""
    from producerkit._atomic import AtomicBatch

    batch = pk.Producer("kafka://127.0.0.1:1", topic="t").atomic_batch()
    assert isinstance(batch, AtomicBatch) and batch.id.startswith("producerkit-")


async def test_more_than_fifty_open_batches_wait_their_turn(
    nats_broker: NatsSessionBroker,
) -> None:
    subject = _subject()
    async with _producer(nats_broker, subject) as producer:
        await producer.produce(b"before")

        async def one(number: int) -> None:
            async with producer.atomic_batch() as batch:
                await batch.produce(b"%d-a" % number)
                await batch.produce(b"%d-b" % number)
                await anyio.sleep(0.2)  # held open: 60 at once

        async with anyio.create_task_group() as tasks:
            for number in range(60):
                tasks.start_soon(one, number)
        assert producer.stats.acked == 121


async def test_a_broker_killed_mid_run_leaves_each_batch_whole_or_absent(
    private_nats_broker: NatsSessionBroker,
) -> None:
    """kill -9 and restart (file store) while batches are committed one after another through
    the fault proxy: every batch read back is whole or absent, and each batch's outcome says
    which (acked: whole; failed, not possibly stored: absent)."""
    broker = private_nats_broker
    subject = _subject()
    outcomes: dict[int, pk.AtomicBatchError | None] = {}
    async with pk.Producer(
        broker.faulty_jetstream_url,
        topic=f"{subject}.orders",
        create_stream=True,
        allow_atomic=True,
        stream_storage="file",
        timeout=2.0,
    ) as producer:
        await producer.produce(b"before")

        def kill_then_restart() -> None:  # down longer than a message's deadline
            time.sleep(1.0)
            broker.faults.kill()
            time.sleep(3.0)
            broker.faults.restart()

        fault = threading.Thread(target=kill_then_restart, daemon=True)
        fault.start()
        started = time.monotonic()
        number = 0
        while time.monotonic() - started < 7.0:
            try:
                async with producer.atomic_batch() as batch:
                    for index in range(20):
                        await batch.produce(b"%d-%d" % (number, index))
                outcomes[number] = None
            except pk.AtomicBatchError as error:
                outcomes[number] = error
            number += 1
            await anyio.sleep(0.01)
        fault.join()
    stored = await _stored(broker.jetstream_url, subject, 1)
    by_batch: dict[int, list[int]] = defaultdict(list)
    for record in stored[1:]:
        batch_number, index = map(int, record["value"].split(b"-"))
        by_batch[batch_number].append(index)
    assert all(indexes == list(range(20)) for indexes in by_batch.values()), "a partial batch"
    for batch_number, outcome in outcomes.items():
        if outcome is None:
            assert batch_number in by_batch, f"batch {batch_number} acked but not stored"
        elif not outcome.possibly_stored:
            assert batch_number not in by_batch, f"batch {batch_number} failed but stored"
    assert any(outcome is not None for outcome in outcomes.values()), "the kill failed none"
    assert len(by_batch) > 1
