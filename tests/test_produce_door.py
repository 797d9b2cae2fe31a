"""produce()'s doors (``_core.produce_door``: in C, a method descriptor that takes a plain
nonblocking message without a Python frame; in Python, a function that does the same; C's around
Python's around the method) behave as the method does on either core (outcome, accounting,
errors at the await, a task can be made of the call), and everything else goes through the
method itself."""

from __future__ import annotations

import asyncio
import gc
import inspect
import weakref

import pytest
from conftest import BackendCase

import producerkit as pk
from producerkit import _core

pytestmark = pytest.mark.anyio


def takes_plain_messages(producer: pk.Producer) -> bool:
    """Whether the producer's plain nonblocking messages go through its core's Admission."""
    return producer._admission is not None


def test_the_class_holds_the_door_and_no_instance_holds_a_method() -> None:
    producer = pk.Producer("null://", topic="t")
    assert "produce" not in vars(producer)
    assert type(vars(pk.Producer)["produce"]) is type(_core.ProduceDoor(lambda: None))


async def test_each_core_takes_its_plain_messages_through_its_own_door(
    core: _core.Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checked path (the method's own lines) sees none of the plain messages, on either
    core: the door of the producer's own core took them."""
    checked: list[object] = []

    class Rules:
        """The producer's rules, telling which messages took the checked path."""

        def __init__(self, rules: object) -> None:
            self.rules = rules

        def __getattr__(self, name: str) -> object:
            return getattr(self.rules, name)

        def message(self, *args: object, **kwargs: object) -> object:
            checked.append(args[0])
            return self.rules.message(*args, **kwargs)  # type: ignore[attr-defined]

    async with pk.Producer("null://", topic="t") as producer:
        await producer.produce(b"first")
        assert type(producer._admission) is core.Admission
        monkeypatch.setattr(producer, "_rules", Rules(producer._rules))
        results = [producer.produce(b"%d" % i, nonblocking=True) for i in range(100)]
        assert not any(inspect.iscoroutine(result) for result in results if result is not None)
        for result in results:
            assert await result is None
        await producer.produce(b"checked", key="str key", nonblocking=True)
        await producer.flush()
        assert checked == [b"checked"]
        assert producer.stats.acked == 102


async def test_plain_nonblocking_messages_through_the_door_are_each_acked(
    backend: BackendCase, topic: str
) -> None:
    async with pk.Producer(backend.url, topic=topic, **backend.options) as producer:
        await producer.produce(b"first", key=b"k")  # the topic's partitions become known
        assert takes_plain_messages(producer)
        produce = producer.produce
        for i in range(500):
            assert await produce(b"v%d" % i, key=b"k%d" % (i % 9), nonblocking=True) is None
        # Not taken by the door: a blocking produce, headers (where allowed), a str key.
        delivery = await produce(b"blocking", key=b"k")
        assert isinstance(delivery, pk.Delivery)
        await produce(b"str key", key="k", nonblocking=True)
        await producer.flush()
        assert (producer.stats.acked, producer.stats.failed) == (503, 0)


async def test_a_task_is_made_of_a_door_call(backend: BackendCase, topic: str) -> None:
    """asyncio.create_task takes what the door returns (a coroutine by its methods), as it
    takes produce()'s coroutine."""
    async with pk.Producer(backend.url, topic=topic, **backend.options) as producer:
        await producer.produce(b"first")
        task = asyncio.create_task(producer.produce(b"in a task", nonblocking=True))
        assert await task is None
        await producer.flush()
        assert producer.stats.acked == 2


async def test_bad_calls_fail_as_the_method_fails(backend: BackendCase, topic: str) -> None:
    async with pk.Producer(backend.url, topic=topic, **backend.options) as producer:
        await producer.produce(b"first")
        with pytest.raises(TypeError):
            producer.produce(b"x", nonblocking=True, not_a_keyword=1)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            producer.produce(b"x", b"k", nonblocking=True)  # type: ignore[misc]
        pending = producer.produce(12, nonblocking=True)  # type: ignore[arg-type]
        with pytest.raises(pk.MessageError):
            await pending  # raised at the await, as by the method
        await producer.produce(b"still usable", nonblocking=True)
        await producer.flush()
        assert (producer.stats.acked, producer.stats.failed) == (2, 0)
    with pytest.raises(pk.ProducerClosed):
        await producer.produce(b"after close", nonblocking=True)


async def test_an_error_inside_the_door_is_raised_at_the_await() -> None:
    """A partitioner that raises, on a message the door takes: the call returns, its await
    raises what the method's await raises, and the producer goes on."""

    def partitioner(key: bytes, partitions: int) -> int:
        if key == b"bad":
            raise ValueError("no partition for this key")
        return 0

    async with pk.Producer("null://?partitions=3", topic="t", partitioner=partitioner) as producer:
        await producer.produce(b"first", key=b"good")
        pending = producer.produce(b"x", key=b"bad", nonblocking=True)
        with pytest.raises(Exception, match="no partition for this key"):
            await pending
        await producer.produce(b"after", key=b"good", nonblocking=True)
        await producer.flush()
        assert producer.stats.acked == 2


async def test_the_door_has_the_methods_signature_and_keeps_no_producer_alive() -> None:
    async def used_and_closed() -> weakref.ref[pk.Producer]:
        producer = pk.Producer("null://", topic="t")
        async with producer:
            await producer.produce(b"x")
            assert inspect.signature(producer.produce) == inspect.signature(
                pk.Producer("null://", topic="t").produce
            )
            assert producer.produce.__name__ == "produce"
            assert producer.produce.__doc__ == pk.Producer.produce.__doc__
        return weakref.ref(producer)

    gone = await used_and_closed()
    gc.collect()
    assert gone() is None


async def test_a_subclass_that_overrides_produce_keeps_its_own() -> None:
    calls = []

    class Counting(pk.Producer):
        async def produce(self, value, **kwargs):  # type: ignore[no-untyped-def,override]
            calls.append(value)
            return await super().produce(value, **kwargs)

    async with Counting("null://", topic="t") as producer:
        for i in range(3):
            await producer.produce(b"%d" % i, nonblocking=True)
    assert calls == [b"0", b"1", b"2"]
