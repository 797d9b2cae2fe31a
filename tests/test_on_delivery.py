"""Producer(on_delivery=...): called exactly once per message with its Delivery or its Failure,
and the context given to that message's produce()."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
from conftest import BackendCase

import producerkit as pk
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio

COUNT, FAILING = 10_000, 100


@pytest.mark.parametrize("scheme", ["kafka", "jetstream"])
async def test_every_message_is_told_once_with_its_own_context(
    scheme: str, kafka_broker: SessionBroker, nats_broker: SessionBroker
) -> None:
    told: dict[int, list[pk.Delivery | pk.Failure]] = {}

    def on_delivery(result: pk.Delivery | pk.Failure, context: Any) -> None:
        told.setdefault(context, []).append(result)

    good = f"good-{uuid.uuid4().hex[:8]}"
    options: dict[str, Any] = {}
    if scheme == "kafka":
        url, options["timeout"] = kafka_broker.url, 3.0
    else:
        url = nats_broker.jetstream_url
        async with pk.Producer(url, topic=good, create_stream=True) as setup:
            await setup.produce(b"a stream for the good subject")  # and none for "nostream-x"
    async with pk.Producer(url, topic=good, on_delivery=on_delivery, **options) as producer:
        for number in range(COUNT // 2):
            await producer.produce(b"%d" % number, nonblocking=True, context=number)
        await producer.flush()
        with pytest.raises(pk.ProduceError) as caught:
            if scheme == "kafka":
                kafka_broker.local.freeze()  # never answers: these time out
            try:
                for number in range(COUNT - FAILING, COUNT):
                    topic = good if scheme == "kafka" else "nostream-x"  # JetStream: 503
                    await producer.produce(
                        b"%d" % number, topic=topic, nonblocking=True, context=number
                    )
                await producer.flush()
            finally:
                if scheme == "kafka":
                    kafka_broker.local.thaw()
        assert len(caught.value.failures) == FAILING  # failures are still reported as ever
        for number in range(COUNT // 2, COUNT - FAILING - 1):
            await producer.produce(b"%d" % number, nonblocking=True, context=number)
        delivery = await producer.produce(b"last", context=COUNT - FAILING - 1)  # blocking too
        await producer.flush()

    assert sorted(told) == list(range(COUNT))
    assert all(len(results) == 1 for results in told.values())
    deliveries = {n for n, (result,) in told.items() if isinstance(result, pk.Delivery)}
    failures = {n: result for n, (result,) in told.items() if isinstance(result, pk.Failure)}
    assert len(deliveries) == COUNT - FAILING and set(failures) == set(
        range(COUNT - FAILING, COUNT)
    )
    assert all(failure.value == b"%d" % n for n, failure in failures.items())
    assert told[COUNT - FAILING - 1] == [delivery]


async def test_each_message_is_told_once_with_its_context_on_every_backend(
    backend: BackendCase, topic: str
) -> None:
    """Blocking and nonblocking produces: each message's outcome is told once with its own
    context, and a blocking produce returns the very Delivery it was told with."""
    told: dict[int, list[pk.Delivery | pk.Failure]] = {}

    def on_delivery(result: pk.Delivery | pk.Failure, context: Any) -> None:
        told.setdefault(context, []).append(result)

    returned: dict[int, pk.Delivery | None] = {}
    async with pk.Producer(
        backend.url, topic=topic, on_delivery=on_delivery, timeout=10, **backend.options
    ) as producer:
        for number in range(300):
            blocking = number % 30 == 0
            returned[number] = await producer.produce(
                b"%d" % number, key=b"k%d" % (number % 3), nonblocking=not blocking, context=number
            )
        await producer.flush()
    assert sorted(told) == list(range(300))
    assert all(len(results) == 1 for results in told.values())
    assert all(isinstance(result, pk.Delivery) for (result,) in told.values())
    for number, delivery in returned.items():
        if number % 30 == 0:
            assert delivery is not None and told[number] == [delivery]
        else:
            assert delivery is None


async def test_a_blocking_failure_raises_and_is_told_once(backend: BackendCase, topic: str) -> None:
    """A message refused where it is produced (a MessageError) is raised and told nothing; one
    failed by the producer (purged while it waits for its ack on a stalled link) is raised to
    the blocking caller and told once, as a Failure, with its context."""
    told: list[tuple[Any, Any]] = []
    async with pk.Producer(
        backend.faulty_url if backend.real else backend.url,
        topic=topic,
        timeout=10,
        on_delivery=lambda result, context: told.append((result, context)),
        **backend.options,
    ) as producer:
        assert await producer.produce(b"ok", context="a") == told[0][0]
        with pytest.raises(pk.MessageError):
            await producer.produce(1, context="refused")  # type: ignore[arg-type]
        assert [context for _, context in told] == ["a"]
        if not backend.real:
            return  # acks at once: nothing waits long enough to be purged
        backend.faults.pause()
        async with anyio.create_task_group() as group:

            async def blocking() -> None:
                with pytest.raises(pk.Purged):
                    await producer.produce(b"purged", context="b")

            group.start_soon(blocking)
            await anyio.sleep(0.05)
            assert len(producer.purge()) == 1
        backend.faults.resume()
    assert [context for _, context in told] == ["a", "b"]
    assert isinstance(told[1][0], pk.Failure) and told[1][0].value == b"purged"


async def test_a_raising_callback_is_logged_and_the_producer_goes_on(
    backend: BackendCase, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(result: Any, context: Any) -> None:
        raise RuntimeError("boom")

    async with pk.Producer(
        backend.url, topic=topic, on_delivery=broken, timeout=10, **backend.options
    ) as producer:
        await producer.produce(b"a", nonblocking=True)
        assert await producer.produce(b"b") is not None
    assert producer.stats.acked == 2
    assert "on_delivery callback raised" in caplog.text


async def test_context_without_on_delivery_is_a_message_error(
    backend: BackendCase, topic: str
) -> None:
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        with pytest.raises(pk.MessageError, match="on_delivery"):
            await producer.produce(b"a", nonblocking=True, context=1)
        with pytest.raises(pk.MessageError, match="on_delivery"):
            await producer.produce(b"a", context=1)
        await producer.produce(b"b", nonblocking=True)
    assert producer.stats.produced == producer.stats.acked == 1


def test_on_delivery_must_be_callable() -> None:
    with pytest.raises(pk.ConfigurationError, match="on_delivery"):
        pk.Producer("null://", topic="t", on_delivery="print")  # type: ignore[arg-type]
