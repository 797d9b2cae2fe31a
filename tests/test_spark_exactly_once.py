"""``exactly_once=True`` from Spark (issue 38): each row stored once, whatever Spark retries.

Kafka on the session's mock cluster of three brokers (``kafka_cluster``), read back through its
transaction-aware view (``read(topic, isolation_level="read_committed")``: what Apache Kafka
would serve, worked out from the recorded transactional traffic, since the mock itself serves
everything to everyone and fences nobody). JetStream on the session's NATS, without ``id_col``.

The batch scenario is the issue's: 50,000 rows over 4 partitions, one task's Python worker dying
(``os._exit``) on its first attempt after about 12,400 of its rows went out, through
``publish()`` and through ``format("producerkit")``; and the same job with one partition failing
on every attempt. The streaming ones kill a query's driver (its whole process group) during a
micro-batch and restart it from its checkpoint.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import pytest

from producerkit.testing.kafka_cluster import KafkaCluster

pyspark = pytest.importorskip("pyspark")
pytestmark = pytest.mark.spark

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import producerkit.spark as pks  # noqa: E402

ROWS, PARTITIONS = 50_000, 4
#: The row of partition 0 (ids 0..12,499) at which its first attempt's worker dies.
DIES_AT = 12_400


def _topic(cluster: KafkaCluster, partitions: int = 6) -> str:
    name = f"eo-{uuid.uuid4().hex[:10]}"
    cluster.create_topic(name, partitions=partitions, replication=3)
    return name


def _breaking(row: int, *, every_attempt: bool) -> Any:
    """A UDF passing values through; at ``row`` it waits 1.5 s (the publisher downstream
    takes what came before) and then, on the task's first attempt, its Python worker exits
    (``os._exit``), or, ``every_attempt``, it raises on each attempt."""

    def check(value: str, number: int) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if number == row and context is not None:
            if every_attempt:
                time.sleep(1.5)
                raise RuntimeError(f"injected failure at row {row}")
            if context.attemptNumber() == 0:
                time.sleep(1.5)
                os._exit(1)
        return value

    return F.udf(check, "string")


def _rows(spark: SparkSession, *, every_attempt: bool = False) -> Any:
    padded = F.concat(F.lit("v-"), F.col("id"), F.lit("-"), F.repeat(F.lit("x"), 100))
    return spark.range(ROWS, numPartitions=PARTITIONS).select(
        F.col("id").cast("string").alias("key"),
        _breaking(DIES_AT, every_attempt=every_attempt)(padded, F.col("id")).alias("value"),
    )


def _write(path: str, df: Any, url: str, topic: str) -> None:
    if path == "publish":
        report = pks.publish(df, url, topic=topic, exactly_once=True)
        assert report.delivered == ROWS and report.retried_partitions == 1
        return
    (
        df.write.format("producerkit")
        .option("url", url)
        .option("topic", topic)
        .option("exactly_once", "true")
        .mode("append")
        .save()
    )


def _ids(records: list[Any]) -> list[int]:
    return sorted(int(record.value.split(b"-")[1]) for record in records)


def _states(cluster: KafkaCluster, topic: str) -> dict[str, int]:
    """How many records of ``topic`` are in each state, as the view has it (no transaction
    may be left open: it would hold back every read_committed consumer of its partitions)."""
    cluster.transactions.settle(5.0)
    states: dict[str, int] = {}
    for batch, state in cluster.transactions.view(topic).batches:
        states[state] = states.get(state, 0) + batch.record_count
    return states


@pytest.fixture
def small_arrow_batches(spark: SparkSession) -> Any:
    """Arrow batches of 1,000 rows: a task's rows reach its publisher as they come."""
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    yield
    spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


@pytest.mark.parametrize("path", ["publish", "format"])
def test_a_worker_dying_mid_task_leaves_each_row_once(
    spark: SparkSession, kafka_cluster: KafkaCluster, small_arrow_batches: Any, path: str
) -> None:
    topic = _topic(kafka_cluster)
    _write(path, _rows(spark), kafka_cluster.url, topic)
    written = kafka_cluster.read(topic, timeout=60.0)
    # the first attempt's rows went out before its worker died (the log holds them)...
    assert len(written) > ROWS + DIES_AT - 2_500, len(written)
    # ... and a read_committed consumer is served each row once
    committed = kafka_cluster.read(topic, timeout=60.0, isolation_level="read_committed")
    assert _ids(committed) == list(range(ROWS))
    states = _states(kafka_cluster, topic)
    assert states.get("committed") == ROWS and "open" not in states, states


@pytest.mark.parametrize("path", ["publish", "format"])
def test_a_partition_failing_on_every_attempt_stores_no_row(
    spark: SparkSession, kafka_cluster: KafkaCluster, small_arrow_batches: Any, path: str
) -> None:
    topic = _topic(kafka_cluster)
    with pytest.raises(Exception, match="injected failure"):
        _write(path, _rows(spark, every_attempt=True), kafka_cluster.url, topic)
    assert len(kafka_cluster.read(topic, timeout=60.0)) >= ROWS * 3 // 4  # written, ...
    assert kafka_cluster.read(topic, timeout=60.0, isolation_level="read_committed") == []
    states = _states(kafka_cluster, topic)
    assert set(states) <= {"aborted", "not_stored"} and states["aborted"] >= ROWS * 3 // 4
