"""What ``exactly_once=True`` costs: rows/s of the same ``publish()`` to Kafka with and without it,
in one run.

    python spark_examples/exactly_once_cost.py [--rows 400000] [--partitions 4] [--repeat 3]

Starts librdkafka's mock cluster (``producerkit.testing.KafkaCluster``: 3 brokers in memory,
clients talking to them directly; needs ``confluent-kafka``) or, with ``--broker tansu``, a
Tansu broker with null storage, and a ``local[2]`` Spark session; caches a DataFrame of
``--rows`` rows (8-byte keys, ``--size``-byte values) in ``--partitions`` partitions, publishes
it once each way to warm up (every Python worker starts and connects), then ``--repeat`` rounds
of both, interleaved (the order alternating). It prints each way's best and median rows/s, the
cost (best against best, and the median of each round's pair) and each way's Python worker CPU
per row (user + system CPU of Spark's ``pyspark.daemon`` processes and their forks over the
action, as ``benches/bench_spark.py`` counts it). With ``exactly_once`` a round includes what
the driver adds: committing every task's transaction once the job succeeded.

Tansu 0.6 with null storage grants every transactional id the same producer id and epoch: it
checks nothing of the transactions, so the mock cluster is the default here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from producerkit.testing.brokers import create_kafka_topic, start_kafka


@contextlib.contextmanager
def _broker(kind: str, topic: str, partitions: int) -> Iterator[str]:
    """The URL of a broker holding ``topic``, for the ``with`` block."""
    if kind == "tansu":
        with start_kafka(storage="null://sink") as kafka:
            asyncio.run(create_kafka_topic(kafka.url, topic, partitions))
            yield kafka.url
        return
    from producerkit.testing.kafka_cluster import KafkaCluster

    with KafkaCluster() as cluster:
        cluster.create_topic(topic, partitions=partitions, replication=1)
        yield cluster.url


def _workers_cpu() -> float:
    """User + system CPU seconds of Spark's Python workers (descendants of this process)."""
    import psutil

    total = 0.0
    for process in psutil.Process().children(recursive=True):
        try:
            line = " ".join(process.cmdline())
            if "pyspark.daemon" in line or "pyspark.worker" in line:
                times = process.cpu_times()
                total += times.user + times.system + times.children_user + times.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--size", type=int, default=100, help="bytes of each value")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--broker", choices=("mock", "tansu"), default="mock")
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from producerkit.spark import publish

    topic = "exactly-once-cost"
    with _broker(args.broker, topic, args.partitions) as url:
        spark = (
            SparkSession.builder.master(args.master)
            .config("spark.ui.enabled", "false")
            .config("spark.driver.memory", "1g")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        df = spark.range(args.rows, numPartitions=args.partitions).select(
            F.lpad(F.col("id").cast("string"), 8, "0").alias("key"),
            F.lpad(F.col("id").cast("string"), args.size, "x").alias("value"),
        )
        df = df.cache()
        df.count()
        ways: dict[str, dict[str, Any]] = {
            "publish()": {},
            "publish(exactly_once=True)": {"exactly_once": True},
        }
        for options in ways.values():  # warm-up
            publish(df, url, topic=topic, **options)
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
        for number in range(args.repeat):
            order = list(ways) if number % 2 == 0 else list(reversed(ways))
            for name in order:
                cpu = _workers_cpu()
                started = time.perf_counter()
                report = publish(df, url, topic=topic, **ways[name])
                seconds = time.perf_counter() - started
                cpu = _workers_cpu() - cpu
                assert report.delivered == args.rows, report
                figures[name].append((args.rows / seconds, cpu / args.rows * 1e6))
                print(f"round {number + 1}: {name:28} {args.rows / seconds:>10,.0f} rows/s")
        spark.stop()

    print(
        f"\n{args.rows:,} rows, {args.partitions} partitions, {args.master}, {args.broker}, "
        f"{args.repeat} rounds"
    )
    print(f"{'':28} {'best rows/s':>12} {'median rows/s':>14} {'worker CPU µs/row':>18}")
    for name, runs in figures.items():
        rates = [rate for rate, _ in runs]
        cpu = statistics.median(cpu for _, cpu in runs)
        print(f"{name:28} {max(rates):>12,.0f} {statistics.median(rates):>14,.0f} {cpu:>18.2f}")
    plain, once = (max(rate for rate, _ in figures[name]) for name in ways)
    paired = statistics.median(
        1 - once_rate / plain_rate
        for (plain_rate, _), (once_rate, _) in zip(*figures.values(), strict=True)
    )
    print(
        f"exactly_once costs {1 - once / plain:.0%} of rows/s best against best, "
        f"{paired:.0%} the median of each round's pair"
    )


if __name__ == "__main__":
    main()
