"""memory:// atomic batches: all or nothing, kept in the store's records, so code that uses
``Producer.atomic_batch()`` is testable without a broker. What every backend's batches promise
(abort, refusals, batches in a row) is tested on each in test_atomic_semantics.py."""

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
