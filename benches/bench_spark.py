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

``--compare sinks`` (issue 46) measures Spark's own Kafka sink beside producerkit's instead::

    python benches/bench_spark.py --compare sinks [--rows 10000000] [--stream-seconds 60]

One Apache Kafka node (``--kafka-broker tansu`` where Java cannot run it) and one ``local[2]``
Spark session (benches/_spark_sinks.py, Java 17, ``PYSPARK_PYTHON`` this interpreter) write
the same DataFrame (``--rows`` keyed rows of ``--size`` = 512-byte values, cached) into the
same topic with ``df.write.format("kafka")`` (``org.apache.spark:spark-sql-kafka-0-10_2.13``
at the pinned pyspark's version, or the newest 4.x Maven Central serves if that one does not
resolve; its jars resolved once into producerkit's cache and handed to Spark as local
``spark.jars``) at its defaults and with its producer tuned (``--kafka-tuned``), producerkit's
``publish()`` and ``format("producerkit")``, each also with ``exactly_once``, and beside them a
``mapInArrow`` that reads every batch and publishes nothing (the floor under producerkit's
sinks: Spark's Arrow path to a Python worker by itself): ``--repeat`` rounds after one untimed
round of each, the order rotated each round. CPU per row is the whole Spark process tree's (the
driver's Python, the JVM, PySpark's daemon and its workers, each process's own CPU sampled so
that one exiting mid-write still counts; the JVM's and the Python workers' shares shown), the
broker's beside it. Each
round's figures are divided by ``format("kafka")``'s of the same round, and the medians of those
ratios reported. After the rounds every sink writes the DataFrame once more into a topic of its
own, read back by a consumer (``read_committed``) and counted. Then a streaming query from the
``rate`` source at ``--stream-rate`` rows/s through each sink (producerkit's
``format("producerkit")`` and ``stream_writer()``) for ``--stream-seconds``: the
latency from each row's timestamp (carried in its value) to its log-append time on the broker,
and each micro-batch's phases; beside them, a Python data source that publishes nothing (what a
micro-batch through any Python data source costs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
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
master, url, rows, size, partitions, repeat, limit, extra_peers, conf = sys.argv[1:10]
builder = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
           .config("spark.driver.memory", "1g"))
for name, value in json.loads(conf).items():
    builder = builder.config(name, value)
spark = builder.getOrCreate()
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


#: ``--masters``' default (``--compare masters``).
_MASTERS = "local[1],local[2]"


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
            json.dumps(_spark_conf(args)),
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


#: The newest spark-sql-kafka-0-10 Maven Central served when the pinned pyspark's (4.3.0) was
#: not there (2026-11-29): Spark's Kafka sink from it runs on Spark 4.3.0's JVM side.
_SPARK_KAFKA_FALLBACK = "4.2.0"
#: The Kafka sink's jars that Spark's own jars/ directory lacks: the rest of its dependencies
#: (Scala, Hadoop's client, slf4j, lz4, snappy) are Spark's own, and a second copy would clash.
_SPARK_KAFKA_JARS = (
    "spark-sql-kafka-0-10_2.13",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
)
#: The Kafka sink's producer tuned as Spark's guide allows (``kafka.``-prefixed producer
#: configs): a longer linger and larger batches; no compression, so that every sink sends the
#: same bytes.
_KAFKA_TUNED = "linger.ms=10,batch.size=524288,buffer.memory=67108864"


def spark_kafka_jars(version: str) -> tuple[str, list[Path]]:
    """Spark's Kafka sink at Spark ``version`` (else at :data:`_SPARK_KAFKA_FALLBACK`, said on
    stderr) and its dependencies Spark does not ship: which version, and the jar files."""
    from producerkit.errors import MissingDependencyError
    from producerkit.testing.maven import Artifact, resolve_jars

    for release in dict.fromkeys((version, _SPARK_KAFKA_FALLBACK)):
        artifact = Artifact("org.apache.spark", "spark-sql-kafka-0-10_2.13", release)
        try:
            jars = resolve_jars(f"spark-sql-kafka-{release}", [artifact], only=_SPARK_KAFKA_JARS)
        except MissingDependencyError as exc:
            print(f"spark-sql-kafka-0-10 {release}: {str(exc).splitlines()[0]}", file=sys.stderr)
            continue
        if release != version:
            print(f"Spark's Kafka sink {release} on pyspark {version}", file=sys.stderr)
        return release, sorted(jars.glob("*.jar"))
    raise SystemExit("Spark's Kafka sink: no version resolved")


def _spark_conf(args: argparse.Namespace) -> dict[str, str]:
    """``--spark-conf``'s settings: name -> value."""
    return dict(one.split("=", 1) for one in args.spark_conf or ())


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _compare_sinks(args: argparse.Namespace) -> int:
    """``--compare sinks``: run benches/_spark_sinks.py against the broker and print (and with
    ``--json`` write) its table."""
    import pyspark

    release, jars = spark_kafka_jars(pyspark.__version__)
    # the timed topic keeps a bounded log: the broker checks it every 5 s (not 5 minutes)
    properties = {"log.retention.check.interval.ms": "5000"}
    load = {"start": os.getloadavg()}
    with _brokers.kafka_brokers(args, apache_properties=properties) as (broker,):
        settings = {
            "master": args.masters if args.masters != _MASTERS else "local[2]",
            "bootstrap": broker.host_port,
            "url": broker.kafka_url,
            "broker_pid": broker.pid,
            "rows": args.rows,
            "size": args.size or 512,
            "partitions": args.partitions,
            "topic_partitions": args.topic_partitions,
            "repeat": args.repeat,
            "jars": [str(jar) for jar in jars],
            "tuned": dict(one.split("=", 1) for one in args.kafka_tuned.split(",") if one),
            "only": args.only or [],
            "verify": not args.no_verify,
            "batch": args.rows > 0,
            "driver_memory": args.driver_memory
            or f"{max(2, math.ceil(args.rows * ((args.size or 512) + 60) * 2 / 2**30) + 1)}g",
            "stream_rate": args.stream_rate,
            "stream_seconds": args.stream_seconds,
            "stream_repeat": args.stream_repeat,
            "spark_conf": _spark_conf(args),
        }
        print(
            f"{args.rows:,} rows of {settings['size']} B, {settings['master']}, "
            f"{broker.name} broker, Spark's Kafka sink {release}, load {load['start']}"
            + "".join(f", {name}={value}" for name, value in settings["spark_conf"].items()),
            flush=True,
        )
        lines = _run_lines(
            [sys.executable, str(Path(__file__).parent / "_spark_sinks.py"), json.dumps(settings)]
        )
    load["end"] = os.getloadavg()
    rounds = [line for kind, line in lines if kind == "ROUND"]
    figures = _sink_table(rounds, args.rows)
    figures.update(
        rows=args.rows,
        value_bytes=settings["size"],
        master=settings["master"],
        broker=broker.name,
        spark_kafka=release,
        spark_conf=settings["spark_conf"],
        load=load,
        verified=[line for kind, line in lines if kind == "VERIFY"],
        streaming=[line for kind, line in lines if kind == "STREAM"],
    )
    figures["streaming_over_baseline"] = _stream_ratios(figures["streaming"])
    _print_sinks(figures)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(figures, file, indent=2)
    wrong = [one for one in figures["verified"] if one["read"] != one["rows"]]
    return 1 if wrong else 0


def _run_lines(command: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Run ``command``, echoing its figure lines as they come; each as (kind, figures)."""
    lines: list[tuple[str, dict[str, Any]]] = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        for line in process.stdout:
            kind, _, text = line.partition(" ")
            if kind in ("ROUND", "VERIFY", "STREAM"):
                figures = json.loads(text)
                lines.append((kind, figures))
                shown = ", ".join(
                    f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
                    for key, value in figures.items()
                )
                print(f"  {kind.lower()}: {shown}", flush=True)
        errors = process.stderr.read()
    if process.returncode != 0:
        raise SystemExit(f"the Spark run failed:\n{errors[-4000:]}")
    return lines


#: The sink every other is divided by, round by round.
_BASELINE = 'format("kafka")'


def _sink_table(rounds: list[dict[str, Any]], rows: int) -> dict[str, Any]:
    """Each sink's medians over the rounds: rows/s, CPU µs per row (the Spark process tree's,
    and the broker's), and the medians of its per-round ratios to :data:`_BASELINE`'s."""
    baseline = {one["round"]: one for one in rounds if one["name"] == _BASELINE}
    table: dict[str, dict[str, float | None]] = {}
    for name in dict.fromkeys(one["name"] for one in rounds):
        mine = [one for one in rounds if one["name"] == name]
        paired = [(one, baseline[one["round"]]) for one in mine if one["round"] in baseline]
        broker = [one["broker_cpu"] for one in mine if one.get("broker_cpu") is not None]
        table[name] = {
            "rows_per_second": _median([rows / one["seconds"] for one in mine]),
            "cpu_us_per_row": _median([one["cpu"] / rows * 1e6 for one in mine]),
            "jvm_cpu_us_per_row": _median([one["cpu_jvm"] / rows * 1e6 for one in mine]),
            "python_cpu_us_per_row": _median([one["cpu_python"] / rows * 1e6 for one in mine]),
            "broker_cpu_us_per_row": _median([cpu / rows * 1e6 for cpu in broker])
            if broker
            else None,
            "offsets_per_row": _median([one["offsets"] / rows for one in mine]),
            "rate_over_baseline": _median(
                [base["seconds"] / one["seconds"] for one, base in paired]
            )
            if paired
            else None,
            "cpu_over_baseline": _median([one["cpu"] / base["cpu"] for one, base in paired])
            if paired
            else None,
        }
    return {"rounds": len(baseline), "runs": table}


def _stream_ratios(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each streaming sink's p50 and p99 over :data:`_BASELINE`'s of the same round, the
    medians over the rounds."""
    baseline = {one["round"]: one for one in runs if one["name"] == _BASELINE}
    ratios: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(one["name"] for one in runs if one["name"] != _BASELINE):
        paired = [
            (one, baseline[one["round"]])
            for one in runs
            if one["name"] == name and one["rows"] and one["round"] in baseline
        ]
        if not paired:  # the floor, which writes nothing
            continue
        ratios[name] = {
            quantile: _median(
                [one[f"{quantile}_ms"] / base[f"{quantile}_ms"] for one, base in paired]
            )
            for quantile in ("p50", "p99")
        }
    return ratios


def _print_sinks(figures: dict[str, Any]) -> None:
    print(
        f"{figures['rows']:,} rows of {figures['value_bytes']} B, {figures['master']}, "
        f"{figures['broker']} broker, Spark's Kafka sink {figures['spark_kafka']}; medians of "
        f"{figures['rounds']} rounds; load average {figures['load']['start']} -> "
        f"{figures['load']['end']}"
    )
    if figures["runs"]:
        print(
            f"  {'sink':<36} {'rows/s':>10} {'x kafka':>8} {'CPU us/row':>11} {'x kafka':>8} "
            f"{'of it JVM':>10} {'Python':>7} {'broker us/row':>14}"
        )
    for name, row in figures["runs"].items():
        broker = row["broker_cpu_us_per_row"]
        print(
            f"  {name:<36} {row['rows_per_second']:>10,.0f} {_ratio(row['rate_over_baseline']):>8} "
            f"{row['cpu_us_per_row']:>11.2f} {_ratio(row['cpu_over_baseline']):>8} "
            f"{row['jvm_cpu_us_per_row']:>10.2f} {row['python_cpu_us_per_row']:>7.2f} "
            f"{'-' if broker is None else f'{broker:.2f}':>14}"
        )
    for one in figures["verified"]:
        verdict = "ok" if one["read"] == one["rows"] else "WRONG"
        print(f"  read back {one['name']:<36} {one['read']:,} of {one['rows']:,} rows: {verdict}")
    for one in figures["streaming"]:
        print(
            f"  streaming round {one['round']} {one['name']:<24} {one['rows']:>9,} rows "
            f"p50 {one['p50_ms']:7.1f} ms  p99 {one['p99_ms']:7.1f} ms  "
            f"CPU {one['cpu'] / one['rows'] * 1e6 if one['rows'] else math.nan:6.2f} us/row  "
            f"micro-batch {one.get('median_triggerExecution_ms', 0):.0f} ms "
            f"(sink {one.get('median_addBatch_ms', 0):.0f})"
        )
    for name, ratios in figures["streaming_over_baseline"].items():
        print(
            f"  streaming {name}: p50 {_ratio(ratios['p50'])}x, p99 {_ratio(ratios['p99'])}x "
            f"{_BASELINE}'s (medians of the per-round ratios)"
        )


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--compare",
        choices=["masters", "sinks"],
        default="masters",
        help="masters: local[1] and local[2] against one producer process (Tansu, null "
        "storage); sinks: Spark's own Kafka sink beside producerkit's (Apache Kafka)",
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="10000000 for the long run")
    parser.add_argument(
        "--size", type=int, help="value bytes (default: 100; 512 with --compare sinks)"
    )
    parser.add_argument("--partitions", type=int, default=4, help="Spark partitions")
    parser.add_argument("--topic-partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2, help="timed Spark rounds (best kept)")
    parser.add_argument("--limit", type=int, default=10_000, help="max_in_flight_messages")
    parser.add_argument(
        "--masters",
        default=_MASTERS,
        help="Spark masters to run, comma-separated (--compare sinks: one, local[2] by default)",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--spark-conf",
        action="append",
        metavar="NAME=VALUE",
        help="a setting of every Spark session the run starts (repeat the flag for more), "
        "e.g. spark.python.unix.domain.socket.enabled=true",
    )
    sinks = parser.add_argument_group("--compare sinks")
    sinks.add_argument(
        "--kafka-tuned",
        default=_KAFKA_TUNED,
        metavar="NAME=VALUE,...",
        help=f"the tuned Kafka sink's producer configs (default: {_KAFKA_TUNED})",
    )
    sinks.add_argument(
        "--only",
        action="append",
        metavar="SINK",
        help="only this sink (its name as printed; repeat the flag for more)",
    )
    sinks.add_argument("--no-verify", action="store_true", help="skip the read-back counts")
    sinks.add_argument("--driver-memory", help="Spark's driver memory (default: by --rows)")
    sinks.add_argument(
        "--stream-rate", type=int, default=5_000, help="the rate source's rows/s (default: 5000)"
    )
    sinks.add_argument(
        "--stream-seconds", type=float, default=0, help="each streaming query's run (0: none)"
    )
    sinks.add_argument("--stream-repeat", type=int, default=2, help="streaming rounds")
    _brokers.add_broker_flags(parser, nats=False)
    _brokers.add_kafka_broker_choice(parser, warmup=60.0)
    parser.set_defaults(kafka_broker=None)
    args = parser.parse_args(argv)
    if args.compare == "sinks":
        args.kafka_broker = args.kafka_broker or "apache"
        return _compare_sinks(args)
    args.size = args.size or 100

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
        "spark_conf": _spark_conf(args),
        "runs": table,
    }
    if "local[1] publish()" in rate:
        figures["local1_per_core_over_single"] = rate["local[1] publish()"] / rate["single process"]
        if "local[2] publish()" in rate:
            figures["local2_over_local1"] = rate["local[2] publish()"] / rate["local[1] publish()"]
    print(
        f"{args.rows:,} rows of {args.size} B to Tansu (null storage), {os.cpu_count()} CPUs"
        + "".join(f", {name}={value}" for name, value in _spark_conf(args).items())
    )
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
    confluent = table.get("single process, confluent-kafka", {}).get("python_cpu_us_per_row")
    for master in ("local[1]", "local[2]"):
        ours = table.get(f"{master} publish()", {}).get("python_cpu_us_per_row")
        if ours is not None and confluent:
            figures[f"{master}_publish_cpu_over_confluent"] = ours / confluent
            print(
                f"  {master} publish() Python CPU per row / confluent-kafka's "
                f"{ours / confluent:.2f}x (each its best round; target <= 0.4, issue 46)"
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(figures, file, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
