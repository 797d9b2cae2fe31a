"""The PySpark sink on a real local[2] session against the suite's Tansu and NATS brokers.

The SparkSession is conftest's ``spark``, one for the whole session (they take seconds to
start). Its master is ``local[2,3]``: two cores and up to three attempts per task, so the retry
test can fail a task once. Everything is read back with a plain aiokafka / nats-py client.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from conftest import read_jetstream, read_kafka, run_local_cluster, stored_on

from producerkit.errors import ConfigurationError
from producerkit.testing.brokers import LocalBroker
from producerkit.testing.pytest_plugin import NatsSessionBroker

pyspark = pytest.importorskip("pyspark")
pytestmark = pytest.mark.spark

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import producerkit.spark as pks  # noqa: E402

#: Rows of the read-back tests: 12,000 per partition (4), so each task fills the 10,000-message
#: window, and a publish() task gets two Arrow batches (Spark's default is 10,000 rows a batch).
#: (100,000 before: the same paths, taken more times.)
N = 48_000


def _topic() -> str:
    return f"spark-{uuid.uuid4().hex[:10]}"


def _read_js(url: str, subject: str, expected: int) -> list[dict[str, Any]]:
    # conftest.read_jetstream can lose a race in nats-py's fetch (a plain TimeoutError escapes
    # its except); each call reads with a fresh consumer from the start, so a retry is exact
    for _ in range(2):
        try:
            return anyio.run(read_jetstream, url, subject, expected)
        except TimeoutError:
            continue
    return anyio.run(read_jetstream, url, subject, expected)


def _rows(spark: SparkSession, n: int, partitions: int = 4) -> Any:
    return spark.range(n, numPartitions=partitions).select(
        F.col("id").cast("string").alias("key"),
        F.concat(F.lit("v-"), F.col("id")).alias("value"),
        F.col("id"),
    )


def test_publish_kafka_read_back(spark: SparkSession, kafka_broker: LocalBroker) -> None:
    topic = _topic()
    report = pks.publish(_rows(spark, N), kafka_broker.url, topic=topic)
    records = anyio.run(read_kafka, kafka_broker.url, topic, N)
    assert report.delivered == len(records) == N
    assert report.failed == 0
    assert len(report.partitions) == 4
    assert sum(p.delivered for p in report.partitions) == N
    assert {r["value"] for r in records} == {f"v-{i}".encode() for i in range(N)}
    assert all(r["key"] == r["value"][2:] for r in records)


def test_format_producerkit_read_back(
    spark: SparkSession, kafka_broker: LocalBroker, tmp_path: Path
) -> None:
    """No register() call: Spark 4 finds pyspark_producerkit.DefaultSource by itself."""
    topic = _topic()
    report_path = tmp_path / "report.jsonl"
    (
        _rows(spark, N)
        .drop("id")
        .write.format("producerkit")
        .option("url", kafka_broker.url)
        .option("topic", topic)
        .option("report_path", str(report_path))
        .mode("append")
        .save()
    )
    records = anyio.run(read_kafka, kafka_broker.url, topic, N)
    report = json.loads(report_path.read_text().splitlines()[-1])
    assert report["delivered"] == len(records) == N
    assert report["failed"] == 0
    assert len({(r["key"], r["value"]) for r in records}) == N


def test_kafka_sink_columns_on_jetstream(
    spark: SparkSession, nats_broker: NatsSessionBroker
) -> None:
    """Spark's Kafka sink contract: value, key, topic (per row), partition, headers."""
    base = _topic()
    df = spark.range(40, numPartitions=2).select(
        F.concat(F.lit("v"), F.col("id")).cast("binary").alias("value"),
        F.col("id").cast("string").alias("key"),
        F.when(F.col("id") % 2 == 0, F.lit(f"{base}-even")).alias("topic"),  # null: default
        (F.col("id") % 3).cast("int").alias("partition"),
        F.array(
            F.struct(
                F.lit("n").alias("key"), F.col("id").cast("string").cast("binary").alias("value")
            )
        ).alias("headers"),
    )
    (
        df.write.format("producerkit")
        .option("url", nats_broker.jetstream_url)
        .option("topic", base)
        .option("partitions", "3")
        .option("create_stream", "true")
        .mode("append")
        .save()
    )
    even = _read_js(nats_broker.jetstream_url, f"{base}-even.>", 20)
    odd = _read_js(nats_broker.jetstream_url, f"{base}.>", 20)
    assert len(even) == len(odd) == 20
    for record in even + odd:
        number = int(record["headers"]["n"])
        assert record["value"] == f"v{number}".encode()
        assert record["subject"].endswith(f".{number % 3}")
        assert record["subject"].startswith(f"{base}-even." if number % 2 == 0 else f"{base}.")


def _fail_once_at(row: int, stored: Callable[[], None]) -> Any:
    """A UDF that passes values through, but on a task's first attempt fails at ``row`` once
    ``stored()`` returned (the publisher downstream stored rows of that attempt): the retry
    then publishes them again."""

    def check(value: str, number: int) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if number == row and context is not None and context.attemptNumber() == 0:
            stored()
            raise RuntimeError(f"injected failure at row {row}")
        return value

    return F.udf(check, "string")


def test_retry_is_exactly_once_on_jetstream_with_id_col(
    spark: SparkSession, nats_broker: NatsSessionBroker
) -> None:
    n, half_of_first_partition = 2000, 500
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:

        def df(subject: str) -> Any:
            rows = spark.range(n, numPartitions=2)
            # 1 kB values: the first half of a partition overflows Spark's 64 kB pipe buffers,
            # so it reaches the publisher before the failure
            padded = F.concat(F.lit("v-"), F.col("id"), F.lit("-"), F.repeat(F.lit("x"), 1000))
            stored = stored_on(nats_broker.jetstream_url, subject, half_of_first_partition)
            fail = _fail_once_at(half_of_first_partition, stored)
            return rows.select(fail(padded, F.col("id")).alias("value"), F.col("id"))

        with_ids, without_ids = _topic(), _topic()
        report = pks.publish(
            df(with_ids),
            nats_broker.jetstream_url,
            topic=with_ids,
            id_col="id",
            create_stream=True,
        )
        control = pks.publish(
            df(without_ids), nats_broker.jetstream_url, topic=without_ids, create_stream=True
        )
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert report.delivered == control.delivered == n
    assert report.retried_partitions == control.retried_partitions == 1

    stored = _read_js(nats_broker.jetstream_url, with_ids, n)
    assert len(stored) == n
    assert sorted(int(r["headers"]["Nats-Msg-Id"]) for r in stored) == list(range(n))
    # the same failure without ids stores the first attempt's rows twice: the retry did happen
    duplicated = _read_js(nats_broker.jetstream_url, without_ids, n)
    assert len(duplicated) > n
    assert {r["value"].split(b"-")[1] for r in duplicated} == {b"%d" % i for i in range(n)}


def test_on_error_count_and_fail(spark: SparkSession, nats_broker: NatsSessionBroker) -> None:
    """No stream for the subject: every message fails; counted, or the job fails."""
    df = _rows(spark, 100, partitions=2)
    report = pks.publish(
        df, nats_broker.jetstream_url, topic=_topic(), on_error="count", timeout=5.0
    )
    assert (report.delivered, report.failed) == (0, 100)
    assert set(report.errors) == {"DeliveryError"}
    assert report.first_error
    with pytest.raises(Exception, match="message\\(s\\) failed"):
        pks.publish(df, nats_broker.jetstream_url, topic=_topic(), timeout=5.0)


def test_bad_configuration_fails_on_the_driver(spark: SparkSession) -> None:
    df = _rows(spark, 10)
    with pytest.raises(ConfigurationError, match="is not a column"):
        pks.publish(df, "null://", topic="t", value_col="missing")
    with pytest.raises(ConfigurationError, match="cast it to string or binary"):
        pks.publish(df, "null://", topic="t", value_col="id")
    with pytest.raises(ConfigurationError, match="no topic"):
        pks.publish(df, "null://")
    with pytest.raises(ConfigurationError, match="unknown option"):
        pks.publish(df, "null://", topic="t", no_such_option=1)
    with pytest.raises(ConfigurationError, match="batch DataFrame"):
        pks.publish(spark.readStream.format("rate").load(), "null://", topic="t")


@pytest.mark.anyio
async def test_publish_inside_a_running_event_loop(spark: SparkSession) -> None:
    """Notebooks run a loop in the driver thread: publish() must not care."""
    report = pks.publish(_rows(spark, 1000, partitions=2), "null://", topic="t")
    assert (report.delivered, report.failed) == (1000, 0)


def _json_files(tmp_path: Path, files: int) -> Path:
    """A directory of ``files`` JSON files of 10 rows each, ``{"key": "k<i>", "value": "v<i>"}``
    for i in 0..10 * files - 1, in order: one micro-batch a file with ``maxFilesPerTrigger=1``."""
    source = tmp_path / "in"
    source.mkdir()
    for part in range(files):
        numbers = range(part * 10, part * 10 + 10)
        lines = [json.dumps({"key": f"k{i}", "value": f"v{i}"}) for i in numbers]
        (source / f"part-{part}.json").write_text("\n".join(lines))
    return source


def test_streaming_format_and_batch_publisher(
    spark: SparkSession, kafka_broker: LocalBroker, tmp_path: Path
) -> None:
    source = _json_files(tmp_path, 3)
    stream = spark.readStream.schema("key string, value string").option("maxFilesPerTrigger", 1)

    topic, report_path = _topic(), tmp_path / "stream.jsonl"
    query = (
        stream.json(str(source))
        .writeStream.format("producerkit")
        .option("url", kafka_broker.url)
        .option("topic", topic)
        .option("report_path", str(report_path))
        .option("checkpointLocation", str(tmp_path / "checkpoint-format"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    records = anyio.run(read_kafka, kafka_broker.url, topic, 30)
    assert sorted(r["value"] for r in records) == sorted(f"v{i}".encode() for i in range(30))
    batches = [json.loads(line) for line in report_path.read_text().splitlines()]
    assert [b["batch_id"] for b in batches] == [0, 1, 2]
    assert sum(b["delivered"] for b in batches) == 30

    topic2, seen = _topic(), []
    query = (
        stream.json(str(source))
        .writeStream.foreachBatch(
            pks.batch_publisher(
                kafka_broker.url, topic=topic2, on_report=lambda i, r: seen.append((i, r.delivered))
            )
        )
        .option("checkpointLocation", str(tmp_path / "checkpoint-foreach"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert seen == [(0, 10), (1, 10), (2, 10)]
    assert len(anyio.run(read_kafka, kafka_broker.url, topic2, 30)) == 30


def test_stream_writer_publishes_each_micro_batch(
    spark: SparkSession, kafka_broker: LocalBroker, tmp_path: Path
) -> None:
    stream = (
        spark.readStream.schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .json(str(_json_files(tmp_path, 3)))
    )
    topic = _topic()
    query = (
        pks.stream_writer(stream, kafka_broker.url, topic=topic)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert len(query.recentProgress) == 3  # one micro-batch a file
    records = anyio.run(read_kafka, kafka_broker.url, topic, 30)
    assert sorted(r["value"] for r in records) == sorted(f"v{i}".encode() for i in range(30))
    assert {r["key"] for r in records} == {f"k{i}".encode() for i in range(30)}


def test_stream_writer_refuses_what_needs_a_commit_and_fails_the_query_on_failure(
    spark: SparkSession, nats_broker: NatsSessionBroker, tmp_path: Path
) -> None:
    rate = spark.readStream.format("rate").load().selectExpr("CAST(value AS STRING) AS value")
    for refused in ({"exactly_once": True}, {"on_error": "count"}):
        with pytest.raises(ConfigurationError, match=f"does not take {next(iter(refused))}"):
            pks.stream_writer(rate, "null://", topic="t", **refused)
    # what it does anyway is no error; a job's rate is split over the task slots
    pks.stream_writer(rate, "null://", topic="t", exactly_once=False, on_error="fail")
    pks.stream_writer(rate, "null://", topic="t", max_rate=1000)
    with pytest.raises(ConfigurationError, match="streaming DataFrame"):
        pks.stream_writer(_rows(spark, 10), "null://", topic="t")
    with pytest.raises(ConfigurationError, match="is not a column"):
        pks.stream_writer(rate, "null://", topic="t", value_col="missing")

    stream = spark.readStream.schema("key string, value string").json(str(_json_files(tmp_path, 1)))
    query = (
        # no stream for the subject: every message fails
        pks.stream_writer(stream, nats_broker.jetstream_url, topic=_topic(), timeout=5.0)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="message\\(s\\) failed"):
        query.awaitTermination(120)


# ---------------------------------------------------------------------- serializers


def _orders(spark: SparkSession, n: int) -> Any:
    """A struct value column with what JSON has: numbers, strings, null, arrays, a nested
    struct and a map (a JSON object either way)."""
    rows = spark.range(n, numPartitions=2)
    return rows.select(
        F.col("id").cast("string").alias("key"),
        F.struct(
            F.col("id").alias("id"),
            F.concat(F.lit("user-"), (F.col("id") % 7).cast("string")).alias("user"),
            (F.col("id") / 4).alias("amount"),
            F.when(F.col("id") % 2 == 0, F.lit("even")).alias("note"),  # null for odd ids
            F.array(F.col("id"), F.col("id") + 1).alias("items"),
            F.struct((F.col("id") % 3).alias("zone")).alias("ship_to"),
            F.create_map(F.lit("tax"), F.col("id") % 5).alias("extra"),
        ).alias("value"),
    )


def _order(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "user": f"user-{i % 7}",
        "amount": i / 4,
        "note": "even" if i % 2 == 0 else None,
        "items": [i, i + 1],
        "ship_to": {"zone": i % 3},
        "extra": {"tax": i % 5},
    }


def test_struct_column_as_json_to_kafka(spark: SparkSession, kafka_broker: LocalBroker) -> None:
    """publish(value_serializer="json"): each struct a compact JSON object, read back equal; a
    key_serializer lambda travels to the executors by value, as a UDF does."""
    n, topic = 2000, _topic()
    report = pks.publish(
        _orders(spark, n),
        kafka_broker.url,
        topic=topic,
        value_serializer="json",
        key_serializer=lambda key: b"order-" + key.encode(),
    )
    records = anyio.run(read_kafka, kafka_broker.url, topic, n)
    assert (report.delivered, report.failed) == (len(records), 0) == (n, 0)
    decoded = {r["key"]: json.loads(r["value"]) for r in records}
    assert decoded == {f"order-{i}".encode(): _order(i) for i in range(n)}
    assert b" " not in records[0]["value"]  # compact


def test_format_producerkit_serializers_on_jetstream(
    spark: SparkSession, nats_broker: NatsSessionBroker
) -> None:
    """By name, as options: a map value and a struct key, each as JSON. On NATS the key picks
    the partition (the subject's last token): it is the JSON key's partition."""
    from producerkit.partitioners import xxhash

    n, topic = 500, _topic()
    df = spark.range(n, numPartitions=2).select(
        F.struct(F.col("id").alias("n")).alias("key"),
        F.create_map(F.lit("id"), F.col("id"), F.lit("square"), F.col("id") * F.col("id")).alias(
            "value"
        ),
    )
    (
        df.write.format("producerkit")
        .option("url", nats_broker.jetstream_url)
        .option("topic", topic)
        .option("create_stream", "true")
        .option("partitions", "3")
        .option("value_serializer", "json")
        .option("key_serializer", "json")
        .mode("append")
        .save()
    )
    stored = _read_js(nats_broker.jetstream_url, f"{topic}.>", n)
    values = [json.loads(r["value"]) for r in stored]
    assert sorted(values, key=lambda v: v["id"]) == [{"id": i, "square": i * i} for i in range(n)]
    for record, value in zip(stored, values, strict=True):
        key = json.dumps({"n": value["id"]}, separators=(",", ":")).encode()
        assert record["subject"] == f"{topic}.{xxhash(key, 3)}"


def test_a_callable_serializer_is_shipped_to_the_executors(
    spark: SparkSession, kafka_broker: LocalBroker
) -> None:
    """serializers.avro(...) returns a closure: pickled on the driver, used on every executor."""
    fastavro = pytest.importorskip("fastavro")
    from producerkit import serializers

    schema = {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "user", "type": "string"},
            {"name": "items", "type": {"type": "array", "items": "long"}},
        ],
    }
    n, topic = 300, _topic()
    df = _orders(spark, n).select(
        "key", F.struct("value.id", "value.user", "value.items").alias("value")
    )
    report = pks.publish(
        df, kafka_broker.url, topic=topic, value_serializer=serializers.avro(schema, 42)
    )
    assert (report.delivered, report.failed) == (n, 0)
    records = anyio.run(read_kafka, kafka_broker.url, topic, n)
    parsed = fastavro.parse_schema(schema)
    decoded = {}
    for record in records:
        assert record["value"][:5] == b"\x00\x00\x00\x00\x2a"  # Confluent: magic 0, id 42
        body = io.BytesIO(record["value"][5:])
        decoded[int(record["key"])] = fastavro.schemaless_reader(body, parsed, parsed)
    expected = {i: {"id": i, "user": f"user-{i % 7}", "items": [i, i + 1]} for i in range(n)}
    assert decoded == expected


def test_bad_serializers_fail_on_the_driver_bad_rows_on_executors(spark: SparkSession) -> None:
    import threading

    df = _orders(spark, 10)
    lock = threading.Lock()
    with pytest.raises(ConfigurationError, match="cannot be pickled"):
        pks.publish(df, "null://", topic="t", value_serializer=lambda v: bool(lock) and b"")
    with pytest.raises(ConfigurationError, match="cannot be pickled"):
        pks.batch_publisher("null://", topic="t", key_serializer=lambda k: bool(lock) and b"")
    with pytest.raises(ConfigurationError, match="value_serializer='json'"):
        pks.publish(df, "null://", topic="t")  # a struct needs a serializer
    with pytest.raises(ConfigurationError, match="unknown value_serializer 'jsn'"):
        pks.publish(df, "null://", topic="t", value_serializer="jsn")
    with pytest.raises(ConfigurationError, match="takes a binary column"):
        pks.publish(df, "null://", topic="t", value_serializer="json", key_serializer="bytes")
    # a row "json" cannot write (a decimal) fails on the executor, counted like any failed row
    decimals = df.select(F.struct(F.lit(1.5).cast("decimal(4,2)").alias("d")).alias("value"))
    report = pks.publish(decimals, "null://", topic="t", value_serializer="json", on_error="count")
    assert (report.delivered, report.failed) == (0, 10)
    assert report.errors == {"SerializationError": 10}
    assert "Decimal" in (report.first_error or "")
    # raised in the Python worker Spark runs the DataSource in; Spark re-raises it
    with pytest.raises(Exception, match="unknown value_serializer 'yaml'"):
        df.write.format("producerkit").option("url", "null://").option("topic", "t").option(
            "value_serializer", "yaml"
        ).mode("append").save()


def test_bad_executor_python_is_explained(spark: SparkSession) -> None:
    """A PYSPARK_PYTHON that does not exist is caught on the driver with the fix in the message."""
    old = os.environ["PYSPARK_PYTHON"]
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.pyspark.python") is None
    os.environ["PYSPARK_PYTHON"] = "/nonexistent/python3"
    try:
        with pytest.raises(ConfigurationError, match="PYSPARK_PYTHON="):
            pks.publish(_rows(spark, 10), "null://", topic="t")
    finally:
        os.environ["PYSPARK_PYTHON"] = old


# ---------------------------------------------------------------------- local-cluster


@pytest.fixture(scope="module")
def local_cluster(kafka_broker: LocalBroker, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One ``local-cluster[2,1,1024]`` run (two executor JVMs, each with its own Python workers)
    for both tests below: starting such a cluster takes most of a minute on a busy two-core
    machine, and what runs on it is independent. On the same 20,000 rows it runs ``publish`` to
    ``publish_topic`` (RESULT ``publish``: delivered, failed, executor JVMs), then
    ``df.foreachPartition(partition_writer(...))`` to ``foreach_topic`` with PartitionCounters
    and a report file (RESULT ``foreach_partition``: the counters' delivered and failed, the
    report's delivered and partitions)."""
    workdir = tmp_path_factory.mktemp("local-cluster")
    publish_topic, foreach_topic = _topic(), _topic()
    report_path = str(workdir / "report.jsonl")
    url = kafka_broker.url
    body = f"""
report = pks.publish(df, {url!r}, topic={publish_topic!r})
jvms = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()  # executors + driver
print("RESULT publish", report.delivered, report.failed, jvms - 1)
counters = pks.PartitionCounters(spark)
df.foreachPartition(pks.partition_writer({url!r}, topic={foreach_topic!r},
                                         counters=counters, report_path={report_path!r}))
report = pks.read_report({report_path!r})
print("RESULT foreach_partition", counters.delivered, counters.failed, report.delivered,
      len(report.partitions))
"""
    return SimpleNamespace(
        results=run_local_cluster(body, workdir),
        publish_topic=publish_topic,
        foreach_topic=foreach_topic,
    )


def test_local_cluster_separate_executor_jvms(
    kafka_broker: LocalBroker, local_cluster: Any
) -> None:
    """local-cluster[2,1,1024]: two executor JVMs, each with its own Python workers. Runs in a
    subprocess, since one Python process holds one SparkContext."""
    delivered, failed, executors = local_cluster.results["publish"]
    assert (delivered, failed, executors) == (20000, 0, 2)
    records = anyio.run(read_kafka, kafka_broker.url, local_cluster.publish_topic, 20000)
    assert len(records) == 20000


def test_local_cluster_foreach_partition(kafka_broker: LocalBroker, local_cluster: Any) -> None:
    """local-cluster[2,1,1024]: foreachPartition(partition_writer) on two executor JVMs; the
    report file and the accumulators agree with what aiokafka reads back. (With the
    partition_writer tests in test_spark_partition_writer.py before: here, it shares the
    cluster above.)"""
    assert local_cluster.results["foreach_partition"] == [20000, 0, 20000, 4]
    assert len(anyio.run(read_kafka, kafka_broker.url, local_cluster.foreach_topic, 20000)) == 20000


def test_streaming_rate_example() -> None:
    """spark_examples/streaming_rate.py as its docstring says to run it, from the repository root
    (it starts its own broker and Spark session, so in a subprocess), publishing for 3 seconds:
    the per-batch reports add up to what the stream holds. It used to stop the query after a
    fixed sleep counted from start(), which on a busy machine was before the first micro-batch
    committed (no report file, no stream) or in the middle of one (rows in the stream that no
    report counts)."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "spark_examples/streaming_rate.py", "3"],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=root,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    summary = re.search(
        r"^(\d+) micro-batches, (\d+) delivered; the stream holds (\d+)$", done.stdout, re.MULTILINE
    )
    assert summary is not None, done.stdout[-2000:]
    batches, delivered, stored = map(int, summary.groups())
    assert batches >= 2 and delivered == stored > 0


# ---------------------------------------------------------------------- the worker, without Spark


def test_worker_caches_one_producer_per_config_and_rebuilds_after_fork(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from producerkit import SyncProducer
    from producerkit.backends.memory import get_store
    from producerkit.spark import _worker

    made: list[SyncProducer] = []  # every producer the worker builds, in order
    make_producer = _worker.SinkConfig.make_producer

    def counted(config: _worker.SinkConfig) -> SyncProducer:
        made.append(make_producer(config))
        return made[-1]

    monkeypatch.setattr(_worker.SinkConfig, "make_producer", counted)
    name = f"spark-worker-{uuid.uuid4().hex}"
    store = get_store(name)
    config = _worker.SinkConfig(url=f"memory://{name}", topic="t", key_col=None, id_col="id")
    first = _worker.publish_task(config, [{"value": [b"a", b"b"], "id": [1, 2]}])
    second = _worker.publish_task(config, [{"value": [b"c"], "id": [3]}])
    assert len(made) == 1  # one producer for the config, kept between tasks
    assert (first.delivered, second.delivered) == (2, 1)
    stored = [(r.value, r.msg_id) for r in store.topic("t")]
    assert stored == [(b"a", "1"), (b"b", "2"), (b"c", "3")]

    child = os.fork()
    if child == 0:  # the child must build its own producer: the parent's loop thread is not here
        try:
            counts = _worker.publish_task(config, [{"value": [b"d"], "id": [4]}])
            fresh = len(made) == 2 and made[1] is not made[0]
            os._exit(0 if counts.delivered == 1 and fresh else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not made[0].producer.closed  # the parent's producer is the parent's still
    _worker.close_all()
    assert made[0].producer.closed
    third = _worker.publish_task(config, [{"value": [b"e"], "id": [5]}])
    assert third.delivered == 1 and len(made) == 2  # nothing cached any more: a new one
    _worker.close_all()


def test_worker_counts_or_raises_bad_rows() -> None:
    from producerkit.errors import MessageError
    from producerkit.spark import _worker

    url = f"memory://{uuid.uuid4().hex}"
    counting = _worker.SinkConfig(url=url, topic="t", on_error="count")
    counts = _worker.publish_task(counting, [{"value": [b"a", None, "c"], "key": ["k", "k", None]}])
    assert (counts.rows, counts.delivered, counts.failed) == (3, 2, 1)
    assert counts.errors == {"MessageError": 1}
    failing = _worker.SinkConfig(url=url, topic="t", on_error="fail")
    with pytest.raises(MessageError, match="null"):  # the row's own error fails the task
        _worker.publish_task(failing, [{"value": [b"a", None]}])
    rows = [{"value": "x", "key": None}, {"value": "y", "key": "k"}]
    assert list(_worker.chunks_from_rows(rows, {"value": "value", "key": "key"}, size=1)) == [
        {"value": ["x"], "key": [None]},
        {"value": ["y"], "key": ["k"]},
    ]
    _worker.close_all()


def test_worker_ships_serializers_and_makes_structs_plain() -> None:
    """A callable crosses as the bytes the driver pickled (one cached producer for it); Rows
    (the row-based writers) and Arrow maps reach the serializer as dicts."""
    import pyarrow as pa
    from pyspark.sql import Row

    from producerkit.backends.memory import get_store
    from producerkit.spark import _publish, _worker
    from producerkit.spark._chunks import _maps_as_dicts, _pylist

    name = f"spark-serializers-{uuid.uuid4().hex}"
    store = get_store(name)
    config = _publish.make_config(
        f"memory://{name}",
        topic="t",
        on_error="count",
        value_serializer="json",
        key_serializer=lambda key: key["id"].encode(),
    )
    assert isinstance(config.key_serializer, bytes)
    again = _worker.SinkConfig.from_dict(config.to_dict())
    assert again.cache_key() == config.cache_key()
    rows = [
        Row(key=Row(id="a"), value=Row(n=1, tags=[Row(t="x")], m={"k": Row(z=None)})),
        Row(key=Row(id="b"), value=None),
    ]
    chunks = list(_worker.chunks_from_rows(rows, config.columns(), structured=("value", "key")))
    assert chunks == [
        {
            "key": [{"id": "a"}, {"id": "b"}],
            "value": [{"n": 1, "tags": [{"t": "x"}], "m": {"k": {"z": None}}}, None],
        }
    ]
    counts = _worker.publish_task(again, chunks[:1])
    assert (counts.rows, counts.delivered, counts.failed) == (2, 1, 1)  # the null value
    assert [(r.key, r.value) for r in store.topic("t")] == [
        (b"a", b'{"n":1,"tags":[{"t":"x"}],"m":{"k":{"z":null}}}')
    ]

    map_type = pa.map_(pa.string(), pa.struct([("m", pa.map_(pa.string(), pa.int64()))]))
    column = pa.array([[[("a", {"m": [("x", 1)]})]], None, []], type=pa.list_(map_type))
    fallback = [_maps_as_dicts(value, column.type) for value in column.to_pylist()]
    assert fallback == _pylist(column, True) == [[{"a": {"m": {"x": 1}}}], None, []]
    assert _pylist(column, False) == column.to_pylist()  # headers keep their pairs
    _worker.close_all()


def test_worker_explains_a_serializer_it_cannot_unpickle() -> None:
    # what cloudpickle makes of a function in a module the executors do not have
    by_reference = b"cno_such_module_here\nserialize\n."
    config = _worker_config(value_serializer=by_reference)
    with pytest.raises(ConfigurationError, match="could not be unpickled") as caught:
        config.make_producer()
    assert "No module named 'no_such_module_here'" in str(caught.value)
    assert "must be able to import that module" in str(caught.value)


def _worker_config(**fields: Any) -> Any:
    from producerkit.spark import _worker

    return _worker.SinkConfig(url="null://", topic="t", **fields)
