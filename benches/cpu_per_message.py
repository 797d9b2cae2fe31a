"""Where the CPU of a Kafka run goes: the client's and the broker's, per message.

    python benches/cpu_per_message.py [--messages 600000] [--repeat 3]
        [--kafka-broker tansu|apache|both] [--warmup 180] [--no-java]

On Tansu with null storage (``--kafka-broker tansu``, the default), on one Apache Kafka node
(``apache``: its JVM with the flags of Kafka's own start script, warmed up for ``--warmup``
seconds first, see ``benches/_brokers.py``), or on both, rounds interleaved (each runner on one
broker, then on the other), the same 512-byte keyed messages as ``benches/throughput.py``:
producerkit's ``produce()`` at its defaults, with ``preset="throughput"`` alone and with the
bench's throughput settings (``throughput.KAFKA_SETTINGS``), ``produce_batch`` (chunks of
10,000) with the latter, confluent-kafka at librdkafka's defaults, and
the Java producer at its defaults and with its throughput settings (``throughput.JAVA_ROWS``:
kafka-clients in a JVM of its own, ``benches/_java.py``; skipped, saying why, without a JDK or
with ``--no-java``), each on a new 4-partition topic. For each run: the rate, the CPU this
process used over the whole run (confluent-kafka's librdkafka threads included), or the JVM's
over its timed pass (after its start and a warm-up that the JIT settled in; every thread of
the JVM), and the CPU the broker process used over the same span (Tansu's, or the JVM's), per
message and in cores (CPU seconds per second of the run), and the rate the two would reach if
they had the machine's cores to themselves (``os.cpu_count() / (client + broker CPU per
message)``): the ceiling any client reaches on this machine with the broker on it. Then each
runner's medians over the rounds per broker.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import _brokers
import _java
from _peers import Clock
from throughput import (
    JAVA_ROWS,
    KAFKA_SETTINGS,
    Messages,
    batch_chunks,
    confluent_kafka,
    delete_topic,
    make_messages,
    producerkit_run,
)

import producerkit as pk
from producerkit.testing.brokers import create_kafka_topic

_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def broker_cpu(pid: int | None) -> float:
    """The broker's CPU seconds so far; 0 for a broker not started here (``--kafka-url``)."""
    return 0.0 if pid is None else process_cpu(pid)


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def batch_run(url: str, topic: str, messages: Messages) -> int:
    chunks = batch_chunks(messages)
    async with pk.Producer(url, topic=topic, **KAFKA_SETTINGS) as producer:
        await producer.produce(b"warm-up", key=b"warm-up")
        started = time.perf_counter()
        for values, keys in chunks:
            await producer.produce_batch(values, keys=keys)
        await producer.flush()
        elapsed = time.perf_counter() - started
    return int(len(messages) / elapsed)


def run_java(
    java: Callable[[str, str, Messages], Coroutine[Any, Any, int]],
    messages: Messages,
    url: str,
    topic: str,
) -> int:
    """One run of a Java producer's row (``throughput.JAVA_ROWS``); its figures in
    ``Clock.last``."""
    return asyncio.run(java(url, topic, messages))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=600_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--no-java",
        action="store_true",
        help="leave out the Java producer (a JVM started and warmed up for each run takes seconds)",
    )
    _brokers.add_broker_flags(parser, nats=False)
    _brokers.add_kafka_broker_choice(parser)
    args = parser.parse_args()
    messages = make_messages(args.messages, True)
    count, cores = len(messages), os.cpu_count() or 1
    runs: dict[str, Callable[[str, str], Any]] = {
        "producerkit produce(), defaults": lambda url, topic: asyncio.run(
            producerkit_run(url, topic, messages)
        ),
        'producerkit produce(), preset="throughput"': lambda url, topic: asyncio.run(
            producerkit_run(url, topic, messages, preset="throughput")
        ),
        "producerkit produce(), throughput settings": lambda url, topic: asyncio.run(
            producerkit_run(url, topic, messages, **KAFKA_SETTINGS)
        ),
        "producerkit produce_batch": lambda url, topic: asyncio.run(
            batch_run(url, topic, messages)
        ),
        "confluent-kafka (librdkafka defaults)": lambda url, topic: asyncio.run(
            confluent_kafka(url, topic, messages)
        ),
    }
    #: The runners in a JVM of their own: their figures are their timed pass's, as their clock
    #: left them (``Clock.last``), not this process's CPU over the whole run.
    java_runs = {name.removeprefix("kafka: "): java for name, java in JAVA_ROWS.items()}
    why = "--no-java" if args.no_java else _java.missing()
    if why is None:
        for name, java in java_runs.items():
            runs[name] = functools.partial(run_java, java, messages)
    else:
        print(f"skipped the Java producer: {why}", flush=True)
    #: (broker, runner) -> each round's (msg/s, client µs/msg, broker µs/msg or None)
    results: dict[tuple[str, str], list[tuple[int, float, float | None]]] = {}
    with _brokers.kafka_brokers(args, storage="null://sink") as brokers:
        print(
            "| round | broker | runner | msg/s | client µs/msg (cores) | broker µs/msg (cores) "
            "| ceiling msg/s |\n|---|---|---|---:|---:|---:|---:|"
        )
        for round_number in range(1, args.repeat + 1):
            for name, run in runs.items():
                for kafka in brokers:
                    url, topic = kafka.kafka_url, f"cpu-{time.monotonic_ns()}"
                    asyncio.run(create_kafka_topic(url, topic, 4))
                    # The JVM's clock reads the broker's CPU over its timed pass (psutil).
                    Clock.broker_pid = kafka.pid if name in java_runs else None
                    broker_before, client_before = broker_cpu(kafka.pid), own_cpu()
                    started = time.perf_counter()
                    rate = run(url, topic)
                    wall = time.perf_counter() - started
                    broker = broker_cpu(kafka.pid) - broker_before
                    client = own_cpu() - client_before
                    if name in java_runs:
                        timed = Clock.last
                        wall, client, broker = (
                            timed["seconds"],
                            timed["client_cpu"],
                            timed["broker_cpu"] or 0.0,
                        )
                    asyncio.run(delete_topic(url, topic))  # Apache Kafka keeps what it stored
                    measured = kafka.pid is not None  # named by --kafka-url: not measured
                    results.setdefault((kafka.name, name), []).append(
                        (rate, client / count * 1e6, broker / count * 1e6 if measured else None)
                    )
                    print(
                        f"| {round_number} | {kafka.name} | {name} | {rate:,} "
                        f"| {client / count * 1e6:.2f} ({client / wall:.2f}) | "
                        + (f"{broker / count * 1e6:.2f} ({broker / wall:.2f})" if measured else "-")
                        + f" | {cores / ((client + broker) / count):,.0f} |",
                        flush=True,
                    )
    print(
        f"\nMedians of {args.repeat} rounds:\n\n"
        "| broker | runner | msg/s | client µs/msg | broker µs/msg |\n|---|---|---:|---:|---:|"
    )
    for (broker_name, name), rounds in results.items():
        rates, clients, brokers_us = zip(*rounds, strict=True)
        measured_us = [us for us in brokers_us if us is not None]
        print(
            f"| {broker_name} | {name} | {statistics.median(rates):,.0f} "
            f"| {statistics.median(clients):.2f} | "
            + (f"{statistics.median(measured_us):.2f}" if measured_us else "-")
            + " |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
