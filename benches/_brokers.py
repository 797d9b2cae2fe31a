"""The brokers a bench runs against: those ``--kafka-url`` and ``--nats-url`` name (the test
suite's session brokers, tests/test_benches.py, or any other), else one started here from the
installed wheels for the run (Tansu, nats-server with JetStream).

A broker started here has a process id, so a bench can read its CPU; one named by URL has none
(``Broker.pid`` is None, unless ``--kafka-pid`` gives it) and such a bench reports its CPU as not
measured.

A bench that measures on more than one Kafka broker (``add_kafka_broker_choice``) also takes
``--kafka-broker tansu|apache|both``: Tansu, or one Apache Kafka node started here with the
jars :class:`~producerkit.testing.apache_kafka.ApacheKafka` runs (Java 17+), with the JVM
flags of Kafka's own start script (:data:`APACHE_JVM_OPTIONS`: full tiered compilation, not the
test nodes' C1 alone) and warmed up for ``--warmup`` seconds before anything is timed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

import producerkit as pk
from producerkit.testing.brokers import create_kafka_topic, start_kafka, start_nats

#: The Kafka brokers ``--kafka-broker`` chooses from (``both``: each of them, in this order).
KAFKA_BROKERS = ("tansu", "apache")
#: The Apache Kafka node's JVM flags here: those of Kafka's own ``kafka-server-start.sh`` and
#: ``kafka-run-class.sh`` (a 1 GB heap, G1 with 20 ms pauses), full tiered compilation (C2). The
#: test nodes' defaults (the serial collector, ``-XX:TieredStopAtLevel=1``: C1 alone) start
#: faster and run the broker slower.
APACHE_JVM_OPTIONS = (
    "-Xms1g",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)
#: The keyed 512-byte messages of the JVM's warm-up (the benches' own).
_WARM_UP_VALUE = b"x" * 512


@attrs.frozen
class Broker:
    """A broker's ``host_port``, and its process id where it was started here."""

    host_port: str
    pid: int | None = None
    #: Which Kafka broker it is, for the tables: ``tansu`` or ``apache`` (a NATS one: empty).
    name: str = ""

    @property
    def kafka_url(self) -> str:
        return f"kafka://{self.host_port}"

    @property
    def nats_url(self) -> str:
        return f"nats://{self.host_port}"

    @property
    def jetstream_url(self) -> str:
        return f"jetstream://{self.host_port}"


def add_broker_flags(
    parser: argparse.ArgumentParser, kafka: bool = True, nats: bool = True
) -> None:
    """``--kafka-url`` and/or ``--nats-url``: run against that broker instead of starting one."""
    if kafka:
        parser.add_argument(
            "--kafka-url",
            metavar="URL",
            help="run against this Kafka broker (kafka://HOST:PORT) instead of starting Tansu "
            "here (a topic per run is created on it; its CPU is measured with --kafka-pid)",
        )
    if nats:
        parser.add_argument(
            "--nats-url",
            metavar="URL",
            help="run against this nats-server with JetStream (nats://HOST:PORT) instead of "
            "starting one here (its CPU is not measured)",
        )


def add_kafka_broker_choice(parser: argparse.ArgumentParser, warmup: float = 180.0) -> None:
    """``--kafka-broker tansu|apache|both``, ``--warmup SECONDS`` (Apache Kafka's JVM) and
    ``--kafka-pid PID`` (the process of the broker ``--kafka-url`` names, to measure its CPU)."""
    parser.add_argument(
        "--kafka-broker",
        choices=[*KAFKA_BROKERS, "both"],
        default="tansu",
        help="the Kafka broker(s) to run on: Tansu, one Apache Kafka node (Java 17+), or both, "
        "rounds interleaved (default: tansu); with --kafka-url, which one that URL names",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=warmup,
        metavar="SECONDS",
        help="seconds of traffic to the Apache Kafka node (started here, or named by "
        "--kafka-url) before anything is timed, so that the JVM's JIT compiled its produce "
        f"path (default: {warmup:g})",
    )
    parser.add_argument(
        "--kafka-pid",
        type=int,
        metavar="PID",
        help="the process id of the broker --kafka-url names: its CPU is then measured",
    )


@contextlib.contextmanager
def kafka_brokers(
    args: argparse.Namespace, apache_properties: Mapping[str, str] | None = None, **tansu: Any
) -> Iterator[list[Broker]]:
    """The Kafka brokers ``args`` chooses (see :func:`add_kafka_broker_choice`), started for the
    block: Tansu with ``start_kafka(**tansu)``, Apache Kafka with :func:`apache_kafka` (its
    ``server.properties`` with ``apache_properties`` added); or the one ``--kafka-url`` names
    (``--kafka-broker`` says which, ``--kafka-pid`` its process)."""
    names = list(KAFKA_BROKERS) if args.kafka_broker == "both" else [args.kafka_broker]
    if args.kafka_url:
        if len(names) > 1:
            raise SystemExit("--kafka-url names one broker: give --kafka-broker tansu or apache")
        broker = Broker(_host_port(args.kafka_url), args.kafka_pid, names[0])
        if broker.name == "apache":
            warm_up(broker, args.warmup)
        yield [broker]
        return
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                kafka(None, **tansu)
                if name == "tansu"
                else apache_kafka(args.warmup, apache_properties)
            )
            for name in names
        ]


@contextlib.contextmanager
def apache_kafka(warmup: float, properties: Mapping[str, str] | None = None) -> Iterator[Broker]:
    """One Apache Kafka node started for the block with :data:`APACHE_JVM_OPTIONS` (and
    ``properties`` added to its ``server.properties``), after ``warmup`` seconds of traffic
    (:func:`warm_up`); its ``pid`` is the JVM's."""
    from producerkit.testing.apache_kafka import ApacheKafka

    started = time.perf_counter()
    with ApacheKafka(
        1, heap="1g", jvm_options=APACHE_JVM_OPTIONS, properties=properties
    ) as cluster:
        (node,) = cluster.nodes
        assert node.process is not None
        broker = Broker(node.host_port, node.process.pid, "apache")
        print(
            f"Apache Kafka {cluster.version} at {broker.kafka_url}, JVM pid {broker.pid}, "
            f"started in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
        warm_up(broker, warmup)
        yield broker


def warm_up(broker: Broker, seconds: float, turn: float = 5.0) -> None:
    """Keyed 512-byte messages to a 4-partition topic of the warm-up's own for ``seconds``,
    in turns of ``turn`` seconds: producerkit at its defaults, then confluent-kafka at its
    defaults if it is installed (each client's requests, of their own versions and sizes,
    run through the broker's code), and so on. Each turn prints the broker's CPU per message
    (if its ``pid`` is known), which falls as the JIT compiles the path and then stays (the
    sign the warm-up was long enough)."""
    if seconds <= 0:
        return
    import importlib.util

    import psutil

    process = None if broker.pid is None else psutil.Process(broker.pid)

    def cpu() -> float:
        return 0.0 if process is None else float(sum(process.cpu_times()[:2]))

    topic = f"warm-up-{time.monotonic_ns()}"
    asyncio.run(create_kafka_topic(broker.kafka_url, topic, 4))
    clients = ["producerkit"]
    if importlib.util.find_spec("confluent_kafka") is not None:
        clients.append("confluent-kafka")
    ends, number = time.perf_counter() + seconds, 0
    while number == 0 or time.perf_counter() < ends:
        client = clients[number % len(clients)]
        number += 1
        before, started = cpu(), time.perf_counter()
        if client == "producerkit":
            count = asyncio.run(_producerkit_for(broker.kafka_url, topic, turn))
        else:
            count = _confluent_for(broker.host_port, topic, turn)
        used, wall = cpu() - before, time.perf_counter() - started
        print(
            f"  warm-up {number} {client:<16} {count / wall:>9,.0f} msg/s"
            + ("" if process is None else f"  broker {used / max(count, 1) * 1e6:6.2f} µs/msg"),
            flush=True,
        )
    asyncio.run(_delete_topic(broker.kafka_url, topic))  # the node's disk and page cache back


async def _delete_topic(url: str, topic: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=_host_port(url))
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


async def _producerkit_for(url: str, topic: str, seconds: float) -> int:
    """producerkit at its defaults, keyed messages for ``seconds``; how many were acked."""
    async with pk.Producer(url, topic=topic) as producer:
        ends, count = time.perf_counter() + seconds, 0
        while time.perf_counter() < ends:
            for _ in range(1000):
                await producer.produce(
                    _WARM_UP_VALUE, key=b"user-%d" % (count % 10_000), nonblocking=True
                )
                count += 1
        await producer.flush()
        return producer.stats.acked


def _confluent_for(servers: str, topic: str, seconds: float) -> int:
    """confluent-kafka at its defaults, keyed messages for ``seconds``; how many were acked."""
    from confluent_kafka import Producer

    delivered = 0

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal delivered
        delivered += err is None

    producer = Producer({"bootstrap.servers": servers})
    ends, count = time.perf_counter() + seconds, 0
    while time.perf_counter() < ends:
        for _ in range(1000):
            try:
                producer.produce(
                    topic, _WARM_UP_VALUE, b"user-%d" % (count % 10_000), on_delivery=on_delivery
                )
                count += 1
            except BufferError:
                producer.poll(0.001)
        producer.poll(0)
    producer.flush(60)
    return delivered


@contextlib.contextmanager
def kafka(url: str | None, **start: Any) -> Iterator[Broker]:
    """The Kafka broker at ``url``, or Tansu started for the block with ``start_kafka(**start)``
    (``storage="null://sink"``, ...)."""
    if url:
        yield Broker(_host_port(url), name="tansu")
        return
    with start_kafka(**start) as broker:
        yield Broker(broker.host_port, broker.process.pid if broker.process else None, "tansu")


@contextlib.contextmanager
def nats(url: str | None, **start: Any) -> Iterator[Broker]:
    """The nats-server at ``url``, or one with JetStream started for the block."""
    if url:
        yield Broker(_host_port(url))
        return
    with start_nats(**{"jetstream": True, **start}) as broker:
        yield Broker(broker.host_port, broker.process.pid if broker.process else None)


def _host_port(url: str) -> str:
    return url.partition("://")[2] or url
