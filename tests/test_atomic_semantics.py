"""``Producer.atomic_batch()``'s promises, on every backend that declares atomic writes (its
spec's ``atomic_writes``: memory://, Kafka on each of its brokers, JetStream on one server and
on three): the messages of a batch are stored together at its commit and acked then, in order;
a block that raises stores none of them and fails each with one ``AtomicBatchError`` of kind
``"aborted"``, not possibly stored, told to ``on_delivery``; a bad message is refused at its
call and the batch goes on; batches follow one another on one producer. Backends without atomic
writes refuse the call, typed. Each backend's own refusals (JetStream's codes, Kafka's fencing
and timeouts) are tested beside that backend (test_atomic_batch.py,
test_first_hour_transactions.py, ...)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import ON_THE_PUBLIC_PATH, TRANSACTIONS_ON_THE_FAST_PATH, BackendCase

import producerkit as pk

pytestmark = pytest.mark.anyio


def _atomic(backend: BackendCase) -> BackendCase:
    """``backend`` able to take atomic batches, or the test skipped where it declares none."""
    if backend.spec.atomic_writes is None:
        pytest.skip(f"{backend.name}:// declares no atomic writes")
    if backend.kafka and ON_THE_PUBLIC_PATH:  # refused, typed (test_transactions.py)
        pytest.skip(TRANSACTIONS_ON_THE_FAST_PATH.kwargs["reason"])
    if "allow_atomic" in backend.spec.options:  # a stream that allows them (JetStream)
        return backend.with_options(allow_atomic=True)
    return backend


#: Every message of these tests carries this key: one partition, so one order to read back.
KEY = b"k"


async def _committed(backend: BackendCase, topic: str, expected: int) -> list[Any]:
    """The values a reader of committed data sees on ``topic``, once ``expected`` are there."""
    return [record["value"] for record in await backend.read(topic, expected, committed=True)]


def _telling(
    backend: BackendCase, topic: str, results: list[pk.Delivery | pk.Failure]
) -> pk.Producer:
    """A producer on ``backend`` that appends each message's outcome to ``results``."""
    return pk.Producer(
        backend.url,
        topic=topic,
        on_delivery=lambda result, context: results.append(result),
        **backend.options,
    )


async def test_a_batch_is_stored_and_acked_together_at_its_commit(
    backend: BackendCase, topic: str
) -> None:
    backend = _atomic(backend)
    results: list[pk.Delivery | pk.Failure] = []
    async with _telling(backend, topic, results) as producer:
        await producer.produce(b"before", key=KEY)
        async with producer.atomic_batch() as batch:
            for number in range(5):
                await batch.produce(b"m-%d" % number, key=KEY)
            await batch.written()
            assert producer.stats.acked == 1  # nothing of the batch is acked before its commit
            assert len(batch) == 5
        stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed) == (6, 6, 0)
    deliveries = [result for result in results if isinstance(result, pk.Delivery)]
    assert len(deliveries) == 6
    offsets = [delivery.offset for delivery in deliveries[1:]]
    assert offsets == sorted(offsets) and len(set(offsets)) == 5, offsets
    values = await _committed(backend, topic, 6)
    assert values[0] == b"before" and values[1:] == [b"m-%d" % n for n in range(5)]


async def test_a_block_that_raises_stores_nothing_and_fails_each_message_aborted(
    backend: BackendCase, topic: str
) -> None:
    backend = _atomic(backend)
    results: list[pk.Delivery | pk.Failure] = []
    async with _telling(backend, topic, results) as producer:
        await producer.produce(b"before", key=KEY)
        with pytest.raises(RuntimeError, match="the block failed"):
            async with producer.atomic_batch() as batch:
                await batch.produce(b"a", key=KEY)
                await batch.produce(b"b", key=KEY)
                raise RuntimeError("the block failed")
        await producer.produce(b"after", key=KEY)
        stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed) == (4, 2, 2)
    # The batch's failure is its block's to raise: on_delivery is told of each message (not
    # on_error, nor flush(): docs/atomic.md).
    failures = [result for result in results if isinstance(result, pk.Failure)]
    assert [failure.value for failure in failures] == [b"a", b"b"]
    for failure in failures:
        assert isinstance(failure.exception, pk.AtomicBatchError)
        assert failure.exception.kind == "aborted"
        assert failure.possibly_stored is False
    if backend.hides_aborted_writes:
        assert await _committed(backend, topic, 2) == [b"before", b"after"]


async def test_a_bad_message_is_refused_at_its_call_and_batches_follow_one_another(
    backend: BackendCase, topic: str
) -> None:
    backend = _atomic(backend)
    async with pk.Producer(backend.url, topic=topic, **backend.options) as producer:
        for round_ in range(3):
            async with producer.atomic_batch() as batch:
                await batch.produce(b"%d" % round_, key=KEY)
                with pytest.raises(pk.MessageError):
                    await batch.produce(12345, key=KEY)  # type: ignore[arg-type]
                await batch.produce(b"%d again" % round_, key=KEY)
        stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed) == (6, 6, 0)
    expected = [b"0", b"0 again", b"1", b"1 again", b"2", b"2 again"]
    assert await _committed(backend, topic, 6) == expected


async def test_produce_batch_inside_a_batch_is_part_of_it(backend: BackendCase, topic: str) -> None:
    backend = _atomic(backend)
    async with pk.Producer(backend.url, topic=topic, **backend.options) as producer:
        with pytest.raises(RuntimeError):
            async with producer.atomic_batch() as batch:
                await batch.produce_batch([b"x-%d" % n for n in range(4)], keys=[KEY] * 4)
                raise RuntimeError("abort the columns too")
        async with producer.atomic_batch() as batch:
            await batch.produce_batch([b"y-%d" % n for n in range(4)], keys=[KEY] * 4)
            await batch.produce(b"y-4", key=KEY)
        stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed) == (9, 5, 4)
    values = await _committed(backend, topic, 5)
    if backend.hides_aborted_writes:
        assert values == [b"y-%d" % n for n in range(5)]
    else:
        assert values[-5:] == [b"y-%d" % n for n in range(5)]


async def test_a_backend_without_atomic_writes_refuses_the_call_typed(
    backend: BackendCase, topic: str
) -> None:
    if backend.spec.atomic_writes is not None:
        pytest.skip(f"{backend.name}:// takes atomic batches")
    async with pk.Producer(backend.url, topic=topic, **backend.options) as producer:
        with pytest.raises(pk.ConfigurationError, match="atomic_batch"):
            producer.atomic_batch()
        await producer.produce(b"still usable")
        assert producer.stats.acked == 1
