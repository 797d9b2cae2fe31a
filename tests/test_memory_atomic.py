"""memory:// atomic batches: all or nothing, kept in the store's records, so code that uses
``Producer.atomic_batch()`` is testable without a broker."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import producerkit as pk

pytestmark = pytest.mark.anyio


def _url() -> str:
    return f"memory://{uuid.uuid4().hex}"


async def test_a_committed_batch_appears_together_at_its_commit() -> None:
    deliveries: list[pk.Delivery | pk.Failure] = []
    async with pk.Producer(
        _url(), topic="orders", on_delivery=lambda result, context: deliveries.append(result)
    ) as producer:
        store = producer.backend.store
        await producer.produce(b"before")
        async with producer.atomic_batch() as batch:
            for number in range(3):
                await batch.produce(b"m-%d" % number, key=b"k")
            await batch.written()
            assert [r.value for r in store.records] == [b"before"]  # nothing before the commit
            assert producer.stats.acked == 1
        stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed) == (4, 4, 0)
    assert [r.value for r in store.records] == [b"before", b"m-0", b"m-1", b"m-2"]
    assert [r.offset for r in store.records] == [0, 1, 2, 3]
    assert [d.offset for d in deliveries if isinstance(d, pk.Delivery)] == [0, 1, 2, 3]


async def test_a_block_that_raises_stores_nothing_of_its_batch() -> None:
    failures: list[pk.Failure] = []
    async with pk.Producer(_url(), topic="orders", on_error=failures.append) as producer:
        with pytest.raises(RuntimeError):
            async with producer.atomic_batch() as batch:
                await batch.produce(b"a")
                await batch.produce(b"b")
                raise RuntimeError("the block failed")
        await producer.produce(b"after")
        stats = producer.stats
        records = list(producer.backend.store.records)
    assert [r.value for r in records] == [b"after"]
    assert (stats.acked, stats.failed) == (1, 2)


async def test_each_message_of_an_aborted_batch_fails_with_one_atomic_batch_error() -> None:
    results: list[pk.Delivery | pk.Failure] = []
    async with pk.Producer(
        _url(), topic="orders", on_delivery=lambda result, context: results.append(result)
    ) as producer:
        with pytest.raises(ValueError):
            async with producer.atomic_batch() as batch:
                await batch.produce(b"a")
                raise ValueError("no")
    assert len(results) == 1 and isinstance(results[0], pk.Failure)
    assert isinstance(results[0].exception, pk.AtomicBatchError)
    assert results[0].exception.kind == "aborted"
    assert results[0].possibly_stored is False


async def test_batches_one_after_another_and_a_bad_message_refused_at_once() -> None:
    async with pk.Producer(_url(), topic="t") as producer:
        for round_ in range(3):
            async with producer.atomic_batch() as batch:
                await batch.produce(b"%d" % round_)
                with pytest.raises(pk.MessageError):
                    await batch.produce(12345)  # type: ignore[arg-type]
        records = producer.backend.store.records
    assert [r.value for r in records] == [b"0", b"1", b"2"]


def test_prepare_is_refused_up_front() -> None:
    with pytest.raises(pk.ConfigurationError, match="prepare=True"):
        pk.Producer(_url(), topic="t").atomic_batch(prepare=True)


async def test_a_jetstream_stream_without_allow_atomic_says_how_to_allow_it(
    nats_broker: Any,
) -> None:
    """The refusal (10174) carries the hint docs/jetstream.md's table gives."""
    subject = f"noatomic{uuid.uuid4().hex[:10]}"
    async with pk.Producer(
        nats_broker.jetstream_url, topic=f"{subject}.x", create_stream=True
    ) as producer:
        with pytest.raises(pk.AtomicBatchError) as caught:
            async with producer.atomic_batch() as batch:
                await batch.produce(b"one")
    assert caught.value.code == 10174
    assert "allow_atomic=True" in str(caught.value)
