"""The foundation's contract, on every backend: window, accounting, round trips, failures."""

from __future__ import annotations

import asyncio
import collections
import socket
import time
from typing import Any

import pytest
from conftest import BackendCase

import producerkit as pk
from producerkit.testing.brokers import start_kafka, start_nats
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio


def check_invariant(stats: pk.Stats) -> None:
    assert stats.produced == stats.acked + stats.failed + stats.in_flight, stats
    # The per-connection figures add up to the totals, also with one connection (not counted
    # per message then, but derived).
    for field in ("produced", "acked", "failed", "in_flight"):
        assert sum(getattr(c, field) for c in stats.connections) == getattr(stats, field), stats


async def test_sync_produce_returns_delivery(backend: BackendCase, topic: str) -> None:
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        first = await producer.produce(b"v", key=b"user-1")
        second = await producer.produce("text value", key="user-1", headers={"h": b"1"})
    assert isinstance(first, pk.Delivery) and isinstance(second, pk.Delivery)
    assert first.topic == second.topic == topic
    if backend.spec.acks_with_offset:
        assert first.offset is not None and second.offset is not None
        assert second.offset > first.offset
    else:
        assert first.offset is None  # a flush is acknowledged, or nothing is stored
    if backend.spec.partitioned:
        assert first.partition is not None and first.partition == second.partition
    else:
        assert first.partition is None
    stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed, stats.in_flight) == (2, 2, 0, 0)


async def test_window_limit_and_drain_to_half(backend: BackendCase, topic: str) -> None:
    """20,000 keyed nonblocking messages with limit 100: never more than 100 in flight, and every
    produce that waited resumed with the window drained to half (plus the message it added)."""
    limit, count = 100, 20_000

    async def main() -> pk.Stats:
        async with pk.Producer(
            backend.url, topic=topic, max_in_flight_messages=limit, timeout=30, **backend.options
        ) as producer:
            for i in range(count):
                waits_before = producer.stats.window_waits if i % 1 == 0 else 0
                await producer.produce(b"value-%d" % i, key=b"key-%d" % (i % 37), nonblocking=True)
                stats = producer.stats
                check_invariant(stats)
                assert stats.in_flight <= limit
                if stats.window_waits > waits_before:
                    assert stats.in_flight <= limit // 2 + 1, stats
            await producer.flush()
        return producer.stats

    stats = await main()
    assert stats.produced == stats.acked == count and stats.failed == 0
    assert stats.peak_in_flight <= limit
    if backend.real:
        assert stats.window_waits > 0  # instant backends never fill the window


async def test_round_trip_exactly_once_in_key_order(backend: BackendCase, topic: str) -> None:
    """The done-when check: 20,000 keyed messages, limit 100, each acked once; where the backend
    stores them, read back by another client exactly once each, in key order, with headers."""
    count, keys = 20_000, 50
    async with pk.Producer(
        backend.url, topic=topic, max_in_flight_messages=100, timeout=30, **backend.options
    ) as producer:
        for i in range(count):
            await producer.produce(
                b"%d" % i, key=b"k%d" % (i % keys), headers={"n": str(i)}, nonblocking=True
            )
        await producer.flush()
        stats = producer.stats
    assert (stats.acked, stats.failed) == (count, 0) and stats.peak_in_flight <= 100
    if backend.real:
        assert stats.window_waits > 0  # instant backends never fill the window
    if not backend.spec.stores_records:
        return
    records = await backend.read(topic, count)
    values = [int(record["value"]) for record in records]
    assert len(values) == count and set(values) == set(range(count)), "each exactly once"
    by_key: dict[int, list[int]] = collections.defaultdict(list)
    for value in values:
        by_key[value % keys].append(value)
    for key, sequence in by_key.items():
        assert sequence == sorted(sequence), f"key {key} out of order"
    assert all(record["headers"]["n"] == record["value"] for record in records)


async def test_keys_values_and_headers_round_trip(backend: BackendCase, topic: str) -> None:
    """bytes, str and bytearray values and keys, headers of bytes and str: stored as bytes
    (read back where the backend stores; the key too where it keeps keys)."""
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        await producer.produce(b"bytes", key=b"k1", headers={"a": b"raw", "b": "caf\u00e9"})
        await producer.produce("str", key="k2", nonblocking=True)
        await producer.produce(bytearray(b"ba"), key=None, msg_id="id-3", nonblocking=True)
        await producer.flush()
        assert (producer.stats.acked, producer.stats.failed) == (3, 0)
    if not backend.spec.stores_records:
        return
    records = sorted(await backend.read(topic, 3), key=lambda r: r["value"])
    assert [r["value"] for r in records] == [b"ba", b"bytes", b"str"]
    assert records[1]["headers"] == {"a": b"raw", "b": "caf\u00e9".encode()}
    if backend.spec.partitioned:  # Kafka and memory:// keep keys (NATS has subjects instead)
        assert [r["key"] for r in records] == [None, b"k1", b"k2"]


async def test_on_outcome_reports_every_message_once(backend: BackendCase, topic: str) -> None:
    """The on_outcome hook: every admitted message's number exactly once, acked, on the
    producer's topic and connection, settled no earlier than produced."""
    outcomes: list[pk.Outcome] = []
    async with pk.Producer(
        backend.url, topic=topic, on_outcome=outcomes.append, timeout=10, **backend.options
    ) as producer:
        for i in range(300):
            await producer.produce(b"%d" % i, key=b"k%d" % (i % 5), nonblocking=i % 50 != 0)
        await producer.flush()
    numbers = sorted(number for outcome in outcomes for number in outcome.numbers)
    assert numbers == list(range(1, 301))  # the n-th message admitted is number n
    for outcome in outcomes:
        assert outcome.acked and outcome.error is None and outcome.possibly_stored is None
        assert outcome.topic == topic and outcome.connection == 0
        assert len(outcome.produced_at) == len(outcome.numbers)
        assert all(at <= outcome.settled_at for at in outcome.produced_at)


async def test_flush_raises_produce_error_with_failures(
    nats_broker: SessionBroker, topic: str
) -> None:
    """JetStream refuses subjects no stream stores: each message fails, is reported to on_error
    and carried by ProduceError with its value, and the producer stays usable."""
    seen: list[pk.Failure] = []

    async def main() -> None:
        url = nats_broker.jetstream_url
        async with pk.Producer(url, topic=topic, on_error=seen.append, timeout=10) as producer:
            for i in range(10):
                await producer.produce(b"%d" % i, key=b"k", nonblocking=True)
            with pytest.raises(pk.ProduceError) as caught:
                await producer.flush()
            assert sorted(f.value for f in caught.value.failures) == sorted(
                b"%d" % i for i in range(10)
            )
            assert all(isinstance(f.exception, pk.DeliveryError) for f in caught.value.failures)
            with pytest.raises(pk.DeliveryError):
                await producer.produce(b"sync", key=b"k")  # a blocking produce raises its own error
            await producer.flush()  # ... and is not reported a second time
            stats = producer.stats
            assert (stats.produced, stats.acked, stats.failed, stats.in_flight) == (11, 0, 11, 0)

    await main()
    assert len(seen) == 10


@pytest.mark.parametrize("name", ["kafka", "jetstream", "nats"])
async def test_timeout_when_broker_stops_answering(name: str, tmp_path: Any, topic: str) -> None:
    """A broker frozen with SIGSTOP: every message fails with ProduceTimeout at its deadline, the
    caller is never held past it, and flush/close report them."""
    starter = start_kafka if name == "kafka" else start_nats
    kwargs: dict[str, Any] = (
        {} if name == "kafka" else {"workdir": tmp_path, "jetstream": name == "jetstream"}
    )
    options: dict[str, Any] = {"create_stream": True} if name == "jetstream" else {}
    with starter(**kwargs) as broker:
        url = broker.url if name != "nats" else f"nats://{broker.host_port}"

        async with pk.Producer(url, topic=topic, timeout=1.5, **options) as producer:
            await producer.produce(b"before", key=b"k")  # topic known, connection warm
            assert broker.process is not None
            broker.freeze()
            try:
                started = time.monotonic()
                with pytest.raises(pk.ProduceTimeout):
                    await producer.produce(b"sync", key=b"k")
                assert time.monotonic() - started < 1.5 + 1.0
                for i in range(20):
                    await producer.produce(b"%d" % i, key=b"k", nonblocking=True)
                with pytest.raises(pk.ProduceError) as caught:
                    await producer.flush()
                assert time.monotonic() - started < 2 * 1.5 + 1.5
                assert len(caught.value.failures) == 20
                assert all(
                    isinstance(f.exception, pk.ProduceTimeout) for f in caught.value.failures
                )
                check_invariant(producer.stats)
                assert producer.stats.in_flight == 0
            finally:
                broker.thaw()


@pytest.mark.parametrize("scheme", ["kafka", "jetstream", "nats"])
async def test_dead_broker_address_fails_fast(scheme: str) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(pk.BrokerUnavailable):
        async with pk.Producer(f"{scheme}://127.0.0.1:{port}", topic="t", timeout=3):
            pass
    assert time.monotonic() - started < 3 + 0.5


@pytest.mark.parametrize("scheme", ["kafka", "jetstream", "nats"])
async def test_silent_broker_times_out_connecting(scheme: str) -> None:
    """A port that accepts connections and never answers: a typed error at the timeout, no hang."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]

        started = time.monotonic()
        with pytest.raises(pk.BrokerUnavailable):
            async with pk.Producer(f"{scheme}://127.0.0.1:{port}", topic="t", timeout=2):
                pass
        assert time.monotonic() - started < 2 + 1.0


async def test_close_flushes_and_rejects_further_produce(backend: BackendCase, topic: str) -> None:
    producer = pk.Producer(backend.url, topic=topic, timeout=10, **backend.options)
    for i in range(500):
        await producer.produce(b"%d" % i, key=b"k", nonblocking=True)
    await producer.close()
    stats = producer.stats
    assert stats.acked == stats.produced == 500 and stats.in_flight == 0
    with pytest.raises(pk.ProducerClosed):
        await producer.produce(b"late")
    await producer.close()  # idempotent


@pytest.mark.brokers  # starts a broker of its own
async def test_close_deadline_fails_what_is_left(tmp_path: Any, topic: str) -> None:
    with start_nats(workdir=tmp_path) as broker:
        producer = pk.Producer(broker.url, topic=topic, timeout=30, create_stream=True)
        await producer.produce(b"warm", key=b"k")
        assert broker.process is not None
        broker.freeze()
        try:
            for i in range(50):
                await producer.produce(b"%d" % i, nonblocking=True)
            started = time.monotonic()
            with pytest.raises(pk.ProduceError) as caught:
                await producer.close(timeout=1.0)
            assert time.monotonic() - started < 1.0 + 6  # + closing the connection
            assert len(caught.value.failures) == 50
            stats = producer.stats
            assert stats.acked + stats.failed == stats.produced == 51
        finally:
            broker.thaw()


@pytest.mark.brokers  # starts a broker of its own
async def test_flush_timeout_reports_in_flight(tmp_path: Any, topic: str) -> None:
    with start_nats(workdir=tmp_path) as broker:
        async with pk.Producer(broker.url, topic=topic, timeout=2, create_stream=True) as producer:
            await producer.produce(b"warm")
            assert broker.process is not None
            broker.freeze()
            try:
                await producer.produce(b"stuck", nonblocking=True)
                with pytest.raises(pk.ProduceTimeout, match="1 message"):
                    await producer.flush(timeout=0.3)
                with pytest.raises(pk.ProduceError):
                    await producer.flush()  # the message's own deadline fails it
            finally:
                broker.thaw()


async def test_sync_produce_occupies_a_slot(backend: BackendCase, topic: str) -> None:
    async with pk.Producer(
        backend.url, topic=topic, max_in_flight_messages=4, timeout=10, **backend.options
    ) as producer:
        results = await asyncio.gather(
            *(producer.produce(b"%d" % i, key=b"k%d" % i) for i in range(40))
        )
        assert all(isinstance(result, pk.Delivery) for result in results)
        assert producer.stats.peak_in_flight <= 4


def test_sync_producer(backend: BackendCase, topic: str) -> None:
    with pk.SyncProducer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        delivery = producer.produce(b"v", key=b"k")
        assert isinstance(delivery, pk.Delivery)
        for i in range(1000):
            producer.produce(b"%d" % i, key=b"k", nonblocking=True)
        producer.flush()
        assert producer.stats.acked == 1001
    with pytest.raises(pk.ProducerClosed):
        producer.produce(b"late")


async def test_sync_producer_inside_running_loop(backend: BackendCase, topic: str) -> None:
    """Notebooks run a loop in the main thread; SyncProducer must still work there."""
    with pk.SyncProducer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        assert producer.produce(b"v") is not None
        producer.produce(b"w", nonblocking=True)
    assert (producer.stats.acked, producer.stats.failed) == (2, 0)


async def test_cancelled_sync_produce_keeps_accounting(backend: BackendCase, topic: str) -> None:
    async with pk.Producer(
        backend.url, topic=topic, max_in_flight_messages=8, timeout=10, **backend.options
    ) as producer:
        tasks = [asyncio.ensure_future(producer.produce(b"%d" % i, key=b"k")) for i in range(64)]
        await asyncio.sleep(0)
        for task in tasks[::3]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await producer.flush()
        stats = producer.stats
        check_invariant(stats)
        assert stats.in_flight == 0 and stats.failed == 0
        assert stats.peak_in_flight <= 8


async def test_tcp_nodelay_is_on(kafka_broker: SessionBroker, nats_broker: SessionBroker) -> None:
    """Seed 001: Nagle's algorithm turned a 3 ms round trip into 43 ms. asyncio and uvloop set
    TCP_NODELAY on their TCP transports; check that every broker connection really has it."""
    import gc

    transport_types: tuple[type, ...] = (asyncio.Transport,)
    if not isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop):
        import uvloop.loop  # uvloop's transports are its own classes, not asyncio.Transport

        transport_types += (uvloop.loop.TCPTransport,)

    for url, port in [
        (kafka_broker.url, kafka_broker.port),
        (nats_broker.url, nats_broker.port),
    ]:
        async with (
            pk.Producer(url, topic="nodelay", create_stream=True)
            if "jetstream" in url
            else pk.Producer(url, topic="nodelay") as producer
        ):
            await producer.produce(b"v")
            sockets = [
                obj.get_extra_info("socket")
                for obj in gc.get_objects()
                if isinstance(obj, transport_types) and not obj.is_closing()
            ]
            ours = [
                s
                for s in sockets
                if s is not None and s.family == socket.AF_INET and s.getpeername()[1] == port
            ]
            assert ours, f"no connection to {url}"
            for sock in ours:
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
