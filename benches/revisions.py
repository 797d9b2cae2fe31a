"""Two producerkit source trees side by side: the same cases, rounds interleaved, one run.

    python benches/revisions.py --before ../baseline [--after .] [--rounds 3]
        [--messages 200000] [--cases null,kafka,kafka-preset,jetstream,sync-null,sync-kafka]
        [--json results/revisions.json]

For a change that must not cost speed: ``--before`` is a checkout of the earlier commit (with its
C extension built in place: ``python setup.py build_ext --inplace`` there), ``--after`` this one.
Every case runs in a fresh interpreter that imports producerkit from one tree, against brokers
started once here (Tansu with null storage, nats-server with JetStream in memory), so the two
trees meet the same brokers, messages and machine; in each round the trees' order alternates.
The table gives each tree's best round and the median of the per-round after/before ratios, of
msg/s and of the client's CPU per message (this process's CPU time over the timed part, its
threads included: the figure that holds on a bigger machine).

Cases publish 512-byte values with 10,000 distinct keys, as fast as they can, and count acked
messages: ``null`` (null://), ``kafka`` (defaults; a new topic of 4 partitions), ``kafka-preset``
(``preset="throughput"``), ``jetstream`` (``create_stream``), ``sync-null`` and ``sync-kafka``
(SyncProducer, nonblocking: compare them to the ``null`` and ``kafka`` rows of the same tree).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import _brokers

from producerkit.testing.brokers import create_kafka_topic

CASES = ("null", "kafka", "kafka-preset", "jetstream", "sync-null", "sync-kafka")

#: The program each case runs in its own interpreter: argv = tree, case, url, count, topic (a
#: Kafka topic is created by this process first: the tree under test may predate the helper).
WORKER = textwrap.dedent(
    """
    import asyncio, sys, time
    tree, case, url, count, topic = sys.argv[1:6]
    count = int(count)
    sys.path.insert(0, tree)
    import producerkit as pk
    assert pk.__file__.startswith(tree), (pk.__file__, tree)
    value = b"x" * 512
    keys = [b"user-%d" % (i % 10_000) for i in range(count)]
    options = {}
    if case == "kafka-preset":
        options["preset"] = "throughput"
    if case == "jetstream":
        options["create_stream"] = True

    async def run_async():
        async with pk.Producer(url, topic=topic, **options) as producer:
            await producer.produce(b"warm-up", key=b"warm-up")
            produce = producer.produce
            started, cpu = time.perf_counter(), time.process_time()
            for key in keys:
                await produce(value, key=key, nonblocking=True)
            await producer.flush()
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            assert producer.stats.acked == count + 1, producer.stats
        return elapsed, cpu

    def run_sync():
        with pk.SyncProducer(url, topic=topic, **options) as producer:
            producer.produce(b"warm-up", key=b"warm-up")
            produce = producer.produce
            started, cpu = time.perf_counter(), time.process_time()
            for key in keys:
                produce(value, key=key, nonblocking=True)
            producer.flush()
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            assert producer.stats.acked == count + 1, producer.stats
        return elapsed, cpu

    elapsed, cpu = run_sync() if case.startswith("sync-") else asyncio.run(run_async())
    print(round(count / elapsed), cpu / count * 1e6)
    """
)


def url_for(case: str, kafka: str, nats: str) -> str:
    if case.endswith("null"):
        return "null://"
    if case.startswith(("kafka", "sync-kafka")):
        return kafka
    return f"jetstream://{nats}"


def run_case(tree: Path, case: str, url: str, count: int) -> tuple[int, float]:
    """One run: its msg/s and the client's CPU µs per message."""
    topic = f"rev{uuid.uuid4().hex[:10]}"
    if url.startswith("kafka://"):  # Tansu's null storage does not create topics itself
        asyncio.run(create_kafka_topic(url, topic, 4))
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(tree), case, url, str(count), topic],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": ""},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{case} on {tree} failed:\n{done.stderr[-2000:]}")
    rate, cpu = done.stdout.split()[-2:]
    return int(rate), float(cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=Path("."))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--json", type=Path)
    _brokers.add_broker_flags(parser)
    args = parser.parse_args(argv)
    cases = [case for case in args.cases.split(",") if case]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; known: {', '.join(CASES)}")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}

    rates: dict[str, dict[str, list[int]]] = {case: {"before": [], "after": []} for case in cases}
    cpus: dict[str, dict[str, list[float]]] = {case: {"before": [], "after": []} for case in cases}
    with (
        _brokers.kafka(args.kafka_url, storage="null://sink") as kafka,
        _brokers.nats(args.nats_url) as nats,
    ):
        kafka_url = kafka.kafka_url
        for number in range(args.rounds):
            order = ["before", "after"] if number % 2 == 0 else ["after", "before"]
            for case in cases:
                url = url_for(case, kafka_url, nats.host_port)
                for name in order:
                    rate, cpu = run_case(trees[name], case, url, args.messages)
                    rates[case][name].append(rate)
                    cpus[case][name].append(cpu)
                    print(
                        f"round {number + 1} {case:13} {name:6} {rate:>10,} msg/s "
                        f"{cpu:6.2f} µs CPU/msg",
                        flush=True,
                    )
    report: dict[str, Any] = {"rounds": args.rounds, "messages": args.messages, "cases": {}}
    print(
        f"\n{'case':13} {'before':>12} {'after':>12} {'median ratio':>13} "
        f"{'CPU µs/msg before':>18} {'after':>6} {'median ratio':>13}"
    )
    for case in cases:
        before, after = rates[case]["before"], rates[case]["after"]
        ratio = statistics.median(a / b for a, b in zip(after, before, strict=True))
        cpu_before, cpu_after = cpus[case]["before"], cpus[case]["after"]
        cpu_ratio = statistics.median(a / b for a, b in zip(cpu_after, cpu_before, strict=True))
        report["cases"][case] = {
            "before": before,
            "after": after,
            "median_ratio": ratio,
            "cpu_us_before": cpu_before,
            "cpu_us_after": cpu_after,
            "cpu_median_ratio": cpu_ratio,
        }
        print(
            f"{case:13} {max(before):>12,} {max(after):>12,} {ratio:>13.3f} "
            f"{statistics.median(cpu_before):>18.2f} {statistics.median(cpu_after):>6.2f} "
            f"{cpu_ratio:>13.3f}"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
