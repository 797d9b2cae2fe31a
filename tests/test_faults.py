"""Each fault of ``producerkit.testing`` against the real brokers through producerkit's Producer:
what the producer sees, that every message is accounted for (``acked + failed == produced``),
and that it recovers once the fault ends. The faults come from the pytest plugin's brokers
(``faulty_url`` and ``faults``); its hook clears them after each test."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import anyio
import anyio.to_thread
import pytest
from conftest import read_jetstream, read_kafka

import producerkit as pk
from producerkit.testing.brokers import BrokerFaults
from producerkit.testing.pytest_plugin import NatsSessionBroker, SessionBroker

# brokers: some reach theirs through the link fixture or a private broker, which conftest's
# marking does not see.
pytestmark = [pytest.mark.anyio, pytest.mark.brokers]


class Link:
    """A backend through its session broker's fault proxy."""

    def __init__(self, name: str, broker: SessionBroker, url: str, **options: Any) -> None:
        self.name = name
        self.broker = broker
        self.url = url
        self.faults: BrokerFaults = broker.faults
        self.options = options

    async def read(self, topic: str, expected: int) -> list[bytes]:
        """Every value stored in ``topic``, read around the proxy."""
        if self.name == "kafka":
            records = await read_kafka(self.broker.url, topic, expected)
        else:
            assert isinstance(self.broker, NatsSessionBroker)
            records = await read_jetstream(self.broker.jetstream_url, topic, expected)
        return [record["value"] for record in records]

    def __repr__(self) -> str:
        return f"<Link {self.name} {self.url}>"


@pytest.fixture(params=["kafka", "jetstream"])
def link(request: pytest.FixtureRequest) -> Link:
    if request.param == "kafka":
        kafka: SessionBroker = request.getfixturevalue("kafka_broker")
        return Link("kafka", kafka, kafka.faulty_url)
    nats: NatsSessionBroker = request.getfixturevalue("nats_broker")
    return Link("jetstream", nats, nats.faulty_jetstream_url, create_stream=True)


class Outcomes:
    """Each message's outcome by its ``context``, from ``on_delivery``."""

    def __init__(self) -> None:
        self.acked: list[Any] = []
        self.failed: list[tuple[Any, BaseException]] = []

    def __call__(self, result: pk.Delivery | pk.Failure, context: Any) -> None:
        if isinstance(result, pk.Failure):
            self.failed.append((context, result.exception))
        else:
            self.acked.append(context)


async def flushed(producer: pk.Producer) -> list[pk.Failure]:
    """flush(), returning the failures it raised."""
    try:
        await producer.flush()
    except pk.ProduceError as caught:
        return caught.failures
    return []


def accounted(stats: pk.Stats, produced: int) -> None:
    assert stats.produced == produced
    assert stats.in_flight == 0
    assert stats.acked + stats.failed == stats.produced


async def delivered_again(producer: pk.Producer, within: float = 20.0) -> pk.Delivery:
    """A blocking produce that succeeds, retried until ``within`` seconds have passed."""
    deadline = time.monotonic() + within
    while True:
        try:
            delivery = await producer.produce(b"after")
        except pk.ProducerkitError:
            if time.monotonic() > deadline:
                raise
            await anyio.sleep(0.2)
            continue
        assert delivery is not None
        return delivery


async def test_stall_delivers_everything_late(link: Link, topic: str) -> None:
    outcomes = Outcomes()
    async with pk.Producer(
        link.url, topic=topic, timeout=10, on_delivery=outcomes, **link.options
    ) as producer:
        await producer.produce(b"warm-up")
        link.faults.stall(1.5)
        started = time.monotonic()
        for i in range(50):
            await producer.produce(b"%d" % i, key=b"k", nonblocking=True, context=i)
        assert await flushed(producer) == []
        elapsed = time.monotonic() - started
        accounted(producer.stats, 51)
    assert 1.3 <= elapsed < 9
    assert sorted(outcomes.acked[1:]) == list(range(50))
    values = await link.read(topic, 51)
    assert sorted(values) == sorted([b"warm-up", *(b"%d" % i for i in range(50))])


async def test_blackhole_longer_than_the_timeout_fails_each_message(link: Link, topic: str) -> None:
    """Nothing reaches the broker or comes back: each message fails with ProduceTimeout after
    its own timeout; once the blackhole ends, the producer reconnects and delivers again."""
    timeout, count = 1.0, 20
    async with pk.Producer(link.url, topic=topic, timeout=timeout, **link.options) as producer:
        await producer.produce(b"warm-up")
        link.faults.blackhole(2)
        started = time.monotonic()
        for i in range(count):
            await producer.produce(b"%d" % i, nonblocking=True)
        failures = await flushed(producer)
        assert time.monotonic() - started < timeout + 2  # each at its own deadline: no hang
        assert len(failures) == count
        assert all(isinstance(f.exception, pk.ProduceTimeout) for f in failures)
        accounted(producer.stats, count + 1)
        assert producer.stats.failed == count
        while "blackhole" in link.faults.log.active():
            await anyio.sleep(0.05)
        delivery = await delivered_again(producer)
    assert delivery.offset is not None
    assert b"after" in await link.read(topic, 2)


async def test_reset_makes_the_client_reconnect(link: Link, topic: str) -> None:
    """Every connection is reset while messages flow: the client reconnects and later messages
    are delivered. A message written into a connection as it was reset may be lost: it then
    fails at its deadline, and is counted."""
    outcomes = Outcomes()
    async with pk.Producer(
        link.url, topic=topic, timeout=2, on_delivery=outcomes, **link.options
    ) as producer:
        await producer.produce(b"warm-up", context=-1.0)
        assert link.faults.connections >= 1
        started = time.monotonic()
        produced = 1
        while (at := time.monotonic() - started) < 2:
            if produced == 10:
                link.faults.reset()
                assert link.faults.connections == 0
                reset_at = at
            await producer.produce(b"v", nonblocking=True, context=at)
            produced += 1
            await anyio.sleep(0.02)
        failures = await flushed(producer)
        accounted(producer.stats, produced)
        assert link.faults.connections >= 1  # new ones, through the proxy
    assert all(isinstance(f.exception, pk.ProducerkitError) for f in failures)
    assert all(reset_at - 0.1 < at < reset_at + 1 for at, _ in outcomes.failed), outcomes.failed
    assert len([at for at in outcomes.acked if at > reset_at + 1]) >= 10
    reset = [w for w in link.faults.log.windows() if w.mode == "reset"][-1]
    assert reset.detail != "connections=0"


async def test_refuse_then_recovery(link: Link, topic: str) -> None:
    """Connections are reset and new ones refused for 1.5 s: what is produced meanwhile is
    delivered once the broker can be reached again (a message written into a connection as it
    was reset may be lost: it fails at its deadline, and is counted)."""
    outcomes = Outcomes()
    async with pk.Producer(
        link.url, topic=topic, timeout=4, on_delivery=outcomes, **link.options
    ) as producer:
        await producer.produce(b"warm-up", context=-1.0)
        link.faults.refuse(1.5)
        host, port = link.faults.host_port.split(":")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=5).close()
        started = time.monotonic()
        produced = 1
        while (at := time.monotonic() - started) < 2.5:  # during the refusal and after it
            await producer.produce(b"v", nonblocking=True, context=at)
            produced += 1
            await anyio.sleep(0.05)
        failures = await flushed(producer)
        accounted(producer.stats, produced)
    assert all(isinstance(f.exception, pk.ProducerkitError) for f in failures)
    assert all(at < 1.5 for at, _ in outcomes.failed), outcomes.failed
    assert len([at for at in outcomes.acked if at > 2]) >= 5
    assert len(outcomes.acked) >= produced - 2


async def test_slow_throttles_the_link(link: Link, topic: str) -> None:
    rate, size, count = 50_000, 1000, 60
    async with pk.Producer(link.url, topic=topic, timeout=20, **link.options) as producer:
        await producer.produce(b"warm-up")
        link.faults.slow(30, rate)
        started = time.monotonic()
        for _ in range(count):
            await producer.produce(os.urandom(size), nonblocking=True)
        assert await flushed(producer) == []
        elapsed = time.monotonic() - started
        accounted(producer.stats, count + 1)
    # 60 kB of values at 50 kB/s: never faster than the bandwidth, loosely never far slower.
    assert size * count / rate * 0.9 <= elapsed <= size * count / rate * 5
    slow = [w for w in link.faults.log.windows() if w.mode == "slow"][-1]
    assert slow.ended is None  # cleared by the plugin after this test


async def test_clear_ends_a_long_stall_at_once(kafka_broker: SessionBroker, topic: str) -> None:
    async with pk.Producer(kafka_broker.faulty_url, topic=topic, timeout=30) as producer:
        await producer.produce(b"warm-up")
        kafka_broker.faults.stall(60)
        kafka_broker.faults.set_rtt(200)
        for _ in range(10):
            await producer.produce(b"v", nonblocking=True)
        await anyio.sleep(0.3)
        assert producer.stats.in_flight == 10
        started = time.monotonic()
        kafka_broker.faults.clear()
        assert await flushed(producer) == []
        assert time.monotonic() - started < 5
        assert kafka_broker.faults.log.active() == ()


async def test_kill_and_restart_keep_what_jetstream_stored(
    private_nats_broker: NatsSessionBroker, topic: str
) -> None:
    """SIGKILL a private nats-server with a file-backed stream and start it again on the same
    port and storage: what was stored survives, and what was produced while the server was down
    is delivered after the restart (or failed, and counted)."""
    broker = private_nats_broker
    outcomes = Outcomes()
    async with pk.Producer(
        broker.faulty_jetstream_url,
        topic=topic,
        timeout=5,
        on_delivery=outcomes,
        create_stream=True,
        stream_storage="file",
    ) as producer:
        for i in range(20):
            await producer.produce(b"before-%d" % i, nonblocking=True, context=b"before-%d" % i)
        assert await flushed(producer) == []
        broker.faults.kill()
        assert not broker.local.running
        await anyio.sleep(0.3)  # the client sees its connection die
        for i in range(20):
            await producer.produce(b"down-%d" % i, nonblocking=True, context=b"down-%d" % i)
        await anyio.sleep(0.5)
        await anyio.to_thread.run_sync(broker.faults.restart)
        await flushed(producer)
        accounted(producer.stats, 40)
    [kill] = [w for w in broker.faults.log.windows() if w.mode == "kill"]
    assert kill.ended is not None and kill.ended - kill.started >= 0.5
    records = await read_jetstream(broker.jetstream_url, topic, len(outcomes.acked))
    values = [record["value"] for record in records]
    assert {b"before-%d" % i for i in range(20)} <= set(values)
    assert set(outcomes.acked) <= set(values)


async def test_kill_and_restart_a_private_kafka_broker(
    private_kafka_broker: SessionBroker, topic: str
) -> None:
    """Tansu keeps its topics in memory, so a restart empties it; the producer delivers again
    once it is back."""
    broker = private_kafka_broker
    async with pk.Producer(broker.faulty_url, topic=topic, timeout=1) as producer:
        await producer.produce(b"before")
        broker.faults.kill()
        with pytest.raises((pk.ProduceTimeout, pk.BrokerUnavailable)):
            await producer.produce(b"down")
        await anyio.to_thread.run_sync(broker.faults.restart)
        await delivered_again(producer)
        accounted(producer.stats, producer.stats.produced)
    assert broker.faults.log.active() == ()
