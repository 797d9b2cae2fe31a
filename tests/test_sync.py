"""SyncProducer: calls from its own loop thread, close(), the batched nonblocking path's
accounting and back-pressure, bad input at the call, threads, and unclosed producers."""

from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from conftest import BackendCase, read_jetstream

import producerkit as pk
from producerkit.testing.brokers import LocalBroker, start_kafka


def settled(stats: pk.Stats) -> None:
    assert stats.in_flight == 0 and stats.produced == stats.acked + stats.failed, stats


def run_threads(worker: Callable[[int], None], count: int) -> None:
    """``worker(0)`` ... ``worker(count - 1)``, each in a thread of its own, all joined."""
    pool = [threading.Thread(target=worker, args=(t,)) for t in range(count)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(120)


# ---------------------------------------------------------------------- its own loop thread


def test_blocking_calls_from_a_callback_raise_loop_thread_error_at_once(
    backend: BackendCase, topic: str
) -> None:
    """Each call that would wait on the loop, made from on_outcome (on the loop's thread),
    raises LoopThreadError in well under 100 ms; stats may be read there."""
    calls: dict[str, float] = {}
    sync: pk.SyncProducer

    def on_outcome(outcome: pk.Outcome) -> None:
        if calls:
            return
        attempts = {
            "produce": lambda: sync.produce(b"again"),
            "produce nonblocking": lambda: sync.produce(b"again", nonblocking=True),
            "flush": sync.flush,
            "close": sync.close,
            "start": sync.start,
        }
        for name, attempt in attempts.items():
            started = time.monotonic()
            try:
                attempt()
            except pk.LoopThreadError:
                calls[name] = time.monotonic() - started
        calls["stats in flight"] = sync.stats.in_flight

    sync = pk.SyncProducer(
        backend.url, topic=topic, on_outcome=on_outcome, timeout=10, **backend.options
    )
    with sync:
        sync.produce(b"v", nonblocking=True)
        sync.flush()
        assert sync.produce(b"after") is not None  # still usable
    assert set(calls) == {
        "produce",
        "produce nonblocking",
        "flush",
        "close",
        "start",
        "stats in flight",
    }
    assert all(calls[name] < 0.1 for name in calls if name != "stats in flight"), calls
    settled(sync.stats)


def test_from_on_error_on_jetstream(nats_broker: LocalBroker) -> None:
    """A real failure (a subject no stream stores): on_error's blocking produce raises at once."""
    elapsed: list[float] = []
    sync: pk.SyncProducer

    def on_error(failure: pk.Failure) -> None:
        started = time.monotonic()
        with pytest.raises(pk.LoopThreadError):
            sync.produce(failure.value, **failure.retry_kwargs())
        elapsed.append(time.monotonic() - started)

    subject = f"nostream-{uuid.uuid4().hex[:8]}"
    sync = pk.SyncProducer(nats_broker.jetstream_url, topic=subject, on_error=on_error)
    for i in range(5):
        sync.produce(b"%d" % i, nonblocking=True)
    with pytest.raises(pk.ProduceError) as caught:
        sync.close()
    assert len(caught.value.failures) == 5 and len(elapsed) == 5
    # At once, not after the 30 s timeout: a bound that a loaded machine cannot reach by chance.
    assert max(elapsed) < 5, elapsed


# ---------------------------------------------------------------------- close


def test_close_leaves_no_task_running(backend: BackendCase, topic: str) -> None:
    sync = pk.SyncProducer(backend.url, topic=topic, timeout=10, **backend.options)
    for i in range(500):
        sync.produce(b"%d" % i, key=b"k%d" % (i % 7), nonblocking=True)

    async def tasks() -> set[asyncio.Task[Any]]:
        return asyncio.all_tasks()

    running = asyncio.run_coroutine_threadsafe(tasks(), sync.loop).result(10)
    thread_id = sync._loop.thread_id
    if backend.real:
        assert len(running) > 1  # the clients' readers and senders, besides this one
    sync.close()
    assert all(task.done() for task in running), [t for t in running if not t.done()]
    assert sync.loop.is_closed()
    # Its own loop thread, by id: another test's producer may still be closing beside it.
    assert not any(t.ident == thread_id and t.is_alive() for t in threading.enumerate())
    settled(sync.stats)
    assert sync.stats.acked == 500
    with pytest.raises(pk.ProducerClosed):
        sync.produce(b"late", nonblocking=True)
    sync.close()  # a second close does nothing


# ---------------------------------------------------------------------- exact accounting


def test_kafka_accounting_exact_with_a_dead_broker(tmp_path: Any, topic: str) -> None:
    """1,000 acked, then the broker is killed and 100 more fail: every one is counted."""
    with start_kafka(workdir=tmp_path) as broker:
        sync = pk.SyncProducer(broker.url, topic=topic, timeout=2)
        for i in range(1000):
            sync.produce(b"%d" % i, key=b"k%d" % (i % 10), nonblocking=True)
        sync.flush()
        broker.kill()
        for i in range(100):
            sync.produce(b"lost %d" % i, key=b"k%d" % (i % 10), nonblocking=True)
        stats = sync.stats
        assert stats.produced == stats.acked + stats.failed + stats.in_flight == 1100, stats
        with pytest.raises(pk.ProduceError) as caught:
            sync.close(timeout=3)
    assert len(caught.value.failures) == 100
    assert all(failure.value.startswith(b"lost") for failure in caught.value.failures)
    stats = sync.stats
    settled(stats)
    assert (stats.acked, stats.failed) == (1000, 100)


def test_jetstream_accounting_exact_with_failures(nats_broker: LocalBroker, topic: str) -> None:
    """1,000 to a stream and 100 to a subject no stream stores, interleaved, nonblocking."""
    url = nats_broker.jetstream_url
    with pk.SyncProducer(url, topic=topic, create_stream=True) as creator:
        creator.produce(b"stream created")
    nowhere = f"nostream-{uuid.uuid4().hex[:8]}"
    errors: list[pk.Failure] = []
    sync = pk.SyncProducer(url, topic=topic, on_error=errors.append)
    for i in range(1100):
        if i % 11 == 5:
            sync.produce(b"nowhere %d" % i, topic=nowhere, nonblocking=True)
        else:
            sync.produce(b"%d" % i, nonblocking=True)
    with pytest.raises(pk.ProduceError) as caught:
        sync.flush()
    stats = sync.stats
    settled(stats)
    assert (stats.acked, stats.failed, stats.produced) == (1000, 100, 1100)
    assert len(caught.value.failures) == len(errors) == 100
    sync.close()
    records = anyio.run(read_jetstream, url, topic, 1001)
    assert len(records) == 1001


# ---------------------------------------------------------------------- back-pressure


def test_back_pressure_bounds_buffered_and_in_flight(backend: BackendCase, topic: str) -> None:
    """Four threads against a window of 50: what is in flight never exceeds 50 (read on the
    loop at every ack), and on a real broker the threads did wait."""
    limit, threads, per_thread = 50, 4, 2000
    seen: list[int] = []
    sync: pk.SyncProducer

    def on_outcome(outcome: pk.Outcome) -> None:
        seen.append(sync.stats.in_flight)

    sync = pk.SyncProducer(
        backend.url,
        topic=topic,
        max_in_flight_messages=limit,
        on_outcome=on_outcome,
        timeout=10,
        **backend.options,
    )

    def worker(t: int) -> None:
        for j in range(per_thread):
            sync.produce(b"%d:%d" % (t, j), key=b"k%d" % t, nonblocking=True)

    with sync:
        run_threads(worker, threads)
        sync.flush()
        stats = sync.stats
    settled(stats)
    assert stats.acked == threads * per_thread
    assert seen and max(seen) <= limit, max(seen)
    assert stats.peak_in_flight <= limit
    if backend.real:
        assert stats.window_waits > 0


# ---------------------------------------------------------------------- bad input


def test_bad_input_raises_at_the_call_and_the_producer_stays_usable(
    backend: BackendCase, topic: str
) -> None:
    bad_calls: list[tuple[type[pk.ProducerkitError], dict[str, Any]]] = [
        (pk.MessageError, {"value": 123}),
        (pk.MessageError, {"value": b"v", "key": 4.5}),
        (pk.MessageError, {"value": b"v", "topic": ""}),
        (pk.MessageError, {"value": b"v", "topic": ["not", "hashable"]}),
        (pk.MessageError, {"value": b"v", "partition": 99}),
        (pk.MessageError, {"value": b"v", "partition": "0"}),
        (pk.MessageError, {"value": b"v", "headers": {"h": 1}}),
        (pk.MessageError, {"value": b"v", "msg_id": ""}),
        (pk.MessageTooLarge, {"value": b"x" * 10_000_000}),
    ]
    partition = 0 if backend.spec.partitioned else None
    with pk.SyncProducer(backend.url, topic=topic, timeout=10, **backend.options) as sync:
        sync.produce(b"first", nonblocking=True)
        for error, call in bad_calls:
            with pytest.raises(error):
                sync.produce(**call, nonblocking=True)
            with pytest.raises(error):
                sync.produce(**call)
        sync.produce(b"last", partition=partition, headers={"h": "v"}, nonblocking=True)
        sync.flush()
        stats = sync.stats
    settled(stats)
    assert stats.acked == 2 and stats.failed == 0


def test_a_partition_added_later_is_taken_by_both_facades_alike(kafka_broker: Any) -> None:
    """The sync facade checks ``partition=`` against the producer's own partition counts, never a
    copy: a topic recreated larger (Tansu cannot add partitions) is seen by the producer's
    metadata refresh, which forgets the old count, and then partition 5 is taken by
    ``SyncProducer.produce`` and by the async ``produce`` of the producer underneath alike
    (the sync facade's own cache refused it forever)."""
    from aiokafka.admin import AIOKafkaAdminClient

    from producerkit.testing.brokers import create_kafka_topic

    topic = f"grows-{uuid.uuid4().hex[:8]}"

    async def recreate(partitions: int) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.host_port)
        await admin.start()
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()
        await create_kafka_topic(kafka_broker.url, topic, partitions)

    anyio.run(create_kafka_topic, kafka_broker.url, topic, 2)
    with pk.SyncProducer(
        kafka_broker.url, topic=topic, timeout=10, metadata_max_age_ms=200
    ) as sync:

        def produce_async(partition: int) -> pk.Delivery | None:
            produced = sync.producer.produce(b"async", partition=partition)
            return asyncio.run_coroutine_threadsafe(produced, sync.loop).result(10)

        def produce_sync(partition: int) -> pk.Delivery | None:
            return sync.produce(b"sync", partition=partition)

        for produce in (produce_sync, produce_async):
            delivery = produce(1)
            assert delivery is not None and delivery.partition == 1
            with pytest.raises(pk.MessageError, match="out of range"):
                produce(5)
        anyio.run(recreate, 6)
        deadline = time.monotonic() + 10
        while True:  # until the producer's metadata refresh has seen the new count
            try:
                delivery = produce_sync(5)
                break
            except pk.MessageError:
                assert time.monotonic() < deadline, "the sync facade never took partition 5"
                time.sleep(0.05)
        assert delivery is not None and delivery.partition == 5
        delivery = produce_async(5)
        assert delivery is not None and delivery.partition == 5
        stats = sync.stats
    settled(stats)
    assert stats.failed == 0


# ---------------------------------------------------------------------- threads


def test_many_threads_share_one_producer(backend: BackendCase, topic: str) -> None:
    """Eight threads, blocking and nonblocking produces mixed, each with its own key: the
    ledger holds throughout, all are acked, and where the backend stores them each thread's
    messages are stored in the order it produced them."""
    threads, per_thread = 8, 400
    errors: list[BaseException] = []
    with pk.SyncProducer(
        backend.url, topic=topic, max_in_flight_messages=64, timeout=10, **backend.options
    ) as sync:

        def worker(t: int) -> None:
            try:
                for j in range(per_thread):
                    delivery = sync.produce(
                        b"%d:%d" % (t, j), key=b"t%d" % t, nonblocking=j % 5 != 0
                    )
                    assert (delivery is None) == (j % 5 != 0)
                    if j % 100 == 0:
                        stats = sync.stats
                        assert stats.produced == stats.acked + stats.failed + stats.in_flight
            except BaseException as exc:
                errors.append(exc)

        run_threads(worker, threads)
        sync.flush()
        stats = sync.stats
    assert not errors, errors
    settled(stats)
    assert stats.acked == threads * per_thread and stats.peak_in_flight <= 64
    if not backend.spec.stores_records:
        return
    records = anyio.run(backend.read, topic, threads * per_thread)
    order: dict[bytes, list[int]] = {}
    for record in records:
        thread_id, number = record["value"].split(b":")
        order.setdefault(thread_id, []).append(int(number))
    assert all(numbers == list(range(per_thread)) for numbers in order.values()), order.keys()
    assert len(order) == threads


# ---------------------------------------------------------------------- unclosed


def test_garbage_collected_producer_flushes_and_warns(
    backend: BackendCase, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    acked: list[int] = []

    def make_and_forget() -> None:
        sync = pk.SyncProducer(
            backend.url,
            topic=topic,
            on_outcome=lambda o: acked.append(len(o.numbers)),
            **backend.options,
        )
        for i in range(2000):
            sync.produce(b"%d" % i, key=b"k", nonblocking=True)

    caplog.set_level(logging.WARNING, logger="producerkit")
    with pytest.warns(ResourceWarning, match="unclosed SyncProducer"):
        make_and_forget()
        gc.collect()
    assert sum(acked) == 2000
    assert any("unclosed SyncProducer" in r.getMessage() for r in caplog.records)


def test_producer_left_at_exit_flushes_and_warns(backend: BackendCase, topic: str) -> None:
    code = textwrap.dedent(
        f"""
        import producerkit as pk
        acked = 0
        def on_outcome(outcome):
            global acked
            acked += len(outcome.numbers)
            if acked == 3000:
                print("all acked", flush=True)
        sync = pk.SyncProducer(
            {backend.url!r}, topic={topic!r}, on_outcome=on_outcome, **{backend.options!r}
        )
        for i in range(3000):
            sync.produce(b"%d" % i, key=b"k", nonblocking=True)
        """
    )
    result = subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "all acked" in result.stdout, result.stderr
    assert "unclosed SyncProducer" in result.stderr


# ---------------------------------------------------------------------- the loop's backend


def test_loop_backend_options(topic: str) -> None:
    pytest.importorskip("uvloop")
    with pk.SyncProducer(
        "memory://", topic=topic, loop_backend_options={"use_uvloop": True}
    ) as sync:
        assert type(sync.loop).__module__.startswith("uvloop")
        assert sync.produce(b"v") is not None
    with pytest.raises(pk.ConfigurationError):
        pk.SyncProducer("memory://", loop_backend_options={"no_such_option": 1})
    with pytest.raises(pk.ConfigurationError):
        pk.SyncProducer("memory://", loop_backend_options=["use_uvloop"])  # type: ignore[arg-type]


def test_on_delivery_context_expect_and_byte_bound_through_the_sync_path(
    backend: BackendCase, topic: str
) -> None:
    told: list[tuple[Any, Any]] = []
    with pk.SyncProducer(
        backend.url,
        topic=topic,
        on_delivery=lambda result, context: told.append((result, context)),
        max_in_flight_bytes=10_000,
        timeout=10,
        **backend.options,
    ) as producer:
        for number in range(200):
            producer.produce(b"x" * 1_000, key=b"k", nonblocking=True, context=number)
        if backend.spec.takes_expectations:
            delivery = producer.produce(b"b", context="b", expect=pk.Expect(last_sequence=200))
            assert delivery is not None and delivery.offset == 201
            with pytest.raises(pk.ExpectationFailed):
                producer.produce(b"conflict", context="c", expect=pk.Expect(last_sequence=0))
        else:
            # The same key as the 200: acks are told in order within a partition only (a keyless
            # message may land on another partition, whose ack can come first).
            assert producer.produce(b"b", key=b"k", context="b") is not None
            with pytest.raises(pk.MessageError, match="JetStream"):
                producer.produce(b"c", context="c", expect=pk.Expect(last_sequence=0))
        stats = producer.stats
    assert [context for _, context in told[:200]] == list(range(200))
    assert all(isinstance(result, pk.Delivery) for result, _ in told[:201])
    if backend.spec.takes_expectations:
        assert [context for _, context in told[200:]] == ["b", "c"]
        assert isinstance(told[-1][0], pk.Failure)
    else:
        assert [context for _, context in told[200:]] == ["b"]  # "c" was refused at the call
    assert stats.peak_bytes_in_flight is not None and stats.peak_bytes_in_flight <= 10_000


def test_context_without_on_delivery_is_refused_at_the_call(
    backend: BackendCase, topic: str
) -> None:
    with pk.SyncProducer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        with pytest.raises(pk.MessageError, match="on_delivery"):
            producer.produce(b"v", nonblocking=True, context=1)
        if not backend.spec.takes_expectations:
            with pytest.raises(pk.MessageError, match="JetStream"):
                producer.produce(b"v", expect=pk.Expect(last_sequence=1))
        producer.produce(b"ok")
    assert producer.stats.produced == 1


def test_timestamps_and_tombstones_through_the_sync_path(backend: BackendCase, topic: str) -> None:
    """What the async producer takes or refuses, the sync one does too, at the call."""
    with pk.SyncProducer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        if backend.spec.takes_timestamps:
            delivery = producer.produce(b"v", key=b"k", timestamp=1_700_000_000.5)
            assert delivery is not None
            assert backend.fake_append_time or delivery.timestamp == 1_700_000_000.5
            producer.produce(b"w", key=b"k", nonblocking=True, timestamp=1_600_000_000)
        else:
            with pytest.raises(pk.MessageError, match="timestamp="):
                producer.produce(b"v", key=b"k", timestamp=1_700_000_000.5)
        if backend.spec.takes_tombstones:
            assert producer.produce(None, key=b"k") is not None
        else:
            with pytest.raises(pk.MessageError, match="None"):
                producer.produce(None, key=b"k", nonblocking=True)
        producer.flush()
        stats = producer.stats
    expected = 2 * backend.spec.takes_timestamps + backend.spec.takes_tombstones
    assert (stats.produced, stats.acked) == (expected, expected)
    if backend.spec.stores_records and backend.spec.stores_timestamps:
        records = anyio.run(backend.read, topic, expected)
        stamps = {r["value"]: r["timestamp"] for r in records}
        assert stamps[b"v"] == 1_700_000_000_500 and stamps[b"w"] == 1_600_000_000_000
        assert (None in stamps) == backend.spec.takes_tombstones


def test_a_handed_over_message_whose_partitioner_raises_fails_and_frees_only_its_own_room() -> None:
    """The loop's Admission raising on a message handed over by another thread (a user's
    partitioner) leaves nothing in flight: the message fails, and the window's count of
    handed-over room is where it was (else ``in_flight`` reads -1 and the bound one more)."""

    def partitioner(key: bytes, partitions: int) -> int:
        if key == b"bad":
            raise ValueError("no partition for this key")
        return 0

    producer = pk.SyncProducer("memory://", topic="t", partitions=4, partitioner=partitioner)
    producer.produce(b"first", key=b"good")  # the topic's partitions are known
    producer.produce(b"x", key=b"bad", nonblocking=True)
    producer.produce(b"after", key=b"good", nonblocking=True)
    with pytest.raises(pk.ProduceError, match="no partition for this key"):
        producer.flush(timeout=10)
    stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed, stats.in_flight) == (3, 2, 1, 0)
    producer.close()  # flush() reported the failure
