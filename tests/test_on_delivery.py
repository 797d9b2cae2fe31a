"""Producer(on_delivery=...): called exactly once per message with its Delivery or its Failure,
and the context given to that message's produce()."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

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


async def test_a_blocking_failure_raises_and_is_told_once() -> None:
    told: list[tuple[Any, Any]] = []
    async with pk.Producer(
        "memory://", topic="t", on_delivery=lambda r, c: told.append((r, c))
    ) as producer:
        await producer.produce(b"ok", context="a")
        assert [context for _, context in told] == ["a"]


async def test_a_raising_callback_is_logged_and_the_producer_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(result: Any, context: Any) -> None:
        raise RuntimeError("boom")

    async with pk.Producer("memory://", topic="t", on_delivery=broken) as producer:
        await producer.produce(b"a", nonblocking=True)
        assert await producer.produce(b"b") is not None
    assert producer.stats.acked == 2
    assert "on_delivery callback raised" in caplog.text


async def test_context_without_on_delivery_is_a_message_error() -> None:
    async with pk.Producer("memory://", topic="t") as producer:
        with pytest.raises(pk.MessageError, match="on_delivery"):
            await producer.produce(b"a", nonblocking=True, context=1)
        await producer.produce(b"b", nonblocking=True)
    assert producer.stats.produced == 1


def test_on_delivery_must_be_callable() -> None:
    with pytest.raises(pk.ConfigurationError, match="on_delivery"):
        pk.Producer("null://", topic="t", on_delivery="print")  # type: ignore[arg-type]
