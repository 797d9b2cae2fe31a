"""What a new user trips on in the first hour (issue 39), each as the user met it."""

from __future__ import annotations

import time

import pytest
from conftest import read_jetstream

import producerkit as pk
from producerkit.testing.pytest_plugin import NatsSessionBroker

pytestmark = pytest.mark.anyio


async def test_jetstream_stream_lookup_lost_in_a_blackhole_is_asked_again(
    nats_broker: NatsSessionBroker, topic: str
) -> None:
    """The user's test as docs/testing.md teaches it: a 2 s blackhole before the first produce
    loses the stream lookup (and the stream's creation); it is asked again, and every message
    is acked once the blackhole has ended, well within its timeout."""
    acked: set[bytes] = set()

    def on_delivery(result: pk.Delivery | pk.Failure, value: bytes) -> None:
        if isinstance(result, pk.Delivery):
            acked.add(value)

    async with pk.Producer(
        nats_broker.faulty_jetstream_url,
        topic=topic,
        timeout=15,
        create_stream=True,
        on_delivery=on_delivery,
    ) as producer:
        nats_broker.faults.blackhole(2.0)
        started = time.monotonic()
        for i in range(200):
            value = b"order-%d" % i
            await producer.produce(
                value, key=b"user-%d" % (i % 10), nonblocking=True, context=value
            )
        await producer.flush()  # raises ProduceError if any message failed
        elapsed = time.monotonic() - started
        stats = producer.stats
    assert stats.acked == stats.produced == 200
    assert len(acked) == 200
    assert elapsed < 12, elapsed  # asked again soon after the blackhole, not at the deadline
    stored = {
        record["value"] for record in await read_jetstream(nats_broker.jetstream_url, topic, 200)
    }
    assert acked <= stored
