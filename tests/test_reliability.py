"""Faults against real brokers: every message ends acked or failed, and is never lost silently.

Brokers are killed with SIGKILL and restarted on the same port and store, frozen with SIGSTOP,
slowed or stalled by the delay proxy, or never started. The invariant checked throughout is
``produced == acked + failed + in_flight``, and after flush/close ``acked + failed == produced``
with every failed message, value included, in ``ProduceError.failures``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from conftest import BackendCase, read_kafka
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import producerkit as pk
from producerkit._connections import open_connections
from producerkit._urls import parse_url
from producerkit.backends.base import BackendSpec, Connection
from producerkit.testing.brokers import LocalBroker, start_kafka, start_nats
from producerkit.testing.proxy import FaultProxy
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio

REAL = ["kafka", "jetstream", "nats"]


def check_invariant(stats: pk.Stats) -> None:
    assert stats.produced == stats.acked + stats.failed + stats.in_flight, stats


def settled(stats: pk.Stats) -> None:
    assert stats.in_flight == 0 and stats.produced == stats.acked + stats.failed, stats


@pytest.fixture(params=REAL)
def own_broker(
    request: pytest.FixtureRequest, tmp_path: Any
) -> Iterator[tuple[str, str, LocalBroker]]:
    """A broker of the test's own, to kill: (backend name, producer URL, broker)."""
    name: str = request.param
    if name == "kafka":
        broker = start_kafka(workdir=tmp_path)
    else:
        broker = start_nats(jetstream=name == "jetstream", workdir=tmp_path)
    with broker:
        yield name, f"{name}://{broker.host_port}", broker


def options_for(name: str) -> dict[str, Any]:
    return {"create_stream": True} if name == "jetstream" else {}


def restart_later(broker: LocalBroker, after: float) -> threading.Thread:
    """Restart a killed broker on the same port and store ``after`` seconds from now."""
    thread = threading.Thread(target=lambda: (time.sleep(after), broker.start()), daemon=True)
    thread.start()
    return thread


async def read_stream(url: str, subject: str, expected: int, timeout: float = 60) -> list[bytes]:
    """Values stored for ``subject``, in stream order, read with a plain nats-py pull consumer.

    (conftest's read_jetstream lets a bare TimeoutError out of nats-py's fetch; this one does not.)
    """
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await nats.connect(url.replace("jetstream://", "nats://"))
    try:
        js = nc.jetstream()
        stream = await js.find_stream_name_by_subject(subject)
        sub = await js.pull_subscribe(
            subject, stream=stream, config=ConsumerConfig(ack_policy=AckPolicy.NONE)
        )
        values: list[bytes] = []
        deadline = time.monotonic() + timeout
        quiet = 0
        while time.monotonic() < deadline and (len(values) < expected or quiet < 2):
            try:
                batch = await sub.fetch(5000, timeout=0.5)
            except TimeoutError:  # nats.errors.TimeoutError is one too
                quiet += 1
                continue
            values.extend(msg.data for msg in batch)
        return values
    finally:
        await nc.close()


def producer_log_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("producerkit")]


# ---------------------------------------------------------------------- kill -9 mid-stream


async def test_jetstream_kill9_restart_every_message_accounted(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """100,000 nonblocking messages to a file-backed stream; the server is SIGKILLed a third of
    the way through and restarted on the same port and store a second later. Acked means stored;
    every failure carries its value; retrying the failures (same msg_id, so the server drops any
    that were stored after all) completes the set exactly."""
    count, timeout = 100_000, 4.0
    caplog.set_level(logging.INFO, logger="producerkit")
    with start_nats(jetstream=True, workdir=tmp_path) as broker:
        url, topic = broker.url, f"kill-{uuid.uuid4().hex[:8]}"

        async def main() -> tuple[list[pk.Failure], pk.Stats]:
            async with pk.Producer(
                url, topic=topic, timeout=timeout, create_stream=True, stream_storage="file"
            ) as producer:
                await producer.produce(b"first", msg_id="first")
                restarter = None
                for i in range(count):
                    if i == count // 3:
                        broker.kill()
                        restarter = restart_later(broker, 1.0)
                    await producer.produce(b"%d" % i, msg_id=str(i), nonblocking=True)
                    if i % 10_000 == 0:
                        check_invariant(producer.stats)
                started = time.monotonic()
                failures: list[pk.Failure] = []
                try:
                    await producer.flush()
                except pk.ProduceError as caught:
                    failures = caught.failures
                assert time.monotonic() - started < timeout + 2  # no hang
                assert restarter is not None
                restarter.join()
                stats = producer.stats
                settled(stats)
                assert stats.produced == count + 1
                assert len(failures) == stats.failed
                # retry: the set completes, and nothing fails this time
                for failure in failures:
                    await producer.produce(
                        failure.value, **failure.retry_kwargs(), nonblocking=True
                    )
                await producer.flush()
            return failures, stats

        failures, _ = await main()
        # Messages awaiting a PubAck when the connection died are published again after the
        # reconnect (their msg_ids make that safe): the kill may cost no ack at all.
        assert all(isinstance(f.exception, pk.ProducerkitError) for f in failures)
        failed_values = [f.value for f in failures]
        assert len(set(failed_values)) == len(failed_values)
        assert all(f.msg_id == f.value.decode() for f in failures)
        expected = {b"first"} | {b"%d" % i for i in range(count)}
        assert set(failed_values) <= expected

        values = await read_stream(url, topic, count + 1)
        # Acked messages were never retried, so each one found here was stored when acked; the
        # failed ones are here through the retry; msg_id de-duplication leaves exactly one each.
        assert len(values) == len(set(values)) == count + 1
        assert set(values) == expected
    lines = producer_log_lines(caplog)
    assert any("reconnected" in line for line in lines)
    assert len(lines) <= 30, lines


async def test_kafka_kill9_restart_exact_accounting(tmp_path: Any) -> None:
    """The same on Tansu (memory storage, so what it held before the kill is gone; the point is
    the producer): down longer than the timeout, so messages fail; exact accounting, no hang,
    and a retry of the failures succeeds once the broker is back."""
    count, timeout = 100_000, 2.0
    with start_kafka(workdir=tmp_path) as broker:

        async def main() -> None:
            async with pk.Producer(broker.url, topic="orders", timeout=timeout) as producer:
                await producer.produce(b"first", key=b"k")
                restarter = None
                for i in range(count):
                    if i == count // 3:
                        broker.kill()
                        restarter = restart_later(broker, timeout + 1.0)
                    await producer.produce(b"%d" % i, key=b"%d" % (i % 64), nonblocking=True)
                    if i % 10_000 == 0:
                        check_invariant(producer.stats)
                started = time.monotonic()
                failures: list[pk.Failure] = []
                try:
                    await producer.flush()
                except pk.ProduceError as caught:
                    failures = caught.failures
                assert time.monotonic() - started < timeout + 2
                stats = producer.stats
                settled(stats)
                assert stats.produced == count + 1
                assert 0 < len(failures) == stats.failed
                assert all(isinstance(f.exception, pk.ProduceTimeout) for f in failures)
                assert len({f.value for f in failures}) == len(failures)
                assert restarter is not None
                restarter.join()
                for failure in failures:
                    await producer.produce(
                        failure.value, **failure.retry_kwargs(), nonblocking=True
                    )
                await producer.flush()
                settled(producer.stats)
                assert producer.stats.acked == count + 1

        await asyncio.wait_for(main(), 60)


async def test_kafka_frozen_broker_survives_acked_are_readable(tmp_path: Any) -> None:
    """Tansu frozen (SIGSTOP) for a second mid-stream and thawed: it survives, so every acked
    message must be readable, and the accounting is exact."""
    count = 20_000
    with start_kafka(workdir=tmp_path) as broker:
        topic = f"frozen-{uuid.uuid4().hex[:8]}"

        async def main() -> list[pk.Failure]:
            async with pk.Producer(broker.url, topic=topic, timeout=10) as producer:
                await producer.produce(b"first", key=b"k")
                for i in range(count):
                    if i == count // 3:
                        broker.freeze()
                        threading.Timer(1.0, broker.thaw).start()
                    await producer.produce(b"%d" % i, key=b"%d" % (i % 16), nonblocking=True)
                try:
                    await producer.flush()
                except pk.ProduceError as caught:
                    return caught.failures
                finally:
                    settled(producer.stats)
            return []

        failures = await main()
        failed = {f.value for f in failures}
        stored = await read_kafka(broker.url, topic, count + 1 - len(failed))
        values = collections.Counter(record["value"] for record in stored)
        acked = {b"first"} | {b"%d" % i for i in range(count)} - failed
        assert acked <= set(values), len(acked - set(values))


# ---------------------------------------------------------------------- never up / gone for good


async def test_a_connect_out_of_time_names_what_it_was_still_awaiting() -> None:
    """A connect that does not finish within the timeout says which step it was waiting on
    (each connection's ``awaiting``), so that "could not connect" is not all a user learns."""

    class WaitsForAnAnswer(Connection):
        async def connect(self) -> None:
            self.awaiting = "an answer that never comes"
            await asyncio.Event().wait()

        def send(self, record: Any) -> None:
            raise AssertionError("nothing is sent")

        async def close(self) -> None:
            pass

    spec = BackendSpec(connection=WaitsForAnAnswer, options={})
    reports: Any = None  # nothing is reported
    started = time.monotonic()
    with pytest.raises(pk.BrokerUnavailable) as raised:
        await open_connections(
            spec, parse_url("kafka://127.0.0.1:9"), {}, reports, timeout=0.2, count=2
        )
    assert time.monotonic() - started < 1.0
    assert str(raised.value) == (
        "could not connect to kafka://127.0.0.1:9 within 0.2s, "
        "still awaiting an answer that never comes"
    )


@pytest.mark.parametrize("scheme", REAL)
async def test_broker_never_up_typed_error_within_timeout(scheme: str) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    url = f"{scheme}://127.0.0.1:{port}"

    async def main() -> None:
        producer = pk.Producer(url, topic="t", timeout=2)
        started = time.monotonic()
        with pytest.raises(pk.BrokerUnavailable):
            await producer.produce(b"v")  # starts lazily, and fails typed
        assert time.monotonic() - started < 2 + 0.5
        await producer.close(timeout=1)

    await main()
    started = time.monotonic()
    sync = pk.SyncProducer(url, topic="t", timeout=2)
    with pytest.raises(pk.BrokerUnavailable):
        sync.start()
    assert time.monotonic() - started < 2 + 0.5
    sync.close()  # its loop thread stops now, not when the collector finds it


async def test_broker_gone_for_good(own_broker: tuple[str, str, LocalBroker], topic: str) -> None:
    """Killed and never back: a blocking produce fails typed within the timeout, flush(timeout=)
    and close(timeout=) keep their deadlines and report every message not delivered."""
    name, url, broker = own_broker
    timeout = 2.0

    async def main() -> None:
        producer = pk.Producer(url, topic=topic, timeout=timeout, **options_for(name))
        await producer.produce(b"before", key=b"k")
        broker.kill()
        started = time.monotonic()
        with pytest.raises((pk.ProduceTimeout, pk.BrokerUnavailable)):
            await producer.produce(b"blocking", key=b"k")
        assert time.monotonic() - started < timeout + 1.0
        sent = 0
        for i in range(200):
            try:
                await producer.produce(b"%d" % i, key=b"k", nonblocking=True)
                sent += 1
            except pk.ProducerkitError:
                pass
        check_invariant(producer.stats)
        started = time.monotonic()
        with pytest.raises((pk.ProduceTimeout, pk.ProduceError)) as flushed:
            await producer.flush(timeout=0.5)
        assert time.monotonic() - started < 0.5 + 0.5
        started = time.monotonic()
        # A write on the dead connection fails at once on uvloop (flush reports it), and stays in
        # flight until close on asyncio.
        failures: list[pk.Failure] = list(getattr(flushed.value, "failures", ()))
        try:
            await producer.close(timeout=1.0)
        except pk.ProduceError as caught:
            failures += caught.failures
        elapsed = time.monotonic() - started
        assert elapsed < 1.0 + 1.0, f"close(timeout=1.0) took {elapsed:.1f}s"
        stats = producer.stats
        settled(stats)
        assert stats.acked == 1 and stats.produced == 2 + sent
        assert failures and all(f.value != b"before" for f in failures)
        with pytest.raises(pk.ProducerClosed):
            await producer.produce(b"after")

    await asyncio.wait_for(main(), 30)


# ---------------------------------------------------------------------- slow broker


@pytest.mark.parametrize("name", ["kafka", "jetstream"])
async def test_slow_broker_window_holds_memory_flat(
    name: str, kafka_broker: SessionBroker, nats_broker: SessionBroker, topic: str
) -> None:
    """40 ms of round trip between producer and broker: the window stays bounded, and the
    memory traced in the producer's process does not grow with the number of messages."""
    limit, count = 500, 12_000
    url = kafka_broker.url if name == "kafka" else nats_broker.jetstream_url
    with FaultProxy.for_url(url, 40) as proxy:

        async def main() -> tuple[int, int, pk.Stats]:
            async with pk.Producer(
                proxy.url, topic=topic, max_in_flight_messages=limit, **options_for(name)
            ) as producer:
                marks = []
                for i in range(count):
                    await producer.produce(b"x" * 100, key=b"%d" % (i % 32), nonblocking=True)
                    if i in (count // 3, count - 1):
                        marks.append(tracemalloc.get_traced_memory()[0])
                    assert producer.stats.in_flight <= limit
                await producer.flush()
                return marks[0], marks[1], producer.stats

        tracemalloc.start()
        try:
            early, late, stats = await main()
        finally:
            tracemalloc.stop()
    assert stats.peak_in_flight <= limit and stats.window_waits > 0
    assert stats.acked == count
    assert late - early < 2_000_000, f"traced memory grew {late - early} bytes"


@pytest.mark.parametrize("name", ["kafka", "jetstream"])
async def test_stalled_broker_times_out_each_message_at_its_own_deadline(
    name: str, kafka_broker: SessionBroker, nats_broker: SessionBroker, topic: str
) -> None:
    """Messages produced 50 ms apart into a stalled link fail one by one, each ``timeout`` after
    its own produce, not all together when a batch or connection gives up."""
    timeout, spacing, count = 1.0, 0.05, 12
    url = kafka_broker.url if name == "kafka" else nats_broker.jetstream_url
    failed_at: dict[bytes, float] = {}

    def on_error(failure: pk.Failure) -> None:
        failed_at[failure.value] = time.monotonic()

    with FaultProxy.for_url(url, 0) as proxy:

        async def main() -> dict[bytes, float]:
            produced_at = {}
            async with pk.Producer(
                proxy.url, topic=topic, timeout=timeout, on_error=on_error, **options_for(name)
            ) as producer:
                await producer.produce(b"warm", key=b"k")
                proxy.pause()
                try:
                    for i in range(count):
                        produced_at[b"%d" % i] = time.monotonic()
                        await producer.produce(b"%d" % i, key=b"k", nonblocking=True)
                        await asyncio.sleep(spacing)
                    with pytest.raises(pk.ProduceError) as caught:
                        await producer.flush()
                    assert len(caught.value.failures) == count
                finally:
                    proxy.resume()
            return produced_at

        produced_at = await main()
    lateness = [failed_at[value] - produced_at[value] - timeout for value in produced_at]
    assert all(-0.01 <= late < 0.25 for late in lateness), lateness
    spread = max(failed_at.values()) - min(failed_at.values())
    assert spread >= (count - 1) * spacing * 0.8, spread


# ---------------------------------------------------------------------- cancellation


@settings(
    max_examples=6,  # (test_cancellation.py cuts produces at random on every backend too)
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    plan=st.lists(
        st.tuples(st.booleans(), st.one_of(st.none(), st.floats(0, 0.02))),
        min_size=1,
        max_size=40,
    ),
    limit=st.integers(1, 8),
)
async def test_random_cancellations_leak_nothing(
    nats_broker: SessionBroker, plan: list[tuple[bool, float | None]], limit: int
) -> None:
    """Each task produces one message (blocking or not) and may be cancelled after a random delay,
    while waiting for the window, mid hand-off or waiting for its ack. Afterwards nothing is in
    flight, every admitted message is acked, the stream holds exactly the acked ones, and the
    window still admits ``limit`` messages at once (no slot leaked)."""
    topic = f"cancel-{uuid.uuid4().hex[:10]}"
    url = nats_broker.jetstream_url

    async def main() -> tuple[pk.Stats, set[bytes]]:
        async with pk.Producer(
            url, topic=topic, max_in_flight_messages=limit, timeout=10, create_stream=True
        ) as producer:
            tasks = [
                asyncio.ensure_future(producer.produce(b"%d" % i, nonblocking=nonblocking))
                for i, (nonblocking, _) in enumerate(plan)
            ]
            cancellers = [
                asyncio.get_running_loop().call_later(delay, task.cancel)
                for task, (_, delay) in zip(tasks, plan, strict=True)
                if delay is not None
            ]
            await asyncio.wait(tasks)
            for canceller in cancellers:
                canceller.cancel()
            completed = {b"%d" % i for i, task in enumerate(tasks) if not task.cancelled()}
            for task in tasks:
                if not task.cancelled():
                    task.result()  # nothing but cancellation may have gone wrong
            await producer.flush()
            stats = producer.stats
            settled(stats)
            assert stats.failed == 0 and stats.peak_in_flight <= limit
            # no slot leaked: a full window's worth goes through at once
            await asyncio.wait_for(
                asyncio.gather(*(producer.produce(b"after") for _ in range(limit))), 5
            )
            assert producer.stats.window_waits == stats.window_waits
        return stats, completed

    stats, completed = await main()
    stored = await read_stream(url, topic, stats.acked + limit, timeout=10)
    values = [value for value in stored if value != b"after"]
    assert len(values) == stats.acked
    assert completed <= set(values)


# ---------------------------------------------------------------------- concurrency


async def test_many_tasks_keep_invariant_and_per_key_order(
    backend: BackendCase, topic: str
) -> None:
    """50 tasks produce on one producer (2 connections, limit 200) at once, each with its own
    keys, mixing blocking and nonblocking; the ledger holds throughout, and where the backend
    stores them every key's messages are stored in produce order. (Threads on a SyncProducer:
    test_sync.py.)"""
    tasks, per_task, limit = 50, 200, 200
    async with pk.Producer(
        backend.url,
        topic=topic,
        max_in_flight_messages=limit,
        connections=2,
        timeout=30,
        **backend.options,
    ) as producer:

        async def worker(t: int) -> None:
            for j in range(per_task):
                key = b"t%d-k%d" % (t, j % 3)
                await producer.produce(key + b":%d" % j, key=key, nonblocking=j % 10 != 0)
                if j % 50 == 0:
                    check_invariant(producer.stats)
                    assert producer.stats.in_flight <= limit

        async with anyio.create_task_group() as group:
            for t in range(tasks):
                group.start_soon(worker, t)
        await producer.flush()
        stats = producer.stats
    settled(stats)
    assert stats.acked == tasks * per_task and stats.peak_in_flight <= limit
    if not backend.spec.stores_records:
        return
    stored = [record["value"] for record in await backend.read(topic, tasks * per_task)]
    by_key: dict[bytes, list[int]] = collections.defaultdict(list)
    for value in stored:
        key, _, j = value.partition(b":")
        by_key[key].append(int(j))
    assert sum(len(seq) for seq in by_key.values()) == tasks * per_task
    for key, seq in by_key.items():
        assert seq == sorted(seq) and len(seq) == len(set(seq)), key


# ---------------------------------------------------------------------- logging


async def test_ten_thousand_failures_log_a_handful_of_lines(
    nats_broker: SessionBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """10,000 messages to a subject no stream stores (each fails with 503): counts, not lines."""
    caplog.set_level(logging.DEBUG, logger="producerkit")
    subject = f"nostream-{uuid.uuid4().hex[:8]}"

    async def main() -> int:
        async with pk.Producer(nats_broker.jetstream_url, topic=subject) as producer:
            for i in range(10_000):
                await producer.produce(b"%d" % i, nonblocking=True)
            with pytest.raises(pk.ProduceError) as caught:
                await producer.flush()
            return len(caught.value.failures)

    assert await main() == 10_000
    lines = producer_log_lines(caplog)
    assert 1 <= len(lines) <= 5, lines
    assert sum(int(line.split()[2]) for line in lines if line.startswith("messages failed")) == (
        10_000
    )


async def test_reconnect_attempts_are_logged_with_counts(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A NATS server down for 3 s: a dozen reconnect attempts are a few log lines, with counts."""
    caplog.set_level(logging.DEBUG, logger="producerkit")
    with start_nats(jetstream=False, workdir=tmp_path) as broker:
        url = f"nats://{broker.host_port}"
        async with pk.Producer(url, topic="t", timeout=10) as producer:
            await producer.produce(b"before")
            broker.kill()
            restarter = restart_later(broker, 3.0)
            while restarter.is_alive():
                await asyncio.sleep(0.1)
            for _ in range(50):  # nats-py retries every 0.25 s
                if any("reconnected" in line for line in producer_log_lines(caplog)):
                    break
                await asyncio.sleep(0.1)
            await producer.produce(b"after")
    lines = producer_log_lines(caplog)
    assert any("reconnected" in line for line in lines), lines
    assert len(lines) <= 4, lines  # the first error, lost, reconnected (with the count)
