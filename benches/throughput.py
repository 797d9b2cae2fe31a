"""Throughput suite: producerkit and raw clients, one process, the same broker and messages.

    python benches/throughput.py [--messages 300000] [--repeat 3] [--json results/throughput.json]
    python benches/throughput.py --only defaults [--windows 2000,5000,10000] [--linger-ms 5]
    python benches/throughput.py --only memory
    python benches/throughput.py --only production [--messages 300000] [--repeat 5]
    python benches/throughput.py --only compression [--messages 200000] [--repeat 3]
        [--distinct-values 1000] [--value-bytes 512]
    python benches/throughput.py --only batch [--messages 300000] [--repeat 3]
    python benches/throughput.py --only peers [--messages 200000] [--repeat 3]
        [--peers-python ~/.venvs/peers313/bin/python] [--peer kafka-python --peer ...]
        [--kafka-broker tansu|apache|both] [--warmup 180]
    python benches/throughput.py --only jetstream-cluster [--messages 300000] [--repeat 3]

``--only defaults``: on Tansu null storage, producerkit at its true defaults, with
``preset="throughput"`` alone, and with larger windows (with and without the preset), against
confluent-kafka at librdkafka's defaults and at linger 0; the ratios to confluent-kafka are per
round, and the table gives each runner's best round and the median ratio.
``--only memory``: what one record in flight costs producerkit (tracemalloc), on Kafka with the
acks held back by a paused proxy.
``--only production``: what the production features cost on Kafka (Tansu null storage) and
JetStream, against the same producer publishing bytes with none of them, rounds interleaved and
rotated, median ratios: a JSON value serializer (dicts in), ProducerMetrics at its defaults,
``on_delivery`` with a context per message, ``propagate_trace`` inside a span; and the plain run
twice, so the noise between two identical runners shows. The plain run sends one shared 512-byte
value, so the JSON one is also set beside its own values serialized before the run (a distinct
object per message, as a serializer makes them): what the serializer itself costs. Bytes and
JSON dicts also go through ``produce_batch`` (chunks of ``BATCH_CHUNK``), set beside each other.
``--only compression``: each codec (gzip, snappy, lz4, zstd) on Tansu null storage, producerkit
(the throughput settings at its own batch size for the codec: 512 KiB, and for zstd
librdkafka's 1,000,000 bytes; and again at the 256 KiB of the uncompressed runs) beside
confluent-kafka (librdkafka's defaults) with the same ``compression.type``, on values that
compress about as well as JSON does (hex text): ``--distinct-values`` of them (1,000 by
default: 512 KiB of text, so a 1,000,000-byte batch sees each value about twice; 20,000 for
values that never repeat within a batch). And producerkit at its defaults (no preset, the
default window and batch size) with each codec, beside the same confluent-kafka runs.

``--only batch``: what one message costs on each path, rounds interleaved and rotated. On Tansu
null storage: ``produce()`` at producerkit's defaults and with ``preset="throughput"``,
``produce_batch`` (chunks of ``BATCH_CHUNK`` messages, as lists of bytes and as Arrow arrays)
with ``preset="throughput"``, beside confluent-kafka's produce loop at librdkafka's defaults; on
``null://`` (10,000 in flight): ``produce()`` and ``produce_batch`` beside the floor (a loop
awaiting a method that hashes each key with xxhash). Best msg/s and µs per message per runner,
and the median over rounds of the ratio to the peer in the same round.

``--only peers``: client CPU per message, the headline figure (it holds on a machine with
more cores; wall-clock ratios against a peer on two shared cores do not). Every runner is run
by ``benches/_peers.py`` in a fresh process of its own, rounds interleaved and rotated, keyed
512-byte values: producerkit (``produce()`` at its defaults, with ``preset="throughput"`` alone
and with the throughput settings, ``produce_batch`` with the last two) and each peer at its
own defaults (confluent-kafka's ``produce()``, ``produce_batch`` and asyncio ``AIOProducer``,
kafka-python 3, aiokafka's loop, and the Java producer, kafka-clients in a JVM of its own, at
its defaults and with ``JAVA_THROUGHPUT_SETTINGS``
(``benches/_java.py``: built at bench time, needs a JDK 17+ and Maven the first time; warmed up
until its JIT settled, its CPU over its timed pass, every thread of the JVM); nats-py's
``publish_async``, and the fast publishers of nats-jetstream-extra and of natsio with
natsio-jetstream-batch, which need Python 3.13: ``--peers-python`` names the interpreter of
a venv that has them). Kafka on Tansu with null storage, a new 4-partition topic per run;
JetStream on a new file-storage stream per run that allows fast batches. ``--kafka-broker
apache`` runs the Kafka rows on one Apache Kafka node instead (its JVM with the flags of Kafka's
own start script, full tiered compilation, warmed up for ``--warmup`` seconds before the first
round: ``benches/_brokers.py``), ``both`` on each of the two, rounds interleaved (the Apache
rows named ``kafka on apache: ...``). For each run: msg/s,
the client process's CPU per message over the timed part (all its threads: librdkafka's,
kafka-python's sender), the broker process's (psutil; only for a broker started here), and the
client's cores (CPU seconds per second); the table gives medians and ranges, then the issue's
targets as medians of per-round ratios. A peer that is not installed is skipped, saying why.

``--only jetstream-cluster``: JetStream as it runs in production beside one server: producerkit
(``produce()`` at its defaults: fast batches) and nats-py's ``publish_async``, the rows of
``--only peers``, each in a process of its own, rounds interleaved and rotated, on a new file
stream per run that allows fast batches: R1 on one nats-server, and R3 on three nats-servers
routed as one cluster (``producerkit.testing.JetStreamCluster``, started here; each client is
given all three and connects to one, not always the stream's leader). msg/s and client CPU per
message (the one server's CPU too; the cluster's is three processes and is not measured), and
per round the ratios producerkit / nats-py and cluster / one server.

Brokers are started here from the installed wheels: Tansu with ``null://`` storage (the protocol
path only, as in seed 004) and with memory storage, and nats-server with JetStream (memory
storage). Every runner publishes the same 512-byte values with keys (and once keyless), as fast
as it can, and counts only acknowledged messages. Each cell is the best of ``--repeat`` runs,
runners interleaved, because this machine is shared and noisy: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Final

import _brokers
import _java
from _peers import Clock

import producerkit as pk
from producerkit.testing.brokers import create_kafka_topic

VALUE = b"x" * 512
#: producerkit's settings on Kafka here, next to librdkafka's defaults that confluent-kafka runs
#: with: up to 100,000 messages queued, linger 5 ms, 1,000,000 requests in flight per connection.
#: producerkit's defaults (1000 in flight, no linger, one batch per partition in flight) are for
#: latency and strict order; its throughput preset is 5 batches per partition, no linger.
#: The window and batch size were chosen by interleaved runs (docs/tuning.md): every record in
#: flight is a cache miss when its ack comes back, so more than the broker's pace needs costs CPU.
KAFKA_SETTINGS: dict[str, Any] = {
    "max_in_flight_messages": 15_000,
    "preset": "throughput",
    "max_batch_size": 256 * 1024,
}
#: The Java producer's throughput settings beside producerkit's (``KAFKA_SETTINGS``): the same
#: batch size, no compression (neither compresses), and the Java client's default linger (5 ms;
#: 0 and 20 measured no better, docs/performance.md). Its other defaults are producerkit's too:
#: idempotent, acks all, 5 batches in flight (per connection); its window is its 32 MB
#: ``buffer.memory``.
JAVA_THROUGHPUT_SETTINGS: dict[str, Any] = {
    "batch.size": KAFKA_SETTINGS["max_batch_size"],
    "linger.ms": 5,
}
Messages = list[tuple[bytes | None, bytes]]


def make_messages(count: int, keyed: bool) -> Messages:
    return [(b"user-%d" % (i % 10_000) if keyed else None, VALUE) for i in range(count)]


# --------------------------------------------------------------------------- producerkit


async def producerkit_run(url: str, topic: str, messages: Messages, **options: Any) -> int:
    async with pk.Producer(url, topic=topic, **options) as producer:
        await producer.produce(b"warm-up", key=b"warm-up")
        clock = Clock()
        produce = producer.produce
        for key, value in messages:
            await produce(value, key=key, nonblocking=True)
        await producer.flush()
        rate = clock.stop(len(messages))
        assert producer.stats.acked == len(messages) + 1, producer.stats
    return rate


async def trivial_produce_floor(url: str, topic: str, messages: Messages) -> int:
    """The issue's floor for our own overhead: an async produce that hashes the key with xxhash
    and does nothing else, called the same way (keyword arguments, awaited) in the same loop."""
    from xxhash import xxh3_64_intdigest

    async def produce(value: bytes, *, key: bytes | None = None, nonblocking: bool = False) -> None:
        if key is not None:
            xxh3_64_intdigest(key) % 12

    started = time.perf_counter()
    for key, value in messages:
        await produce(value, key=key, nonblocking=True)
    return _rate(len(messages), time.perf_counter() - started)


#: How many messages one ``produce_batch`` call takes in ``--only batch`` (Spark's Arrow batches
#: are as long by default: ``spark.sql.execution.arrow.maxRecordsPerBatch``).
BATCH_CHUNK = 10_000


def batch_chunks(messages: Messages, arrow: bool = False) -> list[tuple[Any, Any]]:
    """``messages`` as (values, keys) columns of ``BATCH_CHUNK`` messages each: lists of bytes,
    or Arrow binary arrays (made here, before any timing)."""
    chunks: list[tuple[Any, Any]] = []
    for start in range(0, len(messages), BATCH_CHUNK):
        part = messages[start : start + BATCH_CHUNK]
        values, keys = [value for _, value in part], [key for key, _ in part]
        if arrow:
            import pyarrow as pa

            chunks.append((pa.array(values, pa.binary()), pa.array(keys, pa.binary())))
        else:
            chunks.append((values, keys))
    return chunks


async def producerkit_batch_run(
    url: str, topic: str, chunks: list[tuple[Any, Any]], **options: Any
) -> int:
    """:func:`producerkit_run` with one ``produce_batch(values, keys=keys)`` per chunk."""
    count = sum(len(values) for values, _ in chunks)
    async with pk.Producer(url, topic=topic, **options) as producer:
        await producer.produce(b"warm-up", key=b"warm-up")
        clock = Clock()
        produce_batch = producer.produce_batch
        for values, keys in chunks:
            await produce_batch(values, keys=keys)
        await producer.flush()
        rate = clock.stop(count)
        assert producer.stats.acked == count + 1, producer.stats
    return rate


def on_public_path(run: Runner) -> Runner:
    """The same run with PRODUCERKIT_CLIENT_PATH=public: aiokafka's and nats-py's public API
    only, as with a client release whose internals the adapters do not recognise."""

    async def runner() -> int:
        os.environ["PRODUCERKIT_CLIENT_PATH"] = "public"
        try:
            return await run()
        finally:
            del os.environ["PRODUCERKIT_CLIENT_PATH"]

    return runner


# --------------------------------------------------------------------------- Kafka peers


async def aiokafka_send_loop(url: str, topic: str, messages: Messages) -> int:
    """The obvious aiokafka loop: ``await send()`` per message (one future each), then flush."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=_servers(url), linger_ms=0, acks=1)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"warm-up", key=b"warm-up")
        clock = Clock()
        futures = [await producer.send(topic, value, key=key) for key, value in messages]
        await producer.flush()
        rate = clock.stop(len(messages))
        assert all(future.done() and future.exception() is None for future in futures)
    finally:
        await producer.stop()
    return rate


async def aiokafka_batches_by_hand(url: str, topic: str, messages: Messages) -> int:
    """aiokafka's create_batch/send_batch, batches built per partition by hand (murmur2 keys)."""
    from aiokafka import AIOKafkaProducer

    from producerkit.partitioners import murmur2

    producer = AIOKafkaProducer(
        bootstrap_servers=_servers(url), linger_ms=0, acks=1, max_batch_size=1 << 20
    )
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"warm-up", key=b"warm-up")
        partitions = len(await producer.partitions_for(topic))
        started = time.perf_counter()
        builders: dict[int, Any] = {}
        results = []
        for index, (key, value) in enumerate(messages):
            partition = murmur2(key, partitions) if key is not None else index % partitions
            builder = builders.get(partition)
            if builder is None:
                builder = builders[partition] = producer.create_batch()
            if builder.append(key=key, value=value, timestamp=None) is None:
                builder.close()
                results.append(await producer.send_batch(builder, topic, partition=partition))
                builder = builders[partition] = producer.create_batch()
                builder.append(key=key, value=value, timestamp=None)
        for partition, builder in builders.items():
            builder.close()
            results.append(await producer.send_batch(builder, topic, partition=partition))
        await asyncio.gather(*results)
        elapsed = time.perf_counter() - started
    finally:
        await producer.stop()
    return _rate(len(messages), elapsed)


async def confluent_kafka(url: str, topic: str, messages: Messages, **settings: Any) -> int:
    """librdkafka through confluent-kafka at its defaults (linger 5 ms, acks all) and
    ``settings`` (``{"linger.ms": 0}``): produce() with a delivery callback, poll, flush."""
    from confluent_kafka import Producer

    delivered = failed = 0

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal delivered, failed
        if err is None:
            delivered += 1
        else:
            failed += 1

    producer = Producer({"bootstrap.servers": _servers(url), **settings})
    producer.produce(topic, b"warm-up", key=b"warm-up")
    producer.flush(30)
    delivered = 0
    clock = Clock()
    produce, poll = producer.produce, producer.poll
    for key, value in messages:
        while True:
            try:
                produce(topic, value, key, on_delivery=on_delivery)
                break
            except BufferError:
                poll(0.001)
        poll(0)
    producer.flush(60)
    rate = clock.stop(len(messages))
    assert delivered == len(messages) and failed == 0, (delivered, failed)
    return rate


async def confluent_kafka_batch(url: str, topic: str, messages: Messages) -> int:
    """confluent-kafka's ``produce_batch`` at librdkafka's defaults: lists of ``BATCH_CHUNK``
    message dicts (made before the clock, as producerkit's columns are), one delivery callback;
    the messages a full queue refused (marked ``_error``) go again after a poll."""
    from confluent_kafka import Producer

    delivered = failed = 0

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal delivered, failed
        if err is None:
            delivered += 1
        else:
            failed += 1

    chunks = [
        [{"key": key, "value": value} for key, value in messages[start : start + BATCH_CHUNK]]
        for start in range(0, len(messages), BATCH_CHUNK)
    ]
    producer = Producer({"bootstrap.servers": _servers(url)})
    producer.produce(topic, b"warm-up", key=b"warm-up")
    producer.flush(30)
    clock = Clock()
    produce_batch, poll = producer.produce_batch, producer.poll
    for chunk in chunks:
        while produce_batch(topic, chunk, on_delivery=on_delivery) < len(chunk):
            chunk = [message for message in chunk if message.pop("_error", None) is not None]
            poll(0.001)
        poll(0)
    producer.flush(60)
    rate = clock.stop(len(messages))
    assert delivered == len(messages) and failed == 0, (delivered, failed)
    return rate


async def confluent_aio(url: str, topic: str, messages: Messages) -> int:
    """confluent-kafka's asyncio producer (``confluent_kafka.aio.AIOProducer``, 2.13+) at its
    defaults (4 worker threads, batches of 1,000 handed to librdkafka, librdkafka's defaults):
    ``await produce()`` per message (a delivery future each), flush, then the futures."""
    from confluent_kafka.aio import AIOProducer

    producer = AIOProducer({"bootstrap.servers": _servers(url)})
    try:
        warm_up = await producer.produce(topic, b"warm-up", key=b"warm-up")
        await producer.flush()
        await warm_up
        clock = Clock()
        produce = producer.produce
        futures = [await produce(topic, value, key) for key, value in messages]
        await producer.flush()
        await asyncio.gather(*futures)
        rate = clock.stop(len(messages))
    finally:
        await producer.close()
    return rate


async def kafka_python(url: str, topic: str, messages: Messages) -> int:
    """kafka-python 3 at its defaults (idempotent, acks all, linger 0, 5 requests in flight,
    its own sender thread): ``send()`` per message (a future each), then ``flush()``."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=_servers(url))
    try:
        producer.send(topic, b"warm-up", key=b"warm-up").get(30)
        clock = Clock()
        send = producer.send
        futures = [send(topic, value, key=key) for key, value in messages]
        producer.flush()
        rate = clock.stop(len(messages))
        assert all(future.succeeded() for future in futures)
    finally:
        producer.close()
    return rate


def java_producer(
    settings: dict[str, Any] | None = None,
) -> Callable[[str, str, Messages], Coroutine[Any, Any, int]]:
    """The Java producer (kafka-clients, in a JVM of its own: ``benches/_java.py``) with
    ``settings`` over its defaults, as a runner: it sends as many messages as it is given,
    keyed as they are (it makes the same ones itself), and leaves its JVM's figures in
    ``Clock.last``."""

    async def run(url: str, topic: str, messages: Messages) -> int:
        return await _java.java_producer(_servers(url), topic, len(messages), settings)

    return run


# --------------------------------------------------------------------------- NATS peers


async def nats_publish_async(url: str, topic: str, messages: Messages) -> int:
    """nats-py's own pipelined JetStream publish: ``js.publish_async`` futures, then gather."""
    import nats

    nc = await nats.connect(_nats_servers(url))
    try:
        js = nc.jetstream()
        clock = Clock()
        futures = [await js.publish_async(topic, value) for _, value in messages]
        await asyncio.gather(*futures)
        rate = clock.stop(len(messages))
    finally:
        await nc.close()
    return rate


async def nats_task_per_message(url: str, topic: str, messages: Messages) -> int:
    """The obvious nonblocking design: one task per ``js.publish``, at most 1000 at once."""
    import nats

    nc = await nats.connect(_nats(url))
    try:
        js = nc.jetstream()
        slots = asyncio.Semaphore(1000)

        async def publish(value: bytes) -> None:
            try:
                await js.publish(topic, value)
            finally:
                slots.release()

        started = time.perf_counter()
        tasks = []
        for _, value in messages:
            await slots.acquire()
            tasks.append(asyncio.create_task(publish(value)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
    finally:
        await nc.close()
    return _rate(len(messages), elapsed)


async def nats_core_publish(url: str, topic: str, messages: Messages) -> int:
    """Core NATS publish with no ack at all, then one flush: the wire's ceiling for reference."""
    import nats

    nc = await nats.connect(_nats(url))
    try:
        started = time.perf_counter()
        for _, value in messages:
            await nc.publish(topic, value)
        await nc.flush(30)
        elapsed = time.perf_counter() - started
    finally:
        await nc.close()
    return _rate(len(messages), elapsed)


# --------------------------------------------------------------------------- the suite


def _servers(url: str) -> str:
    return url.split("://", 1)[1]


def _nats(url: str) -> str:
    return "nats://" + _servers(url)


def _nats_servers(url: str) -> list[str]:
    """Each server of ``url`` (one, or a cluster's: ``jetstream://h:p1,h:p2``) for nats-py,
    which takes a cluster's as a list."""
    return [f"nats://{server}" for server in _servers(url).split(",")]


def _rate(count: int, elapsed: float) -> int:
    return round(count / elapsed)


Runner = Callable[[], Coroutine[Any, Any, int]]


#: The runners that raised (see :func:`best_of`): main() exits 1 if there is any.
FAILED_RUNNERS: list[str] = []


def best_of(runners: dict[str, Runner], repeat: int) -> dict[str, int]:
    """Run every runner ``repeat`` times, interleaved, and keep each one's best rate. A runner
    that raises is reported and left out, the others go on; the exit code is then 1."""
    best: dict[str, int] = {}
    for round_number in range(repeat):
        for name, runner in runners.items():
            try:
                rate = asyncio.run(runner())
            except Exception as exc:  # the rest of the table is still worth having
                print(f"  {name}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                FAILED_RUNNERS.append(name)
                continue
            best[name] = max(best.get(name, 0), rate)
            print(f"  round {round_number + 1} {name:<44} {rate:>10,} msg/s", flush=True)
    return best


async def delete_topic(url: str, topic: str) -> None:
    await _admin(url, "delete_topics", [topic])


async def _admin(url: str, request: str, *args: Any) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=_servers(url))
    await admin.start()
    try:
        await getattr(admin, request)(*args)
    finally:
        await admin.close()


def kafka_runners(url: str, count: int, tag: str) -> dict[str, Runner]:
    keyed, keyless = make_messages(count, True), make_messages(count, False)

    def on_new_topic(name: str, run: Callable[[str], Awaitable[int]]) -> Runner:
        return on_new_topic_of(url, f"{tag}-{name}", run)

    window = KAFKA_SETTINGS  # see its comment, and docs/tuning.md
    return {
        "producerkit kafka keyed": on_new_topic(
            "pk", lambda topic: producerkit_run(url, topic, keyed, **window)
        ),
        "producerkit kafka keyless": on_new_topic(
            "pkl", lambda topic: producerkit_run(url, topic, keyless, **window)
        ),
        "producerkit kafka keyed connections=2": on_new_topic(
            "pk2", lambda topic: producerkit_run(url, topic, keyed, connections=2, **window)
        ),
        "producerkit kafka keyed, public path": on_public_path(
            on_new_topic("pkp", lambda topic: producerkit_run(url, topic, keyed, **window))
        ),
        "aiokafka send() loop": on_new_topic(
            "ak", lambda topic: aiokafka_send_loop(url, topic, keyed)
        ),
        "aiokafka batches by hand": on_new_topic(
            "akb", lambda topic: aiokafka_batches_by_hand(url, topic, keyed)
        ),
        "confluent-kafka": on_new_topic("ck", lambda topic: confluent_kafka(url, topic, keyed)),
    }


def on_new_topic_of(url: str, tag: str, run: Callable[[str], Awaitable[int]]) -> Runner:
    """Each run publishes to a topic of its own, deleted afterwards: Tansu's memory storage
    keeps every record, and a broker holding the earlier runs' gigabytes slowed every later
    runner (a round-by-round drift that decided the ratios)."""

    async def runner() -> int:
        topic = f"{tag}-{time.monotonic_ns()}"
        await create_kafka_topic(url, topic, 4)
        try:
            return await run(topic)
        finally:
            await delete_topic(url, topic)

    return runner


#: The peer the defaults are held to, and its linger-0 twin.
CONFLUENT_DEFAULTS, CONFLUENT_LINGER_0 = (
    "confluent-kafka (librdkafka defaults)",
    "confluent linger 0",
)


def defaults_runners(
    url: str, count: int, windows: list[int], linger_ms: int | None = None
) -> dict[str, Runner]:
    """producerkit's defaults, the throughput preset alone, and larger windows with and without
    it (and with it and ``linger_ms``, if given), beside confluent-kafka at librdkafka's
    defaults and at linger 0: keyed messages."""
    keyed = make_messages(count, True)

    def producerkit_with(tag: str, **settings: Any) -> Runner:
        return on_new_topic_of(
            url, tag, lambda topic: producerkit_run(url, topic, keyed, **settings)
        )

    runners = {
        "producerkit defaults": producerkit_with("d"),
        'producerkit preset="throughput"': producerkit_with("p", preset="throughput"),
    }
    for window in windows:
        runners[f"producerkit window {window}"] = producerkit_with(
            f"w{window}", max_in_flight_messages=window
        )
        runners[f"producerkit window {window} + preset"] = producerkit_with(
            f"wp{window}", max_in_flight_messages=window, preset="throughput"
        )
        if linger_ms is not None:
            runners[f"producerkit window {window} + preset, linger {linger_ms} ms"] = (
                producerkit_with(
                    f"wpl{window}",
                    max_in_flight_messages=window,
                    preset="throughput",
                    linger_ms=linger_ms,
                )
            )
    runners[CONFLUENT_DEFAULTS] = on_new_topic_of(
        url, "ck", lambda topic: confluent_kafka(url, topic, keyed)
    )
    runners[CONFLUENT_LINGER_0] = on_new_topic_of(
        url, "ck0", lambda topic: confluent_kafka(url, topic, keyed, **{"linger.ms": 0})
    )
    return runners


def with_cpu(name: str, run: Runner, cpu: dict[str, list[float]]) -> Runner:
    """``run``, and its client CPU per message (µs, from its ``Clock``) appended to
    ``cpu[name]``."""

    async def runner() -> int:
        rate = await run()
        cpu.setdefault(name, []).append(Clock.last["client_cpu"] / Clock.last["messages"] * 1e6)
        return rate

    return runner


def rounds_of(runners: dict[str, Runner], repeat: int) -> list[dict[str, int]]:
    """Every runner once per round, ``repeat`` rounds, the order rotated each round."""
    names = list(runners)
    rounds = []
    for number in range(repeat):
        shift = number % len(names)
        rates: dict[str, int] = {}
        for name in names[shift:] + names[:shift]:
            rates[name] = asyncio.run(runners[name]())
            print(f"  round {number + 1} {name:<44} {rates[name]:>10,} msg/s", flush=True)
        rounds.append(rates)
    return rounds


def median_ratio(rounds: list[dict[str, int]], name: str, peer: str) -> float:
    """The median over rounds of ``name``'s rate over ``peer``'s in the same round."""
    return statistics.median(one[name] / one[peer] for one in rounds)


def save_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(f"\nsaved {path}")


def defaults_table(rounds: list[dict[str, int]]) -> list[dict[str, Any]]:
    """Per runner: its best rate, and the median over rounds of its rate over each confluent
    run's in the same round."""
    rows = []
    for name in rounds[0]:
        row: dict[str, Any] = {"runner": name, "best": max(r[name] for r in rounds)}
        for peer, label in ((CONFLUENT_DEFAULTS, "vs_defaults"), (CONFLUENT_LINGER_0, "vs_l0")):
            row[label] = median_ratio(rounds, name, peer)
            row[label + "_best"] = row["best"] / max(r[peer] for r in rounds)
        rows.append(row)
    return rows


async def in_flight_memory(url: str, count: int, window: int) -> dict[str, float]:
    """Bytes producerkit holds per record in flight (tracemalloc), 512-byte values made before
    the baseline: ``count`` records produced while a paused proxy holds every ack back."""
    import tracemalloc

    from producerkit.testing.proxy import FaultProxy

    topic = f"memory-{time.monotonic_ns()}"
    await create_kafka_topic(url, topic, 4)
    values = [os.urandom(len(VALUE)) for _ in range(count)]
    keys = [b"user-%d" % (i % 10_000) for i in range(count)]
    with FaultProxy.for_url(url, 0) as proxy:
        async with pk.Producer(
            proxy.url, topic=topic, max_in_flight_messages=window, preset="throughput"
        ) as producer:
            await producer.produce(b"warm-up", key=b"warm-up")
            tracemalloc.start()
            proxy.pause()
            before = tracemalloc.get_traced_memory()[0]
            for key, value in zip(keys, values, strict=True):
                await producer.produce(value, key=key, nonblocking=True)
            await asyncio.sleep(0.2)  # the batches are built and written to the socket
            held = tracemalloc.get_traced_memory()[0] - before
            in_flight = producer.stats.in_flight
            tracemalloc.stop()
            proxy.resume()
            await producer.flush()
    await delete_topic(url, topic)
    return {
        "records_in_flight": in_flight,
        "bytes_per_record": held / in_flight,
        "value_bytes": len(VALUE),
    }


#: How long the bench's own stream requests (create, purge, delete: set-up and clean-up, not
#: what is measured) wait for the server's answer. nats-py's default is 5 s, and a suite run
#: beside Spark and Kafka tests saw a one-server stream's delete take longer.
STREAM_ADMIN_TIMEOUT: Final = 30.0


async def purge_streams(url: str, subject: str = "bench") -> None:
    """Empty the JetStream stream that stores ``subject`` (the bench's own: a server named by
    ``--nats-url`` may hold others)."""
    import nats

    nc = await nats.connect(_nats(url))
    try:
        name = await nc.jetstream(timeout=STREAM_ADMIN_TIMEOUT).find_stream_name_by_subject(subject)
        await nc.jsm(timeout=STREAM_ADMIN_TIMEOUT).purge_stream(name)
    finally:
        await nc.close()


def nats_runners(url: str, count: int) -> dict[str, Runner]:
    keyed, keyless = make_messages(count, True), make_messages(count, False)

    def on_empty_stream(run: Runner) -> Runner:
        """Each run starts on an empty stream, as each Kafka run gets its own topic: the memory
        stream kept every earlier run's messages (about 2 GB by round 5), and the later runners
        paid for it (producerkit keyed fell from 84k to 49k msg/s over three rounds)."""

        async def runner() -> int:
            try:
                return await run()
            finally:
                await purge_streams(url)

        return runner

    return {
        "producerkit jetstream keyed": on_empty_stream(
            lambda: producerkit_run(url, "bench", keyed)
        ),
        "producerkit jetstream keyless": on_empty_stream(
            lambda: producerkit_run(url, "bench", keyless)
        ),
        "producerkit jetstream connections=2": on_empty_stream(
            lambda: producerkit_run(url, "bench", keyed, connections=2)
        ),
        "producerkit jetstream keyed, public path": on_public_path(
            on_empty_stream(lambda: producerkit_run(url, "bench", keyed))
        ),
        "producerkit nats keyed (core)": lambda: producerkit_run(_nats(url), "bench", keyed),
        "producerkit nats keyed (core), public path": on_public_path(
            lambda: producerkit_run(_nats(url), "bench", keyed)
        ),
        "nats-py publish_async": on_empty_stream(lambda: nats_publish_async(url, "bench", keyed)),
        "task per message (1000 slots)": on_empty_stream(
            lambda: nats_task_per_message(url, "bench", keyed)
        ),
        "core NATS publish, no ack": lambda: nats_core_publish(url, "bench", keyed),
    }


def null_runners(count: int) -> dict[str, Runner]:
    keyed, keyless = make_messages(count, True), make_messages(count, False)
    return {
        "floor: trivial async produce with xxhash": lambda: trivial_produce_floor(
            "", "bench", keyed
        ),
        "producerkit null:// keyed": lambda: producerkit_run(
            "null://?partitions=12", "bench", keyed, max_in_flight_messages=10_000
        ),
        "producerkit null:// keyless": lambda: producerkit_run(
            "null://?partitions=12", "bench", keyless, max_in_flight_messages=10_000
        ),
    }


def ratios(results: dict[str, dict[str, int]]) -> list[tuple[str, float, float]]:
    """(claim, measured ratio, target) for the issue's three targets and their companions."""
    out = []
    for storage in ("tansu null", "tansu memory"):
        table = results.get(storage, {})
        pk_rate = table.get("producerkit kafka keyed", 0)
        if table.get("confluent-kafka"):
            out.append(
                (
                    f"{storage}: producerkit / confluent-kafka",
                    pk_rate / table["confluent-kafka"],
                    1.3,
                )
            )
        if table.get("aiokafka send() loop"):
            out.append(
                (
                    f"{storage}: producerkit / aiokafka send loop",
                    pk_rate / table["aiokafka send() loop"],
                    4.0,
                )
            )
    table = results.get("jetstream memory", {})
    pk_rate = table.get("producerkit jetstream keyed", 0)
    if table.get("nats-py publish_async"):
        out.append(
            (
                "jetstream: producerkit / nats-py publish_async",
                pk_rate / table["nats-py publish_async"],
                2.0,
            )
        )
    if table.get("task per message (1000 slots)"):
        out.append(
            (
                "jetstream: producerkit / task per message",
                pk_rate / table["task per message (1000 slots)"],
                6.0,
            )
        )
    for storage, fast, public in (
        ("tansu null", "producerkit kafka keyed", "producerkit kafka keyed, public path"),
        ("tansu memory", "producerkit kafka keyed", "producerkit kafka keyed, public path"),
        (
            "jetstream memory",
            "producerkit jetstream keyed",
            "producerkit jetstream keyed, public path",
        ),
        (
            "jetstream memory",
            "producerkit nats keyed (core)",
            "producerkit nats keyed (core), public path",
        ),
    ):
        table = results.get(storage, {})
        if table.get(fast) and table.get(public):
            # What a client release beyond the bounds costs: informational, no target.
            out.append((f"{storage}: {public} / fast path", table[public] / table[fast], 0.0))
    null_rate = results.get("null", {}).get("producerkit null:// keyed", 0)
    out.append(("null://: msg/s (target 1,000,000)", null_rate / 1_000_000, 1.0))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--only",
        choices=[
            "null",
            "kafka",
            "jetstream",
            "defaults",
            "memory",
            "production",
            "compression",
            "batch",
            "peers",
            "jetstream-cluster",
        ],
        action="append",
    )
    parser.add_argument(
        "--windows", default="2000,5000,10000", type=lambda t: [int(x) for x in t.split(",")]
    )
    parser.add_argument(
        "--linger-ms", type=int, help="--only defaults: also each window + preset with this linger"
    )
    parser.add_argument(
        "--distinct-values", type=int, default=1000, help="--only compression: how many values"
    )
    parser.add_argument(
        "--value-bytes",
        type=int,
        default=512,
        help="--only compression: each value's size (hex text)",
    )
    parser.add_argument(
        "--peer",
        action="append",
        metavar="TEXT",
        help="--only peers: only the runners whose name has TEXT in it (repeatable)",
    )
    parser.add_argument(
        "--no-java",
        action="store_true",
        help="--only peers: leave out the Java producer's rows (a JVM started and warmed up "
        "for each run takes seconds)",
    )
    parser.add_argument(
        "--peers-python",
        metavar="PYTHON",
        help="--only peers: the Python 3.13+ interpreter that runs the JetStream fast "
        "publishers that need it (default: $PRODUCERKIT_PEERS_PYTHON; without either they are "
        "skipped)",
    )
    parser.add_argument("--json", type=Path, default=Path("results/throughput.json"))
    _brokers.add_broker_flags(parser)
    _brokers.add_kafka_broker_choice(parser)
    args = parser.parse_args(argv)
    only = set(args.only or ["null", "kafka", "jetstream"])
    if args.kafka_broker != "tansu" and only != {"peers"}:
        parser.error("--kafka-broker apache or both: with --only peers alone")
    # Each of these runs a table of its own and returns: two of them would run only the first.
    tables = sorted(
        only & {"production", "compression", "batch", "peers", "jetstream-cluster"}
        | ({"defaults/memory"} if only & {"defaults", "memory"} else set())
    )
    plain = sorted(only & {"null", "kafka", "jetstream"})
    if len(tables) > 1 or (tables and plain):
        parser.error(
            f"--only {' and '.join(tables + plain)}: {' or '.join(tables)} runs alone "
            "(a table of its own); null, kafka and jetstream go together"
        )
    from producerkit._fast import SPEEDUPS
    from producerkit.backends.kafka import wire

    print(f"producerkit C speedups: core {SPEEDUPS}, Kafka wire {wire.SPEEDUPS}", flush=True)
    if only & {"defaults", "memory"}:
        return defaults_main(args, only)
    if "production" in only:
        return production_main(args)
    if "compression" in only:
        return compression_main(args)
    if "batch" in only:
        return batch_main(args)
    if "peers" in only:
        return peers_main(args)
    if "jetstream-cluster" in only:
        return jetstream_cluster_main(args)
    results: dict[str, dict[str, int]] = {}
    if "null" in only:
        print("null:// (no I/O: producerkit's own overhead)", flush=True)
        results["null"] = best_of(null_runners(args.messages * 3), args.repeat)
    if "kafka" in only:
        storages = (("tansu null", "null://sink"), ("tansu memory", "memory://tansu/"))
        if args.kafka_url:
            storages = (("kafka given", ""),)
        for storage, engine in storages:
            with _brokers.kafka(args.kafka_url, storage=engine) as kafka:
                print(f"Kafka: {storage} storage at {kafka.kafka_url}", flush=True)
                results[storage] = best_of(
                    kafka_runners(kafka.kafka_url, args.messages, storage.split()[1]), args.repeat
                )
    if "jetstream" in only:
        with _brokers.nats(args.nats_url) as nats:
            asyncio.run(create_stream(nats.jetstream_url))
            print(f"JetStream (memory storage) at {nats.jetstream_url}", flush=True)
            results["jetstream memory"] = best_of(
                nats_runners(nats.jetstream_url, args.messages // 2), args.repeat
            )

    print(f"\n{'broker':<18} {'runner':<44} {'msg/s':>12}")
    for broker, table in results.items():
        for name, rate in sorted(table.items(), key=lambda item: -item[1]):
            print(f"{broker:<18} {name:<44} {rate:>12,}")
    print(f"\n{'ratio':<72} {'measured':>9} {'target':>7}")
    claims = ratios(results)
    for claim, measured, target in claims:
        verdict = "" if not target else "met" if measured >= target else "NOT met"
        wanted = f"{target:.1f}x" if target else "-"
        print(f"{claim:<72} {measured:>8.2f}x {wanted:>7}  {verdict}")
    null_table = results.get("null", {})
    floor = null_table.get("floor: trivial async produce with xxhash")
    keyed_null = null_table.get("producerkit null:// keyed")
    if floor and keyed_null:
        overhead_ns = 1e9 / keyed_null - 1e9 / floor
        per_message = 1e9 / keyed_null
        print(f"null:// keyed: {per_message:.0f} ns/message, {overhead_ns:.0f} beyond the floor")
    if FAILED_RUNNERS:
        print(f"\nfailed: {', '.join(sorted(set(FAILED_RUNNERS)))}", file=sys.stderr)
    save_report(
        args.json,
        {
            "messages": args.messages,
            "repeat": args.repeat,
            "value_bytes": len(VALUE),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "speedups": SPEEDUPS,
            "wire_speedups": wire.SPEEDUPS,
            "kafka_settings": KAFKA_SETTINGS,
            "results": results,
            "ratios": [{"claim": c, "measured": m, "target": t} for c, m, t in claims],
            "failed_runners": sorted(set(FAILED_RUNNERS)),
        },
    )
    return 1 if FAILED_RUNNERS else 0


async def create_stream(url: str) -> None:
    """The memory stream of subject ``bench`` (the JetStream runners' topic), if there is none."""
    async with pk.Producer(url, topic="bench", create_stream=True) as producer:
        await producer.produce(b"create")


def defaults_main(args: argparse.Namespace, only: set[str]) -> int:
    """``--only defaults`` and ``--only memory``: see the module docstring."""
    report: dict[str, Any] = {"messages": args.messages, "repeat": args.repeat}
    with _brokers.kafka(args.kafka_url, storage="null://sink") as kafka:
        url = kafka.kafka_url
        print(f"Kafka: tansu null storage at {url}", flush=True)
        if "memory" in only:
            for window in (1000, 10_000):
                cost = asyncio.run(in_flight_memory(url, window, window))
                report[f"in_flight_memory_{window}"] = cost
                print(
                    f"window {window}: {cost['records_in_flight']} records in flight, "
                    f"{cost['bytes_per_record']:,.0f} bytes each ({cost['value_bytes']}-byte "
                    "values)",
                    flush=True,
                )
        if "defaults" in only:
            runners = defaults_runners(url, args.messages, args.windows, args.linger_ms)
            rounds = rounds_of(runners, args.repeat)
            rows = defaults_table(rounds)
            report.update(rounds=rounds, table=rows)
            print(
                f"\n| runner | best msg/s | median ratio to {CONFLUENT_DEFAULTS} | best/best "
                f"| median ratio to {CONFLUENT_LINGER_0} |\n|---|---:|---:|---:|---:|"
            )
            for row in rows:
                print(
                    f"| {row['runner']} | {row['best']:,} | {row['vs_defaults']:.2f}x "
                    f"| {row['vs_defaults_best']:.2f}x | {row['vs_l0']:.2f}x |"
                )
    save_report(args.json, report)
    return 0


# --------------------------------------------------------------------------- compression

CODECS = ("gzip", "snappy", "lz4", "zstd")
#: The uncompressed runs' batch size (``KAFKA_SETTINGS``): the compression runs are also made
#: at it. Without ``max_batch_size``, producerkit's batches grow to 512 KiB, and with zstd to
#: librdkafka's ``batch.size`` (1,000,000 bytes), as confluent-kafka's do under load (1,883 of
#: these 530-byte messages, as its statistics show).
UNCOMPRESSED_BATCH_SIZE = KAFKA_SETTINGS["max_batch_size"]


def compression_main(args: argparse.Namespace) -> int:
    """``--only compression``: see the module docstring."""
    import random

    generator = random.Random(1)
    size = args.value_bytes
    values = [
        generator.randbytes((size + 1) // 2).hex().encode()[:size]
        for _ in range(args.distinct_values)
    ]
    messages = [(b"user-%d" % (i % 10_000), values[i % len(values)]) for i in range(args.messages)]
    report: dict[str, Any] = {
        "messages": args.messages,
        "repeat": args.repeat,
        "distinct_values": args.distinct_values,
        "value_bytes": size,
    }
    settings = {name: v for name, v in KAFKA_SETTINGS.items() if name != "max_batch_size"}
    with _brokers.kafka(args.kafka_url, storage="null://sink") as kafka:
        url = kafka.kafka_url
        runners: dict[str, Runner] = {}
        for codec in CODECS:
            runners[f"producerkit {codec}"] = on_new_topic_of(
                url,
                f"pk-{codec}",
                lambda topic, codec=codec: producerkit_run(
                    url, topic, messages, compression_type=codec, **settings
                ),
            )
            runners[f"producerkit {codec}, 256 KiB batches"] = on_new_topic_of(
                url,
                f"pk256-{codec}",
                lambda topic, codec=codec: producerkit_run(
                    url,
                    topic,
                    messages,
                    compression_type=codec,
                    **{**settings, "max_batch_size": UNCOMPRESSED_BATCH_SIZE},
                ),
            )
            runners[f"producerkit {codec}, defaults"] = on_new_topic_of(
                url,
                f"pkd-{codec}",
                lambda topic, codec=codec: producerkit_run(
                    url, topic, messages, compression_type=codec
                ),
            )
            runners[f"confluent-kafka {codec}"] = on_new_topic_of(
                url,
                f"ck-{codec}",
                lambda topic, codec=codec: confluent_kafka(
                    url, topic, messages, **{"compression.type": codec}
                ),
            )
        cpu: dict[str, list[float]] = {}
        rounds = rounds_of(
            {name: with_cpu(name, run, cpu) for name, run in runners.items()}, args.repeat
        )
    report["rounds"] = rounds
    report["client_us_per_message"] = cpu
    print(
        "\n| codec | producerkit msg/s | confluent-kafka msg/s | best / best | median ratio "
        "| producerkit at 256 KiB batches | best / best | median ratio "
        "| producerkit at its defaults | best / best | median ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for codec in CODECS:
        mine, theirs = f"producerkit {codec}", f"confluent-kafka {codec}"
        small = f"producerkit {codec}, 256 KiB batches"
        best_theirs = max(r[theirs] for r in rounds)

        def cells(name: str, theirs: str = theirs, best_theirs: int = best_theirs) -> list[str]:
            best = max(r[name] for r in rounds)
            median = median_ratio(rounds, name, theirs)
            return [f"{best:,}", f"{best / best_theirs:.2f}x", f"{median:.2f}x"]

        (best, *ratios), at_256k = cells(mine), cells(small)
        at_defaults = cells(f"producerkit {codec}, defaults")
        row = [codec, best, f"{best_theirs:,}", *ratios, *at_256k, *at_defaults]
        print("| " + " | ".join(row) + " |")
    print(
        "\nClient CPU per message (this process, librdkafka's threads included), µs, median "
        "(range), and its median ratio to confluent-kafka's with the codec in the same round:"
    )
    print("\n| runner | client µs/msg | / confluent-kafka |\n|---|---:|---:|")
    for name in runners:
        peer = f"confluent-kafka {name.split()[1].rstrip(',')}"
        ratio = statistics.median(a / b for a, b in zip(cpu[name], cpu[peer], strict=True))
        print(f"| {name} | {_spread(cpu[name], '{:.2f}')} | {ratio:.2f}x |")
    save_report(args.json, report)
    return 0


# --------------------------------------------------------------------------- batches

#: ``--only batch``: each runner's peer (the ratio's denominator) and the issue's target.
BATCH_PEERS: dict[str, tuple[str, float | None]] = {
    "kafka: produce() defaults": ("kafka: confluent-kafka (librdkafka defaults)", None),
    'kafka: produce() preset="throughput"': ("kafka: confluent-kafka (librdkafka defaults)", 2.0),
    'kafka: produce_batch lists, preset="throughput"': (
        "kafka: confluent-kafka (librdkafka defaults)",
        2.0,
    ),
    'kafka: produce_batch Arrow, preset="throughput"': (
        "kafka: confluent-kafka (librdkafka defaults)",
        2.0,
    ),
    "null://: produce() keyed": ("null://: floor, trivial async produce with xxhash", None),
    "null://: produce_batch lists": ("null://: floor, trivial async produce with xxhash", 1.5),
    "null://: produce_batch Arrow": ("null://: floor, trivial async produce with xxhash", 1.5),
}


def batch_runners(url: str, count: int) -> dict[str, Runner]:
    """The runners of ``--only batch`` (see the module docstring): keyed 512-byte messages."""
    keyed = make_messages(count, True)
    lists, arrays = batch_chunks(keyed), batch_chunks(keyed, arrow=True)
    preset: dict[str, Any] = {"preset": "throughput"}
    null_url, null_window = "null://?partitions=12", {"max_in_flight_messages": 10_000}
    null_count = count * 3
    null_keyed = make_messages(null_count, True)
    null_lists, null_arrays = batch_chunks(null_keyed), batch_chunks(null_keyed, arrow=True)

    def kafka(tag: str, run: Callable[[str], Awaitable[int]]) -> Runner:
        return on_new_topic_of(url, f"batch-{tag}", run)

    return {
        "kafka: produce() defaults": kafka("d", lambda t: producerkit_run(url, t, keyed)),
        'kafka: produce() preset="throughput"': kafka(
            "p", lambda t: producerkit_run(url, t, keyed, **preset)
        ),
        'kafka: produce_batch lists, preset="throughput"': kafka(
            "bl", lambda t: producerkit_batch_run(url, t, lists, **preset)
        ),
        'kafka: produce_batch Arrow, preset="throughput"': kafka(
            "ba", lambda t: producerkit_batch_run(url, t, arrays, **preset)
        ),
        "kafka: confluent-kafka (librdkafka defaults)": kafka(
            "ck", lambda t: confluent_kafka(url, t, keyed)
        ),
        "null://: floor, trivial async produce with xxhash": lambda: trivial_produce_floor(
            "", "bench", null_keyed
        ),
        "null://: produce() keyed": lambda: producerkit_run(
            null_url, "bench", null_keyed, **null_window
        ),
        "null://: produce_batch lists": lambda: producerkit_batch_run(
            null_url, "bench", null_lists, **null_window
        ),
        "null://: produce_batch Arrow": lambda: producerkit_batch_run(
            null_url, "bench", null_arrays, **null_window
        ),
    }


def batch_main(args: argparse.Namespace) -> int:
    """``--only batch``: see the module docstring."""
    report: dict[str, Any] = {
        "messages": args.messages,
        "null_messages": args.messages * 3,
        "repeat": args.repeat,
        "chunk": BATCH_CHUNK,
        "value_bytes": len(VALUE),
    }
    with _brokers.kafka(args.kafka_url, storage="null://sink") as kafka:
        print(f"Kafka: tansu null storage at {kafka.kafka_url}", flush=True)
        rounds = rounds_of(batch_runners(kafka.kafka_url, args.messages), args.repeat)
    report["rounds"] = rounds
    rows = []
    print(
        "\n| runner | best msg/s | µs per message | peer | peer's best msg/s | best / peer's best "
        "| median ratio to the peer | target (best / best) |\n"
        "|---|---:|---:|---|---:|---:|---:|---:|"
    )
    for name in rounds[0]:
        best = max(one[name] for one in rounds)
        peer, target = BATCH_PEERS.get(name, (None, None))
        row: dict[str, Any] = {"runner": name, "best": best, "us_per_message": 1e6 / best}
        cells = ["", "", "", "", ""]
        if peer is not None:
            peer_best = max(one[peer] for one in rounds)
            row.update(peer=peer, peer_best=peer_best, best_ratio=best / peer_best, target=target)
            row["median_ratio"] = median_ratio(rounds, name, peer)
            verdict = "" if target is None else " met" if best / peer_best >= target else " NOT met"
            cells = [
                peer,
                f"{peer_best:,}",
                f"{best / peer_best:.2f}x",
                f"{row['median_ratio']:.2f}x",
                "" if target is None else f"{target:.1f}x{verdict}",
            ]
        rows.append(row)
        print(f"| {name} | {best:,} | {1e6 / best:.3f} | " + " | ".join(cells) + " |")
    report["table"] = rows
    save_report(args.json, report)
    return 0


# --------------------------------------------------------------------------- production features


async def producerkit_values_run(
    url: str,
    topic: str,
    messages: Messages,
    values: list[Any],
    *,
    batches: bool = False,
    **options: Any,
) -> int:
    """:func:`producerkit_run` with ``values`` (not bytes) for a value_serializer, a context
    per message when ``on_delivery`` is set, and an OpenTelemetry span around the run when
    ``propagate_trace`` is; ``batches``: through ``produce_batch``, ``BATCH_CHUNK`` messages
    a call."""
    context_manager: Any = contextlib.nullcontext()
    if options.get("propagate_trace"):
        from opentelemetry.sdk.trace import TracerProvider

        context_manager = TracerProvider().get_tracer("bench").start_as_current_span("run")
    metrics = options.pop("metrics", None)
    if metrics is not None:
        options["on_outcome"] = metrics
    with context_manager:
        async with pk.Producer(url, topic=topic, **options) as producer:
            if metrics is not None:
                metrics.watch(producer)
            await producer.produce(values[0], key=b"warm-up")
            keys = [key for key, _ in messages]
            chunks = [
                (values[start : start + BATCH_CHUNK], keys[start : start + BATCH_CHUNK])
                for start in range(0, len(messages), BATCH_CHUNK)
            ]
            started = time.perf_counter()
            produce = producer.produce
            with_context = "on_delivery" in options
            if batches:
                for chunk_values, chunk_keys in chunks:
                    await producer.produce_batch(chunk_values, keys=chunk_keys)
            else:
                for key, value in zip(keys, values, strict=True):
                    if with_context:
                        await produce(value, key=key, nonblocking=True, context=key)
                    else:
                        await produce(value, key=key, nonblocking=True)
            await producer.flush()
            elapsed = time.perf_counter() - started
            assert producer.stats.acked == len(messages) + 1, producer.stats
    return _rate(len(messages), elapsed)


#: ``--only production``'s runner with a JSON value serializer, and the one sending its values
#: serialized before the run.
JSON_RUNNER = "dicts, value_serializer=json"
JSON_MADE_BEFORE = "bytes, the same dicts' JSON made before the run"
#: ``--only production``'s runners through produce_batch: bytes, and dicts with the JSON
#: serializer (their ratio is printed too).
BATCH_RUNNER = "bytes, produce_batch"
JSON_BATCH_RUNNER = "dicts, value_serializer=json, produce_batch"


def production_runners(url: str, count: int, kafka: bool) -> dict[str, Runner]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from producerkit.otel import ProducerMetrics

    keyed = make_messages(count, True)
    as_bytes = [value for _, value in keyed]
    as_dicts = [{"id": n, "name": f"user-{n % 10_000}", "note": "x" * 440} for n in range(count)]
    # The same dicts as JSON bytes made before the run: a distinct object per message, as the
    # serializer gives (the baseline sends one shared 512-byte value, always in the cache).
    as_json = [json.dumps(value, separators=(",", ":")).encode() for value in as_dicts]
    settings: dict[str, Any] = dict(KAFKA_SETTINGS) if kafka else {}
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def done(result: Any, context: Any) -> None:
        pass

    variants: dict[str, tuple[list[Any], dict[str, Any]]] = {
        "bytes (baseline)": (as_bytes, {}),
        "bytes (baseline, again)": (as_bytes, {}),
        JSON_RUNNER: (as_dicts, {"value_serializer": "json"}),
        JSON_MADE_BEFORE: (as_json, {}),
        BATCH_RUNNER: (as_bytes, {"batches": True}),
        JSON_BATCH_RUNNER: (as_dicts, {"value_serializer": "json", "batches": True}),
        "bytes, ProducerMetrics (defaults)": (as_bytes, {"metrics": None}),
        "bytes, on_delivery + context": (as_bytes, {"on_delivery": done}),
        "bytes, propagate_trace in a span": (as_bytes, {"propagate_trace": True}),
    }
    runners: dict[str, Runner] = {}
    for name, (values, extra) in variants.items():

        def run(topic: str, values: list[Any] = values, extra: dict[str, Any] = extra) -> Any:
            options = {**settings, **extra}
            if "metrics" in options:
                options["metrics"] = ProducerMetrics(provider)
            return producerkit_values_run(url, topic, keyed, values, **options)

        if kafka:
            runners[name] = on_new_topic_of(url, "prod", run)
        else:

            def on_stream(run: Callable[[str], Awaitable[int]] = run) -> Awaitable[int]:
                async def purged() -> int:
                    try:
                        return await run("bench")
                    finally:
                        await purge_streams(url)

                return purged()

            runners[name] = on_stream
    return runners


def production_main(args: argparse.Namespace) -> int:
    """``--only production``: see the module docstring."""
    report: dict[str, Any] = {"messages": args.messages, "repeat": args.repeat}
    print(
        "\n| broker | runner | best msg/s | median ratio to bytes (baseline) |\n|---|---|---:|---:|"
    )
    with (
        _brokers.kafka(args.kafka_url, storage="null://sink") as kafka,
        _brokers.nats(args.nats_url) as nats,
    ):
        asyncio.run(create_stream(nats.jetstream_url))
        for broker, runners in (
            ("kafka (tansu null)", production_runners(kafka.kafka_url, args.messages, kafka=True)),
            ("jetstream", production_runners(nats.jetstream_url, args.messages // 3, kafka=False)),
        ):
            rounds = rounds_of(runners, args.repeat)
            report[broker] = rounds
            for name in runners:
                median = median_ratio(rounds, name, "bytes (baseline)")
                best = max(one[name] for one in rounds)
                print(f"| {broker} | {name} | {best:,} | {median:.2f}x |", flush=True)
            against_own = median_ratio(rounds, JSON_RUNNER, JSON_MADE_BEFORE)
            report[f"{broker}: json / its JSON made before"] = against_own
            print(f"| {broker} | json / {JSON_MADE_BEFORE} | | {against_own:.2f}x |", flush=True)
            in_batches = median_ratio(rounds, JSON_BATCH_RUNNER, BATCH_RUNNER)
            report[f"{broker}: json / bytes, both through produce_batch"] = in_batches
            print(f"| {broker} | {JSON_BATCH_RUNNER} / {BATCH_RUNNER} | | {in_batches:.2f}x |")
    save_report(args.json, report)
    return 0


# --------------------------------------------------------------------------- peers: CPU per message

#: The Java producer's rows of ``--only peers`` (``--no-java`` leaves them out).
JAVA_ROWS: dict[str, Callable[[str, str, Messages], Coroutine[Any, Any, int]]] = {
    "kafka: Java producer, defaults": java_producer(),
    "kafka: Java producer, throughput settings": java_producer(JAVA_THROUGHPUT_SETTINGS),
}
#: ``--only peers``: every runner by its row's name, as ``_peers.py`` runs it in a process of its
#: own, ``(url, topic, messages) -> msg/s``, its clock (``_peers.Clock``) reading its CPU and the
#: broker's. Kafka runners publish to a new 4-partition topic on Tansu (null storage), JetStream
#: runners to a new stream on file storage that allows fast batches (producerkit writes fast
#: batches to it at its defaults). The peers at their own defaults, except aiokafka's loop
#: (``aiokafka_send_loop``: linger 0, acks 1, as in the other tables).
PEER_RUNNERS: dict[str, Callable[[str, str, Messages], Awaitable[int]]] = {
    "kafka: producerkit produce(), defaults": lambda url, topic, messages: producerkit_run(
        url, topic, messages
    ),
    'kafka: producerkit produce(), preset="throughput"': lambda url, topic, messages: (
        producerkit_run(url, topic, messages, preset="throughput")
    ),
    "kafka: producerkit produce(), throughput settings": lambda url, topic, messages: (
        producerkit_run(url, topic, messages, **KAFKA_SETTINGS)
    ),
    'kafka: producerkit produce_batch, preset="throughput"': lambda url, topic, messages: (
        producerkit_batch_run(url, topic, batch_chunks(messages), preset="throughput")
    ),
    "kafka: producerkit produce_batch, throughput settings": lambda url, topic, messages: (
        producerkit_batch_run(url, topic, batch_chunks(messages), **KAFKA_SETTINGS)
    ),
    "kafka: confluent-kafka produce()": confluent_kafka,
    "kafka: confluent-kafka produce_batch": confluent_kafka_batch,
    "kafka: confluent-kafka AIOProducer": confluent_aio,
    "kafka: kafka-python 3": kafka_python,
    "kafka: aiokafka send() loop": aiokafka_send_loop,
    **JAVA_ROWS,
    "jetstream: producerkit produce()": lambda url, topic, messages: producerkit_run(
        url, topic, messages
    ),
    "jetstream: producerkit produce_batch": lambda url, topic, messages: producerkit_batch_run(
        url, topic, batch_chunks(messages)
    ),
    "jetstream: producerkit produce(), fast_ingest=False": lambda url, topic, messages: (
        producerkit_run(url, topic, messages, fast_ingest=False)
    ),
    "jetstream: nats-py publish_async": nats_publish_async,
}
#: The module each runner needs beyond producerkit's own, and the package it comes in.
PEER_NEEDS: dict[str, tuple[str, str]] = {
    "kafka: confluent-kafka produce()": ("confluent_kafka", "confluent-kafka"),
    "kafka: confluent-kafka produce_batch": ("confluent_kafka", "confluent-kafka"),
    "kafka: confluent-kafka AIOProducer": ("confluent_kafka.aio", "confluent-kafka>=2.13"),
    "kafka: kafka-python 3": ("kafka", "kafka-python>=3"),
}
#: The rows ``_peers.py`` runs with the Python 3.13 interpreter (``--peers-python``), and the
#: name of their runner there (``_peers.FAST_PUBLISHERS``).
FAST_PUBLISHER_ROWS = {
    "jetstream: nats-jetstream-extra FastPublisher": "nats-jetstream-extra",
    "jetstream: natsio + natsio-jetstream-batch": "natsio-jetstream-batch",
}
#: ``--only peers``'s targets (issues 41, 46): (what, measure, runner, peer, at most / at least).
#: ``client`` is client CPU per message (lower is better: the ratio is wanted at most the
#: bound), ``rate`` msg/s (the ratio is wanted above the bound).
PK_KAFKA, PK_KAFKA_BATCH = (
    'kafka: producerkit produce(), preset="throughput"',
    'kafka: producerkit produce_batch, preset="throughput"',
)
#: The same runners with the bench's throughput settings (``KAFKA_SETTINGS``: the preset, a
#: larger window, the Java runner's batch size).
PK_KAFKA_TUNED, PK_KAFKA_BATCH_TUNED = (
    "kafka: producerkit produce(), throughput settings",
    "kafka: producerkit produce_batch, throughput settings",
)
PK_JETSTREAM = "jetstream: producerkit produce()"
PEER_TARGETS: list[tuple[str, str, str, float]] = [
    # issue 46 (41: 0.5 and 0.4), at the preset and again at the bench's settings
    ("client", PK_KAFKA, "kafka: confluent-kafka produce()", 0.4),
    ("client", PK_KAFKA_TUNED, "kafka: confluent-kafka produce()", 0.4),
    ("client", PK_KAFKA_BATCH, "kafka: confluent-kafka produce()", 0.3),
    ("client", PK_KAFKA_BATCH_TUNED, "kafka: confluent-kafka produce()", 0.3),
    ("client", PK_KAFKA_BATCH_TUNED, "kafka: confluent-kafka produce_batch", 0.4),
    # the same batch size as the Java producer's throughput settings
    ("client", PK_KAFKA_TUNED, "kafka: Java producer, throughput settings", 1.0),
    ("rate", PK_KAFKA_TUNED, "kafka: confluent-kafka AIOProducer", 1.0),
    ("rate", PK_KAFKA_TUNED, "kafka: kafka-python 3", 1.0),
    *[
        (measure, PK_JETSTREAM, peer, 1.0)
        for peer in ["jetstream: nats-py publish_async", *FAST_PUBLISHER_ROWS]
        for measure in ("rate", "client")
    ],
]
PEERS_SCRIPT = Path(__file__).with_name("_peers.py")


def peers_main(args: argparse.Namespace) -> int:
    """``--only peers``: see the module docstring."""
    python = args.peers_python or os.environ.get("PRODUCERKIT_PEERS_PYTHON")
    rows = {name: sys.executable for name in PEER_RUNNERS}
    rows.update(dict.fromkeys(FAST_PUBLISHER_ROWS, python or ""))
    if args.peer:
        rows = {name: how for name, how in rows.items() if any(s in name for s in args.peer)}
    if args.no_java:
        rows = {name: how for name, how in rows.items() if name not in JAVA_ROWS}
    skipped = {name: why for name in rows if (why := _peer_missing(name, rows[name]))}
    for name, why in skipped.items():
        print(f"  skipped {name}: {why}", flush=True)
    bases = [name for name in rows if name not in skipped]
    if not bases:
        print("no runner to run", file=sys.stderr)
        return 1
    with (
        _brokers.kafka_brokers(args, storage="null://sink") as kafkas,
        _brokers.nats(args.nats_url) as nats,
    ):
        for kafka in kafkas:
            what = "tansu null storage" if kafka.name == "tansu" else "Apache Kafka, one node"
            print(f"Kafka: {what} at {kafka.kafka_url}")
        print(f"JetStream at {nats.jetstream_url}", flush=True)
        # Each row: its name in the table, the runner's, and its broker (a Kafka runner on each
        # Kafka broker, the rows of one runner next to each other).
        plan = [
            (on_broker(base, kafka.name), base, kafka)
            for base in bases
            for kafka in (kafkas if base.startswith("kafka") else [nats])
        ]
        names = [name for name, _, _ in plan]
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for number in range(args.repeat):
            shift = number % len(plan)
            for name, base, broker in plan[shift:] + plan[:shift]:
                one = _run_in_own_process(base, rows[base], broker, args.messages)
                if one is None:
                    continue
                runs[name].append(one)
                print(f"  round {number + 1} {name:<66} {_run_line(one)}", flush=True)
    table = [_peer_row(name, runs[name]) for name in names if runs[name]]
    print(
        "\n| runner | msg/s | client µs/msg | broker µs/msg | client cores |\n"
        "|---|---:|---:|---:|---:|"
    )
    for row in table:
        print(
            f"| {row['runner']} | {_spread(row['rate'], '{:,.0f}')} "
            f"| {_spread(row['client_us'], '{:.2f}')} | {_spread(row['broker_us'], '{:.2f}')} "
            f"| {_spread(row['client_cores'], '{:.2f}')} |"
        )
    targets = peer_targets(runs, [kafka.name for kafka in kafkas])
    print("\n| target | median ratio (range) | wanted | |\n|---|---:|---:|---|")
    for target in targets:
        print(
            f"| {target['what']} | {_spread(target['ratios'], '{:.2f}x')} "
            f"| {target['wanted']} | {'met' if target['met'] else 'NOT met'} |"
        )
    if FAILED_RUNNERS:
        print(f"\nfailed: {', '.join(sorted(set(FAILED_RUNNERS)))}", file=sys.stderr)
    save_report(
        args.json,
        {
            "messages": args.messages,
            "repeat": args.repeat,
            "value_bytes": len(VALUE),
            "cpus": os.cpu_count(),
            "kafka_brokers": [kafka.name for kafka in kafkas],
            "apache_warmup_seconds": args.warmup,
            "peers_python": python,
            "skipped": skipped,
            "runs": runs,
            "table": table,
            "targets": targets,
            "failed_runners": sorted(set(FAILED_RUNNERS)),
        },
    )
    return 1 if FAILED_RUNNERS else 0


def on_broker(name: str, broker: str) -> str:
    """The table's name of runner ``name`` on Kafka broker ``broker``: Tansu's rows keep theirs
    (``kafka: ...``), Apache Kafka's are ``kafka on apache: ...``."""
    if broker in ("tansu", "nats") or not name.startswith("kafka: "):
        return name
    return f"kafka on {broker}: {name.removeprefix('kafka: ')}"


def _peer_missing(name: str, python: str) -> str | None:
    """Why ``name`` cannot run with ``python`` (None: it can)."""
    if name in FAST_PUBLISHER_ROWS:
        runner = FAST_PUBLISHER_ROWS[name]
        if not python:
            return (
                f"{runner} needs Python 3.13 or newer: give --peers-python (or "
                "PRODUCERKIT_PEERS_PYTHON) a 3.13 venv's python with it installed "
                "(docs/performance.md)"
            )
        module = {"nats-jetstream-extra": "nats.jetstream_extra"}.get(
            runner, "natsio.jetstream_batch"
        )
        done = subprocess.run(
            [python, "-c", f"import {module}, psutil"], capture_output=True, text=True
        )
        if done.returncode:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            return f"{runner} does not import in {python}: {last}"
        return None
    if name in JAVA_ROWS:
        return _java.missing()
    module, package = PEER_NEEDS.get(name, ("producerkit", "producerkit"))
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    return None if found else f"{module} is not installed here (pip install '{package}')"


def _run_in_own_process(
    name: str, python: str, broker: _brokers.Broker, count: int, replicas: int = 1
) -> dict[str, Any] | None:
    """One run of ``name`` by ``_peers.py`` in a fresh process, on a topic (a stream of
    ``replicas``) of its own made here and deleted afterwards; its figures, or None if it
    failed (reported)."""
    kafka = name.startswith("kafka")
    url = broker.kafka_url if kafka else broker.jetstream_url
    topic = f"peers{time.monotonic_ns()}"
    made = create_kafka_topic(url, topic, 4) if kafka else new_fast_stream(url, topic, replicas)
    asyncio.run(made)
    runner = FAST_PUBLISHER_ROWS.get(name, name)
    command = [python, str(PEERS_SCRIPT), runner, "--url", url, "--topic", topic]
    command += ["--messages", str(count)]
    if broker.pid is not None:
        command += ["--broker-pid", str(broker.pid)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    finally:
        asyncio.run(delete_topic(url, topic) if kafka else delete_stream(url, topic))
    if done.returncode:
        print(f"  {name}: failed:\n{done.stderr[-2000:]}", file=sys.stderr, flush=True)
        FAILED_RUNNERS.append(name)
        return None
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def new_fast_stream(url: str, name: str, replicas: int = 1) -> None:
    """A stream ``name`` of subject ``name`` on file storage that allows fast batches, on
    ``replicas`` servers; returns once it has a leader."""
    import nats

    nc = await nats.connect(_nats_servers(url))
    try:
        js = nc.jetstream(timeout=STREAM_ADMIN_TIMEOUT)
        await js.add_stream(
            name=name, subjects=[name], storage="file", allow_batched=True, num_replicas=replicas
        )
        while replicas > 1 and not getattr((await js.stream_info(name)).cluster, "leader", None):
            await asyncio.sleep(0.1)
    finally:
        await nc.close()


async def delete_stream(url: str, name: str) -> None:
    import nats

    nc = await nats.connect(_nats_servers(url))
    try:
        await nc.jetstream(timeout=STREAM_ADMIN_TIMEOUT).delete_stream(name)
    finally:
        await nc.close()


def _run_line(one: dict[str, Any]) -> str:
    broker = one["broker_cpu"]
    return (
        f"{one['rate']:>10,} msg/s  client {one['client_cpu'] / one['messages'] * 1e6:5.2f} µs/msg"
        + ("" if broker is None else f"  broker {broker / one['messages'] * 1e6:5.2f} µs/msg")
        + (
            f"  (JIT {one['jit_cpu'] / one['messages'] * 1e6:.2f} µs/msg of it, after "
            f"{one['warm_up_passes']} warm-up passes)"
            if "jit_cpu" in one
            else ""
        )
    )


def _peer_row(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A runner's rounds: each figure as its values over the rounds."""
    return {
        "runner": name,
        "rate": [one["rate"] for one in runs],
        "client_us": [one["client_cpu"] / one["messages"] * 1e6 for one in runs],
        "broker_us": [
            one["broker_cpu"] / one["messages"] * 1e6
            for one in runs
            if one["broker_cpu"] is not None
        ],
        "client_cores": [one["client_cpu"] / one["seconds"] for one in runs],
    }


def _spread(values: list[float], form: str) -> str:
    """The median and, with more than one value, the range: ``1.23 (1.10-1.40)``."""
    if not values:
        return "-"
    median = form.format(statistics.median(values))
    if len(values) == 1:
        return median
    return f"{median} ({form.format(min(values))}-{form.format(max(values))})"


def peer_targets(
    runs: dict[str, list[dict[str, Any]]], kafka_brokers: list[str] | None = None
) -> list[dict[str, Any]]:
    """Each target of ``PEER_TARGETS`` both of whose runners ran (the Kafka ones on each of
    ``kafka_brokers``): the per-round ratios (the n-th run of one over the n-th of the other),
    whether their median meets it."""
    out = []
    brokers = kafka_brokers or ["tansu"]
    targets = [
        (measure, on_broker(one, broker), on_broker(other, broker), bound)
        for measure, one, other, bound in PEER_TARGETS
        for broker in (brokers if one.startswith("kafka") else ["nats"])
    ]
    for measure, mine, theirs, bound in targets:
        pairs = list(zip(runs.get(mine, []), runs.get(theirs, []), strict=False))
        if not pairs:
            continue
        if measure == "rate":
            ratios = [a["rate"] / b["rate"] for a, b in pairs]
            what, wanted, met = "msg/s", f"> {bound:.1f}x", statistics.median(ratios) > bound
        else:
            ratios = [
                (a["client_cpu"] / a["messages"]) / (b["client_cpu"] / b["messages"])
                for a, b in pairs
            ]
            wanted = f"≤ {bound:.1f}x" if bound < 1 else f"< {bound:.1f}x"
            met = (
                statistics.median(ratios) <= bound
                if bound < 1
                else (statistics.median(ratios) < bound)
            )
            what = "client CPU per message"
        out.append(
            {
                "what": f"{what}: {mine} / {theirs}",
                "ratios": ratios,
                "wanted": wanted,
                "met": met,
            }
        )
    return out


# --------------------------------------------------------------------------- JetStream cluster

#: ``--only jetstream-cluster``: the rows of PEER_RUNNERS run on one server and on the cluster.
CLUSTER_RUNNERS = (PK_JETSTREAM, "jetstream: nats-py publish_async")


def jetstream_cluster_main(args: argparse.Namespace) -> int:
    """``--only jetstream-cluster``: see the module docstring."""
    from producerkit.testing.nats_cluster import JetStreamCluster

    with _brokers.nats(args.nats_url) as one, JetStreamCluster(3) as cluster:
        three = _brokers.Broker(cluster.host_ports)
        print(f"JetStream: one server at {one.host_port}, a cluster at {three.host_port}")
        places = {"one server, R1": (one, 1), "3-server cluster, R3": (three, 3)}
        plan = [
            (f"{place}: {runner}", runner, place) for runner in CLUSTER_RUNNERS for place in places
        ]
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in plan}
        for number in range(args.repeat):
            shift = number % len(plan)
            for name, runner, place in plan[shift:] + plan[:shift]:
                broker, replicas = places[place]
                one_run = _run_in_own_process(
                    runner, sys.executable, broker, args.messages, replicas
                )
                if one_run is not None:
                    runs[name].append(one_run)
                    print(f"  round {number + 1} {name:<62} {_run_line(one_run)}", flush=True)
    table = [_peer_row(name, runs[name]) for name, _, _ in plan if runs[name]]
    print("\n| where | runner | msg/s | client µs/msg | server µs/msg |\n|---|---|---:|---:|---:|")
    for row in table:
        place, _, runner = row["runner"].partition(": ")
        print(
            f"| {place} | {runner.removeprefix('jetstream: ')} | {_spread(row['rate'], '{:,.0f}')}"
            f" | {_spread(row['client_us'], '{:.2f}')} | {_spread(row['broker_us'], '{:.2f}')} |"
        )
    ratios = cluster_ratios(runs, list(places))
    print("\n| ratio, per round | msg/s | client µs/msg |\n|---|---:|---:|")
    for what, by in ratios.items():
        print(f"| {what} | {_spread(by['rate'], '{:.2f}x')} | {_spread(by['client'], '{:.2f}x')} |")
    if FAILED_RUNNERS:
        print(f"\nfailed: {', '.join(sorted(set(FAILED_RUNNERS)))}", file=sys.stderr)
    save_report(
        args.json,
        {
            "messages": args.messages,
            "repeat": args.repeat,
            "value_bytes": len(VALUE),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
            "runs": runs,
            "table": table,
            "ratios": ratios,
            "failed_runners": sorted(set(FAILED_RUNNERS)),
        },
    )
    return 1 if FAILED_RUNNERS else 0


def cluster_ratios(
    runs: dict[str, list[dict[str, Any]]], places: list[str]
) -> dict[str, dict[str, list[float]]]:
    """Per round (the n-th run of one row over the n-th of the other): producerkit / nats-py on
    each place, and each runner's cluster / one server; msg/s and client CPU per message."""
    pk_row, peer_row = CLUSTER_RUNNERS
    one, cluster = places
    pairs = {
        f"{place}: producerkit / nats-py": (f"{place}: {pk_row}", f"{place}: {peer_row}")
        for place in places
    }
    for row in CLUSTER_RUNNERS:
        pairs[f"{row.removeprefix('jetstream: ')}: cluster / one server"] = (
            f"{cluster}: {row}",
            f"{one}: {row}",
        )
    out = {}
    for what, (mine, theirs) in pairs.items():
        rounds = list(zip(runs.get(mine, []), runs.get(theirs, []), strict=False))
        out[what] = {
            "rate": [a["rate"] / b["rate"] for a, b in rounds],
            "client": [
                (a["client_cpu"] / a["messages"]) / (b["client_cpu"] / b["messages"])
                for a, b in rounds
            ],
        }
    return out


if __name__ == "__main__":
    raise SystemExit(main())
