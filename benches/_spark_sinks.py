"""The Spark side of ``bench_spark.py --compare sinks``: Spark's own Kafka sink beside
producerkit's, in one Spark session, on one Kafka broker.

Run by bench_spark.py as ``python benches/_spark_sinks.py SETTINGS_JSON`` (the keys are
:func:`main`'s); prints one JSON object a line, each line starting with what it is:

- ``ROUND``: one timed batch write of the whole DataFrame by one sink: its seconds, the CPU
  seconds of the whole process tree (this Python driver, Spark's JVM, PySpark's daemon and its
  Python workers) over it, and the offsets it added to the topic;
- ``VERIFY``: the same DataFrame written by one sink into a topic of its own and read back by a
  confluent-kafka consumer (``read_committed``): the rows counted;
- ``STREAM``: a streaming query from the ``rate`` source at a fixed rate through one sink, its
  end-to-end latency per row: the row's ``timestamp`` (carried in its value) to the record's
  log-append time on the broker, read back by a consumer.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

import psutil
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from producerkit.spark import publish, stream_writer

#: The timed topic's own limits: its partitions keep a few writes' worth of log, so that
#: rounds of 10 million rows do not fill the disk (the broker checks every few seconds).
_BOUNDED_LOG = {"retention.bytes": str(256 << 20), "segment.bytes": str(64 << 20)}


def broker_cpu(pid: int | None) -> float | None:
    """The broker's user + system CPU seconds, where its process runs here."""
    if pid is None:
        return None
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


class TreeCpu:
    """The CPU of this process and every descendant (Spark's JVM, PySpark's daemon and its
    Python workers), by kind: ``jvm``, ``python``, ``driver`` (this process), and ``total``.

    A thread reads each process's own user + system CPU every ``interval`` seconds and keeps
    the last reading of every process it has seen, so a process that exits between two
    :meth:`read` calls (PySpark kills a worker idle for a minute; a killed daemon's workers are
    orphaned, so no parent in the tree reaps their CPU) still counts, up to its last reading.
    Reaped children's CPU is not added: each process counts once, as itself."""

    def __init__(self, interval: float = 0.2) -> None:
        self._seen: dict[tuple[int, float], tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._interval = interval
        threading.Thread(target=self._sample_forever, daemon=True).start()

    def _sample_forever(self) -> None:
        while True:
            self._sample()
            time.sleep(self._interval)

    def _sample(self) -> None:
        me = psutil.Process()
        for process in [me, *me.children(recursive=True)]:
            try:
                times = process.cpu_times()
                name, started = process.name(), process.create_time()
            except psutil.NoSuchProcess:
                continue
            kind = "driver" if process.pid == me.pid else "jvm" if name == "java" else "python"
            with self._lock:
                self._seen[(process.pid, started)] = (kind, times.user + times.system)

    def read(self) -> dict[str, float]:
        """CPU seconds so far, by kind (read now, not at the last interval)."""
        self._sample()
        kinds = {"jvm": 0.0, "python": 0.0, "driver": 0.0}
        with self._lock:
            for kind, seconds in self._seen.values():
                kinds[kind] += seconds
        return {**kinds, "total": sum(kinds.values())}


_tree_cpu: TreeCpu | None = None


def tree_cpu() -> dict[str, float]:
    """:meth:`TreeCpu.read` of this process's one sampler (started on first use)."""
    global _tree_cpu
    if _tree_cpu is None:
        _tree_cpu = TreeCpu()
    return _tree_cpu.read()


def _used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {kind: after[kind] - before[kind] for kind in after}


class Kafka:
    """The broker's admin and read-back calls, through confluent-kafka."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin = AdminClient({"bootstrap.servers": bootstrap})

    def create(self, topic: str, partitions: int, config: dict[str, str] | None = None) -> None:
        futures = self.admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])
        futures[topic].result(30)
        time.sleep(0.5)  # every partition's leader known to the broker's metadata cache

    def delete(self, topic: str) -> None:
        self.admin.delete_topics([topic])[topic].result(30)

    def _consumer(self) -> Any:
        return Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "bench-spark-read",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "log_level": 3,
            }
        )

    def end_offsets(self, topic: str, partitions: int) -> int:
        """The sum of the partitions' high watermarks (a transaction's commit marker counts)."""
        consumer = self._consumer()
        try:
            return sum(
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)
            )
        finally:
            consumer.close()

    def each_record(
        self, topic: str, partitions: int, visit: Callable[[Any], None], timeout: float = 300
    ) -> int:
        """Read every record of ``topic`` from the beginning up to each partition's end
        (``read_committed``: its last stable offset), calling ``visit`` on each; how many."""
        consumer = self._consumer()
        count, pending = 0, set(range(partitions))
        deadline = time.monotonic() + timeout
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
            while pending and time.monotonic() < deadline:
                for message in consumer.consume(10_000, 0.5):
                    if message.error() is None:
                        count += 1
                        visit(message)
                    elif message.error().code() == -191:  # _PARTITION_EOF
                        pending.discard(message.partition())
        finally:
            consumer.close()
        if pending:
            raise TimeoutError(f"{topic}: partitions {sorted(pending)} not read to their end")
        return count


def sinks(
    kafka: Kafka, url: str, tuned: dict[str, str]
) -> dict[str, Callable[[DataFrame, str], None]]:
    """Each sink of the comparison: a function writing a DataFrame into a topic."""

    def spark_kafka(options: dict[str, str]) -> Callable[[DataFrame, str], None]:
        def write(frame: DataFrame, topic: str) -> None:
            writer = frame.write.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap)
            writer.option("topic", topic).options(**options).mode("append").save()

        return write

    def producerkit_publish(**options: Any) -> Callable[[DataFrame, str], None]:
        def write(frame: DataFrame, topic: str) -> None:
            report = publish(frame, url, topic=topic, **options)
            assert report.failed == 0, report

        return write

    def producerkit_format(options: dict[str, str]) -> Callable[[DataFrame, str], None]:
        def write(frame: DataFrame, topic: str) -> None:
            writer = frame.write.format("producerkit").option("url", url).option("topic", topic)
            writer.options(**options).mode("append").save()

        return write

    tuned_options = {f"kafka.{name}": value for name, value in tuned.items()}
    return {
        'format("kafka")': spark_kafka({}),
        'format("kafka"), tuned': spark_kafka(tuned_options),
        "publish()": producerkit_publish(),
        "publish(exactly_once)": producerkit_publish(exactly_once=True),
        'format("producerkit")': producerkit_format({}),
        'format("producerkit", exactly_once)': producerkit_format({"exactly_once": "true"}),
    }


#: Not a sink: the floor under producerkit's, what Spark's Arrow path to a Python worker costs
#: by itself (a ``mapInArrow`` reading every batch and publishing nothing). Never read back.
FLOOR = "mapInArrow, no producer"


def _count_rows(batches: Any) -> Any:
    import pyarrow as pa

    count = 0
    for batch in batches:
        count += batch.num_rows
    yield pa.RecordBatch.from_pylist([{"rows": count}])


def _arrow_floor(rows: int, frame: DataFrame, topic: str) -> None:
    del topic  # nothing is written
    counted = frame.mapInArrow(_count_rows, "rows long").collect()
    assert sum(row.rows for row in counted) == rows


def emit(kind: str, figures: dict[str, Any]) -> None:
    print(f"{kind} {json.dumps(figures)}", flush=True)


def batch(spark: SparkSession, kafka: Kafka, settings: dict[str, Any]) -> None:
    rows, partitions = settings["rows"], settings["topic_partitions"]
    ways = {**sinks(kafka, settings["url"], settings["tuned"]), FLOOR: partial(_arrow_floor, rows)}
    if settings["only"]:
        ways = {name: ways[name] for name in settings["only"]}
    frame = spark.range(rows, numPartitions=settings["partitions"]).select(
        F.lpad(F.col("id").cast("string"), 8, "0").alias("key"),
        F.lpad(F.col("id").cast("string"), settings["size"], "x").alias("value"),
    )
    frame = frame.cache()
    frame.count()
    topic = f"bench-spark-sinks-{time.monotonic_ns()}"  # new each run: deletions take a while
    kafka.create(topic, partitions, _BOUNDED_LOG)
    # warm-up: every sink writes the whole DataFrame once, untimed (each Python worker starts
    # and connects, the JVM loads each sink's classes and its JIT compiles their paths)
    for write in ways.values():
        write(frame, topic)
    names = list(ways)
    for number in range(settings["repeat"]):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            offsets = kafka.end_offsets(topic, partitions)
            broker = broker_cpu(settings["broker_pid"])
            cpu, started = tree_cpu(), time.perf_counter()
            ways[name](frame, topic)
            seconds, cpu = time.perf_counter() - started, _used(cpu, tree_cpu())
            after = broker_cpu(settings["broker_pid"])
            added = kafka.end_offsets(topic, partitions) - offsets
            emit(
                "ROUND",
                {
                    "round": number + 1,
                    "name": name,
                    "seconds": seconds,
                    "cpu": cpu["total"],
                    "cpu_jvm": cpu["jvm"],
                    "cpu_python": cpu["python"],
                    "cpu_driver": cpu["driver"],
                    "offsets": added,
                    "broker_cpu": None if broker is None or after is None else after - broker,
                },
            )
    if settings["verify"]:
        for number, (name, write) in enumerate(ways.items()):
            if name == FLOOR:
                continue
            checked = f"bench-spark-verify-{number}-{time.monotonic_ns()}"
            kafka.create(checked, partitions)
            write(frame, checked)
            count = kafka.each_record(checked, partitions, lambda _: None)
            kafka.delete(checked)
            emit("VERIFY", {"name": name, "rows": rows, "read": count})
    frame.unpersist()


#: Not a sink: the floor under producerkit's streaming sink, a Python data source whose writer
#: reads every Arrow batch and publishes nothing (what a micro-batch through any Python data
#: source costs). Nothing to read back: its latencies are none, its micro-batch phases are.
STREAM_FLOOR = "Python data source, no producer"

#: The sink of the streaming query written with ``producerkit.spark.stream_writer`` (a
#: ``mapInArrow`` stage into Spark's ``noop`` sink) rather than ``format(...)``.
STREAM_WRITER = "stream_writer"


class _CountingWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    def write(self, iterator: Any) -> WriterCommitMessage:
        for _batch in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[Any], batchId: int) -> None:
        pass

    def abort(self, messages: list[Any], batchId: int) -> None:
        pass


class NoProducerSink(DataSource):  # type: ignore[misc]
    """:data:`STREAM_FLOOR`'s data source."""

    @classmethod
    def name(cls) -> str:
        return "bench_no_producer"

    def streamWriter(self, schema: Any, overwrite: bool) -> _CountingWriter:
        return _CountingWriter()


def _latency(pairs: list[tuple[float, float]], message: Any) -> None:
    """Keep a streamed record's (row timestamp, latency to its log-append time), in ms."""
    produced = int(message.value().lstrip(b"x")) / 1000  # epoch µs -> ms
    pairs.append((produced, message.timestamp()[1] - produced))


def streaming(spark: SparkSession, kafka: Kafka, settings: dict[str, Any]) -> None:
    """Each streaming sink in turn, ``stream_seconds`` at ``stream_rate`` rows/s from the
    ``rate`` source, rounds interleaved, after an untimed warm-up query through each (the JVM
    compiles the rate source's and each sink's paths, the Python workers start); the first
    quarter of each run (the query starting) is left out of the latencies."""
    rate, seconds, size = settings["stream_rate"], settings["stream_seconds"], settings["size"]
    source = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .option("numPartitions", settings["partitions"])
        .load()
        .select(
            F.col("value").cast("string").alias("key"),
            F.lpad(F.unix_micros("timestamp").cast("string"), size, "x").alias("value"),
        )
    )
    spark.dataSource.register(NoProducerSink)
    queries = {
        'format("kafka")': ("kafka", {"kafka.bootstrap.servers": kafka.bootstrap}),
        'format("producerkit")': ("producerkit", {"url": settings["url"]}),
        "stream_writer()": (STREAM_WRITER, {"url": settings["url"]}),
        STREAM_FLOOR: (NoProducerSink.name(), {}),
    }
    for sink, options in queries.values():
        _stream_once(kafka, source, sink, options, max(10.0, seconds / 2), settings)
    for round_number in range(settings["stream_repeat"]):
        for name, (sink, options) in queries.items():
            figures = _stream_once(kafka, source, sink, options, seconds, settings)
            emit("STREAM", {"round": round_number + 1, "name": name, **figures})


def _stream_once(
    kafka: Kafka,
    source: DataFrame,
    sink: str,
    options: dict[str, str],
    seconds: float,
    settings: dict[str, Any],
) -> dict[str, Any]:
    """One streaming query through ``sink`` for ``seconds`` into a topic of its own (records
    stamped with their log-append time), read back: its figures."""
    partitions = settings["topic_partitions"]
    topic = f"bench-spark-stream-{time.monotonic_ns()}"
    kafka.create(topic, partitions, {"message.timestamp.type": "LogAppendTime"})
    with tempfile.TemporaryDirectory() as checkpoint:
        if sink == STREAM_WRITER:
            writer = stream_writer(source, options["url"], topic=topic)
        else:
            writer = source.writeStream.format(sink).options(**options).option("topic", topic)
        query = writer.option("checkpointLocation", checkpoint).start()
        cpu, started = tree_cpu(), time.perf_counter()
        time.sleep(seconds)
        progress = query.recentProgress
        query.stop()
        cpu, wall = _used(cpu, tree_cpu()), time.perf_counter() - started
    pairs: list[tuple[float, float]] = []  # (the row's timestamp, its latency), ms
    count = kafka.each_record(topic, partitions, partial(_latency, pairs))
    kafka.delete(topic)
    begins = min(pairs)[0] + seconds * 1000 / 4 if pairs else 0.0
    steady = sorted(latency for produced, latency in pairs if produced >= begins) or [math.nan]
    return {
        "rows": count,
        "seconds": wall,
        "cpu": cpu["total"],
        "p50_ms": steady[len(steady) // 2],
        "p99_ms": steady[min(len(steady) - 1, int(len(steady) * 0.99))],
        "max_ms": steady[-1],
        "micro_batches": len(progress),
        # the median micro-batch's phases (Spark's durationMs: addBatch is the sink's write,
        # triggerExecution the whole micro-batch)
        **{
            f"median_{phase}_ms": statistics.median(
                one.durationMs.get(phase, 0) for one in progress
            )
            for phase in ("triggerExecution", "addBatch", "queryPlanning", "walCommit")
            if progress
        },
    }


def main() -> None:
    settings: dict[str, Any] = json.loads(sys.argv[1])
    builder = (
        SparkSession.builder.master(settings["master"])
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", settings["driver_memory"])
        .config("spark.jars", ",".join(settings["jars"]))
        .config("spark.sql.shuffle.partitions", str(settings["partitions"]))
    )
    for name, value in settings["spark_conf"].items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    kafka = Kafka(settings["bootstrap"])
    if settings["batch"]:
        batch(spark, kafka, settings)
    if settings["stream_seconds"] > 0:
        streaming(spark, kafka, settings)
    spark.stop()


if __name__ == "__main__":
    main()
