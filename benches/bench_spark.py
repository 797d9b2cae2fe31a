"""Rows/s of producerkit.spark.publish on local[1] vs local[2], and of one plain producer process.

All three publish the same rows (``--rows`` of ``--size``-byte values with 8-byte keys) to a Tansu
broker with null storage (it acks and discards), so the broker's disk is out of the picture::

    python benches/bench_spark.py --rows 1000000

Targets (issue 6): local[2] >= 1.6x local[1]; per core >= 0.8x the single process. Each Spark
run happens in its own process (one SparkContext per process), does one warm-up publish (Python
workers start, producers connect), then ``--repeat`` timed ones; the best is reported. The
single-process baseline is producerkit's async Producer with nonblocking produce in a loop.
Note that on a 2-core machine the broker, the JVM and the Python workers share the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import producerkit as pk
from producerkit.testing.brokers import start_kafka

_SPARK_RUN = """
import json, os, sys
os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
from pyspark.sql import SparkSession, functions as F
from producerkit.spark import publish
master, url, rows, size, partitions, repeat, limit = sys.argv[1:8]
spark = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
         .config("spark.driver.memory", "1g").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
df = spark.range(int(rows), numPartitions=int(partitions)).select(
    F.lpad(F.col("id").cast("string"), 8, "0").alias("key"),
    F.lpad(F.col("id").cast("string"), int(size), "x").alias("value"),
).cache()
df.count()
kwargs = dict(topic="bench-spark", max_in_flight_messages=int(limit))
publish(df.limit(10000), url, **kwargs)  # warm-up: workers start, producers connect
best = None
for _ in range(int(repeat)):
    report = publish(df, url, **kwargs)
    assert report.failed == 0 and report.delivered == int(rows), report
    best = report if best is None or report.seconds < best.seconds else best
print("RESULT " + json.dumps({"seconds": best.seconds, "rows": best.rows}))
spark.stop()
"""


async def _create_topics(url: str, partitions: int) -> None:
    """Tansu's null storage does not auto-create topics: create them (aiokafka's admin client)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=url.removeprefix("kafka://"))
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(name, partitions, 1) for name in ("bench-single", "bench-spark")]
        )
    finally:
        await admin.close()


async def _single_process(url: str, rows: int, size: int, limit: int) -> float:
    keys = [b"%08d" % i for i in range(rows)]
    values = [(b"%d" % i).rjust(size, b"x") for i in range(rows)]
    async with pk.Producer(url, topic="bench-single", max_in_flight_messages=limit) as producer:
        for i in range(min(rows, 10000)):  # warm-up: connection, metadata
            await producer.produce(values[i], key=keys[i], nonblocking=True)
        await producer.flush()
        started = time.perf_counter()
        produce = producer.produce
        for key, value in zip(keys, values, strict=True):
            await produce(value, key=key, nonblocking=True)
        await producer.flush()
        return time.perf_counter() - started


def _spark(master: str, url: str, args: argparse.Namespace) -> float:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _SPARK_RUN,
            master,
            url,
            str(args.rows),
            str(args.size),
            str(args.partitions),
            str(args.repeat),
            str(args.limit),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            seconds: float = json.loads(line[7:])["seconds"]
            return seconds
    raise SystemExit(f"{master} run failed:\n{done.stderr[-4000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--partitions", type=int, default=4, help="Spark partitions")
    parser.add_argument("--topic-partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2, help="timed Spark runs (best kept)")
    parser.add_argument("--limit", type=int, default=10_000, help="max_in_flight_messages")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    with start_kafka(storage="null://sink") as broker:
        asyncio.run(_create_topics(broker.url, args.topic_partitions))
        single = asyncio.run(_single_process(broker.url, args.rows, args.size, args.limit))
        one = _spark("local[1]", broker.url, args)
        two = _spark("local[2]", broker.url, args)

    rate = {
        name: args.rows / seconds
        for name, seconds in (("single process", single), ("local[1]", one), ("local[2]", two))
    }
    figures = {
        "rows": args.rows,
        "value_bytes": args.size,
        "cpus": os.cpu_count(),
        "rows_per_second": rate,
        "local2_over_local1": rate["local[2]"] / rate["local[1]"],
        "local1_per_core_over_single": rate["local[1]"] / rate["single process"],
        "local2_per_core_over_single": rate["local[2]"] / 2 / rate["single process"],
    }
    print(f"{args.rows:,} rows of {args.size} B to Tansu (null storage), {os.cpu_count()} CPUs")
    for name, value in rate.items():
        print(f"  {name:<15} {value:>12,.0f} rows/s")
    print(
        f"  local[2] / local[1]                 {figures['local2_over_local1']:.2f}x "
        "(target >= 1.6)"
    )
    print(
        f"  local[1] per core / single process  {figures['local1_per_core_over_single']:.2f}x "
        "(target >= 0.8)"
    )
    print(f"  local[2] per core / single process  {figures['local2_per_core_over_single']:.2f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(figures, file, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
