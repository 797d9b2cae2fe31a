"""partition_writer for df.foreachPartition / rdd.foreachPartition, and the job-wide max_rate, on a
real local[2] session (and local-cluster in a subprocess) against the suite's Tansu and NATS
brokers; everything read back with a plain aiokafka / nats-py client."""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import read_jetstream, read_kafka, stored_on

from producerkit.errors import ConfigurationError
from producerkit.testing.brokers import LocalBroker
from producerkit.testing.pytest_plugin import NatsSessionBroker

pyspark = pytest.importorskip("pyspark")
pytestmark = pytest.mark.spark

from pyspark import cloudpickle  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import producerkit.spark as pks  # noqa: E402
from producerkit.spark._publish import task_rates  # noqa: E402

#: Rows of the read-back test: 12,000 per partition (4), so each task fills the writer's
#: 10,000-message window. (100,000 before: the same paths, taken more times.)
N = 48_000


def _topic() -> str:
    return f"pw-{uuid.uuid4().hex[:10]}"


def test_foreach_partition_to_kafka(
    spark: SparkSession, kafka_broker: LocalBroker, tmp_path: Path
) -> None:
    topic, report_path = _topic(), str(tmp_path / "report.jsonl")
    df = spark.range(N, numPartitions=4).select(
        F.col("id").cast("string").alias("key"), F.concat(F.lit("v-"), F.col("id")).alias("value")
    )
    counters = pks.PartitionCounters(spark)
    df.foreachPartition(
        pks.partition_writer(
            kafka_broker.url, topic=topic, counters=counters, report_path=report_path
        )
    )
    records = anyio.run(read_kafka, kafka_broker.url, topic, N)
    assert len(records) == N
    assert {(r["key"], r["value"]) for r in records} == {(b"%d" % i, b"v-%d" % i) for i in range(N)}
    assert (counters.rows, counters.delivered, counters.failed) == (N, N, 0)
    report = pks.read_report(report_path)
    assert (report.delivered, report.failed, len(report.partitions)) == (N, 0, 4)


def _fail_once_at(row: int, stored: Callable[[], None]) -> Any:
    """A map function that, on a task's first attempt, fails at ``row`` once ``stored()``
    returned (chunks already handed to the producer reached the broker)."""

    def check(item: tuple[int, str]) -> tuple[int, str]:
        from pyspark import TaskContext

        context = TaskContext.get()
        if item[0] == row and context is not None and context.attemptNumber() == 0:
            stored()
            raise RuntimeError(f"injected failure at row {row}")
        return item

    return check


def test_tuples_retry_exactly_once_on_jetstream_and_counted_once(
    spark: SparkSession, nats_broker: NatsSessionBroker
) -> None:
    """rdd.foreachPartition over (id, value) tuples, columns by position; partition 0 fails once
    after its first 10,000-row chunk was sent. With id_col the stream holds each row once, the
    accumulators count each partition once; without ids the retry stored duplicates."""
    n = 30_000
    rdd = spark.sparkContext.parallelize([(i, f"v-{i}") for i in range(n)], 2)

    def run(topic: str, **ids: Any) -> pks.PartitionCounters:
        counters = pks.PartitionCounters(spark)
        writer = pks.partition_writer(
            nats_broker.jetstream_url,
            topic=topic,
            value_col=1,
            key_col=None,
            create_stream=True,
            counters=counters,
            **ids,
        )
        stored = stored_on(nats_broker.jetstream_url, topic, 12_000)
        rdd.map(_fail_once_at(12_000, stored)).foreachPartition(writer)
        return counters

    with_ids, without_ids = _topic(), _topic()
    counted = run(with_ids, id_col=0)
    control = run(without_ids)
    assert (counted.rows, counted.delivered, counted.failed) == (n, n, 0)
    assert (control.rows, control.delivered) == (n, n)
    stored = anyio.run(read_jetstream, nats_broker.jetstream_url, with_ids, n)
    assert sorted(int(r["headers"]["Nats-Msg-Id"]) for r in stored) == list(range(n))
    assert len(anyio.run(read_jetstream, nats_broker.jetstream_url, without_ids, n + 10_000)) > n


def test_the_writer_pickles_without_a_producer_and_checks_rows(spark: SparkSession) -> None:
    """The function is plain data: it pickles, and unpickled it publishes dicts, Rows or tuples
    in this process too (a memory:// store); the columns are checked on the first row."""
    from producerkit.backends.memory import get_store

    name = f"pw-{uuid.uuid4().hex}"
    store = get_store(name)
    writer = pks.partition_writer(f"memory://{name}", topic="t", value_serializer="json")
    shipped = cloudpickle.dumps(writer)
    assert b"SyncProducer" not in shipped and b"_cache" not in shipped
    again = pickle.loads(shipped)
    again([{"key": "a", "value": {"n": 1}}, {"key": "b", "value": {"n": 2}}])
    again([pyspark.sql.Row(value=[1, 2])])  # no key column: the default key is optional
    assert [(r.key, r.value) for r in store.topic("t")] == [
        (b"a", b'{"n":1}'),
        (b"b", b'{"n":2}'),
        (None, b"[1,2]"),
    ]
    with pytest.raises(ConfigurationError, match="position for tuples"):
        again([("a", "b")])
    with pytest.raises(ConfigurationError, match="not in the partition's rows"):
        pks.partition_writer("null://", topic="t", key_col="k")([{"value": "v"}])
    with pytest.raises(ConfigurationError, match="unknown option"):
        pks.partition_writer("null://", topic="t", no_such_option=1)
    with pytest.raises(ConfigurationError, match="no topic"):
        pks.partition_writer("null://")
    pks.close_all()


def test_job_rate_is_split_over_concurrent_tasks(spark: SparkSession) -> None:
    assert task_rates(spark, 1000, None) == {"max_rate": 500.0}  # local[2,3]: two slots
    assert task_rates(spark, 1000, 2e6, partitions=1) == {
        "max_rate": 1000.0,
        "max_bytes_rate": 2e6,
    }
    assert task_rates(spark, None, None) == {}
    with pytest.raises(ConfigurationError, match="max_rate must be a number > 0"):
        task_rates(spark, 0, None)
    with pytest.raises(ConfigurationError, match="max_bytes_rate must be a number > 0"):
        pks.publish(
            spark.range(1).selectExpr("'v' AS value"), "null://", topic="t", max_bytes_rate="x"
        )


def test_max_rate_holds_for_the_job(spark: SparkSession) -> None:
    """4,000 rows at 2,000/s for the job take >= 2 s however the two tasks share it (each task
    gets 1,000/s; unsplit they would finish in about 1 s). Lower bounds only: a slow machine
    only adds time."""
    df = spark.range(4000, numPartitions=2).select(F.col("id").cast("string").alias("value"))
    report = pks.publish(df, "null://", topic="t", max_rate=2000)
    assert (report.delivered, report.failed) == (4000, 0)
    assert report.seconds >= 1.8
    started = time.perf_counter()
    df.foreachPartition(pks.partition_writer("null://", topic="t", max_rate=2000))
    assert time.perf_counter() - started >= 1.8
