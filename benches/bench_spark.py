"""Rows/s and CPU per row of producerkit.spark on local[1] and local[2], vs one producer process.

Every run publishes the same rows (``--rows`` of ``--size``-byte values with 8-byte keys) to a
Tansu broker with null storage (it acks and discards), so the broker's disk is out of the
picture::

    python benches/bench_spark.py --rows 400000 [--json figures.json]

Each master runs in its own process (one SparkContext per process): one warm-up of each way in
over as many partitions (every Python worker starts and connects), then ``--repeat`` rounds of
``publish(df, ...)`` (mapInArrow) and ``df.foreachPartition(partition_writer(...))``,
interleaved; the best of each is reported. The single-process baseline is producerkit's async
Producer with nonblocking produce in a loop over prepared keys and values.

Throughput targets (issue 6): local[2] >= 1.6x local[1]; per core >= 0.8x the single process. On a
machine with few cores the broker, the executor JVM and the Python workers share them, so
throughput cannot show scaling there; CPU per row can.

Two peers run in the same Spark process, interleaved with the timed rounds (the order rotated
each round): ``mapInArrow, no producer`` reads every Arrow batch in the Python workers and
publishes nothing (what Spark's own worker path costs per row, which no sink can go below), and
``driver produce_batch`` publishes the same rows as Arrow chunks of 10,000 with
``SyncProducer.produce_batch`` from the driver's Python process (the producer's own cost for
what a worker hands it, without Spark; its CPU is that process's own).

CPU per row (issue 20): the user + system CPU seconds of Spark's Python worker processes during
one timed action, over the rows. The workers are found with psutil among the descendants of the
Spark driver process (the JVM is its child, ``pyspark.daemon`` the JVM's, the workers the daemon's
forks): every process whose command line names ``pyspark.daemon`` or ``pyspark.worker``, each
counted as its own CPU plus its reaped children's (so a worker that exits mid-job is still
counted, through its parent). The difference of those sums before and after the action is the
Python worker path: reading Spark's pipe, Arrow or pickle decoding, our chunking and the
producer, its loop thread included. The JVM's CPU over the same action is shown beside it. The
baseline is the single process's own user + system CPU over its timed loop. Target: the worker
path <= 1.2x the baseline per row. Beside it, interleaved with it: the same rows through
confluent-kafka (librdkafka's defaults) from this process, its CPU with librdkafka's threads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import _brokers
import psutil

import producerkit as pk
from producerkit.testing.brokers import create_kafka_topic

_SPARK_RUN = """
import json, os, sys, time
os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
import psutil
from pyspark.sql import SparkSession, functions as F
from producerkit.spark import partition_writer, publish
master, url, rows, size, partitions, repeat, limit, extra_peers = sys.argv[1:9]
spark = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
         .config("spark.driver.memory", "1g").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
df = spark.range(int(rows), numPartitions=int(partitions)).select(
    F.lpad(F.col("id").cast("string"), 8, "0").alias("key"),
    F.lpad(F.col("id").cast("string"), int(size), "x").alias("value"),
).cache()
df.count()
kwargs = dict(topic="bench-spark", max_in_flight_messages=int(limit))

def cpu(process):
    times = process.cpu_times()
    return times.user + times.system + times.children_user + times.children_system

def cpu_by_kind():
    total = {"worker": 0.0, "jvm": 0.0}
    for process in psutil.Process().children(recursive=True):
        try:
            line = " ".join(process.cmdline())
            kind = "worker" if ("pyspark.daemon" in line or "pyspark.worker" in line) else (
                "jvm" if process.name() == "java" else None)
            if kind:
                total[kind] += cpu(process)
        except psutil.NoSuchProcess:
            pass
    return total

def via_publish(frame):
    report = publish(frame, url, **kwargs)
    assert report.failed == 0, report

def via_foreach_partition(frame):
    frame.foreachPartition(partition_writer(url, **kwargs))

def read_only(batches):
    import pyarrow as pa
    count = 0
    for batch in batches:
        count += batch.num_rows
    yield pa.RecordBatch.from_pylist([{"rows": count}])

def via_map_in_arrow(frame):
    counted = frame.mapInArrow(read_only, "rows long").collect()
    assert frame is not df or sum(row.rows for row in counted) == int(rows)

def own_cpu():
    times = psutil.Process().cpu_times()
    return times.user + times.system

import pyarrow as pa
from producerkit import SyncProducer
local = pa.table({
    "key": pa.array(["%08d" % i for i in range(int(rows))]),
    "value": pa.array([str(i).rjust(int(size), "x") for i in range(int(rows))]),
}).to_batches(max_chunksize=10_000)
driver_producer = SyncProducer(url, **kwargs)
driver_producer.start()

def via_driver_batch(frame):
    batches = local if frame is df else local[:1]
    for batch in batches:
        driver_producer.produce_batch(batch.column(1), keys=batch.column(0))
    driver_producer.flush()

ways = {"publish()": via_publish, "foreachPartition": via_foreach_partition}
if extra_peers == "1":
    ways["mapInArrow, no producer"] = via_map_in_arrow
    ways["driver produce_batch"] = via_driver_batch
# warm-up with as many partitions as the timed runs: every Python worker they use starts
# (imports, connects) here, not inside a measurement
warm = spark.range(1000 * int(partitions), numPartitions=int(partitions)).select(
    F.col("id").cast("string").alias("key"), F.col("id").cast("string").alias("value"))
for run in ways.values():
    run(warm)
best = {}
names = list(ways)
for number in range(int(repeat)):
    shift = number % len(names)
    for name in names[shift:] + names[:shift]:
        run = ways[name]
        before, own = cpu_by_kind(), own_cpu()
        started = time.perf_counter()
        run(df)
        seconds = time.perf_counter() - started
        after, own = cpu_by_kind(), own_cpu() - own
        figures = {"seconds": seconds, **{k: after[k] - before[k] for k in after}}
        if run is via_driver_batch:
            figures = {"seconds": seconds, "worker": own}
        print("ROUND " + json.dumps({"round": number + 1, "name": name, **figures}), flush=True)
        previous = best.get(name)
        best[name] = figures if previous is None else {
            k: min(previous[k], figures[k]) for k in figures}
driver_producer.close()
print("RESULT " + json.dumps(best))
spark.stop()
"""


def _cpu_seconds() -> float:
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


def _confluent_process(url: str, rows: int, size: int) -> dict[str, float]:
    """The same rows through confluent-kafka at librdkafka's defaults in this process: its CPU
    (librdkafka's threads included) over a produce loop and flush."""
    from confluent_kafka import Producer

    keys = [b"%08d" % i for i in range(rows)]
    values = [(b"%d" % i).rjust(size, b"x") for i in range(rows)]
    failed = 0

    def on_delivery(err: Any, _: Any) -> None:
        nonlocal failed
        failed += err is not None

    producer = Producer({"bootstrap.servers": url.removeprefix("kafka://")})
    for i in range(min(rows, 10000)):  # warm-up: connection, metadata
        producer.produce("bench-single", values[i], keys[i])
    producer.flush(60)
    cpu = _cpu_seconds()
    started = time.perf_counter()
    produce, poll = producer.produce, producer.poll
    for key, value in zip(keys, values, strict=True):
        while True:
            try:
                produce("bench-single", value, key, on_delivery=on_delivery)
                break
            except BufferError:
                poll(0.001)
        poll(0)
    producer.flush(60)
    assert failed == 0
    return {"seconds": time.perf_counter() - started, "worker": _cpu_seconds() - cpu}


async def _single_process(url: str, rows: int, size: int, limit: int) -> dict[str, float]:
    keys = [b"%08d" % i for i in range(rows)]
    values = [(b"%d" % i).rjust(size, b"x") for i in range(rows)]
    async with pk.Producer(url, topic="bench-single", max_in_flight_messages=limit) as producer:
        for i in range(min(rows, 10000)):  # warm-up: connection, metadata
            await producer.produce(values[i], key=keys[i], nonblocking=True)
        await producer.flush()
        cpu = _cpu_seconds()
        started = time.perf_counter()
        produce = producer.produce
        for key, value in zip(keys, values, strict=True):
            await produce(value, key=key, nonblocking=True)
        await producer.flush()
        return {"seconds": time.perf_counter() - started, "worker": _cpu_seconds() - cpu}


def _spark(master: str, url: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
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
            "1" if master == "local[1]" else "0",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    for line in done.stdout.splitlines():
        if line.startswith("ROUND "):
            one = json.loads(line[6:])
            print(
                f"  {master} round {one['round']} {one['name']:<24} "
                f"{args.rows / one['seconds']:>10,.0f} rows/s "
                f"{one['worker'] / args.rows * 1e6:6.2f} us/row Python CPU",
                flush=True,
            )
        if line.startswith("RESULT "):
            result: dict[str, dict[str, float]] = json.loads(line[7:])
            return result
    raise SystemExit(f"{master} run failed:\n{done.stderr[-4000:]}")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--partitions", type=int, default=4, help="Spark partitions")
    parser.add_argument("--topic-partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2, help="timed Spark rounds (best kept)")
    parser.add_argument("--limit", type=int, default=10_000, help="max_in_flight_messages")
    parser.add_argument(
        "--masters", default="local[1],local[2]", help="Spark masters to run, comma-separated"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    _brokers.add_broker_flags(parser, nats=False)
    args = parser.parse_args(argv)

    runs: dict[str, dict[str, float]] = {}
    with _brokers.kafka(args.kafka_url, storage="null://sink") as broker:
        url = broker.kafka_url
        for name in ("bench-single", "bench-spark"):  # a broker named by URL may have them
            asyncio.run(create_kafka_topic(url, name, args.topic_partitions, exist_ok=True))
        singles, confluents = [], []
        for _ in range(args.repeat):  # interleaved, each kept at its best
            singles.append(asyncio.run(_single_process(url, args.rows, args.size, args.limit)))
            confluents.append(_confluent_process(url, args.rows, args.size))
        runs["single process"] = {k: min(one[k] for one in singles) for k in singles[0]}
        runs["single process, confluent-kafka"] = {
            k: min(one[k] for one in confluents) for k in confluents[0]
        }
        for master in args.masters.split(","):
            for way, measured in _spark(master, url, args).items():
                runs[f"{master} {way}"] = measured

    baseline = runs["single process"]["worker"] / args.rows
    table = {
        name: {
            "rows_per_second": args.rows / run["seconds"],
            "python_cpu_us_per_row": run["worker"] / args.rows * 1e6,
            # None where the single process used no CPU a clock tick could see (a few rows)
            "python_cpu_over_single": run["worker"] / args.rows / baseline if baseline else None,
            "jvm_cpu_us_per_row": run["jvm"] / args.rows * 1e6 if "jvm" in run else None,
        }
        for name, run in runs.items()
    }
    rate = {name: row["rows_per_second"] for name, row in table.items()}
    figures: dict[str, Any] = {
        "rows": args.rows,
        "value_bytes": args.size,
        "cpus": os.cpu_count(),
        "runs": table,
    }
    if "local[1] publish()" in rate:
        figures["local1_per_core_over_single"] = rate["local[1] publish()"] / rate["single process"]
        if "local[2] publish()" in rate:
            figures["local2_over_local1"] = rate["local[2] publish()"] / rate["local[1] publish()"]
    print(f"{args.rows:,} rows of {args.size} B to Tansu (null storage), {os.cpu_count()} CPUs")
    print(
        f"  {'run':<36} {'rows/s':>10} {'Python CPU us/row':>18} {'x single':>9} {'JVM us/row':>11}"
    )
    for name, row in table.items():
        jvm = row["jvm_cpu_us_per_row"]
        print(
            f"  {name:<36} {row['rows_per_second']:>10,.0f} "
            f"{row['python_cpu_us_per_row']:>18.2f} {_ratio(row['python_cpu_over_single']):>9} "
            f"{'' if jvm is None else f'{jvm:.2f}':>11}"
        )
    if "local2_over_local1" in figures:
        print(
            f"  local[2] / local[1] publish()       {figures['local2_over_local1']:.2f}x "
            "(target >= 1.6)"
        )
    if "local1_per_core_over_single" in figures:
        print(
            f"  local[1] publish() / single process {figures['local1_per_core_over_single']:.2f}x "
            "(target >= 0.8)"
        )
        cpu = table["local[1] publish()"]["python_cpu_us_per_row"]
        print(f"  local[1] publish() Python CPU per row {cpu:.2f} us (target <= 0.8, issue 27)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(figures, file, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
