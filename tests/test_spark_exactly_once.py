"""``exactly_once=True`` from Spark (issue 38): each row stored once, whatever Spark retries.

The scenarios run on two Kafkas (``target``; the mock cluster's batch runs are ``slow``, Apache
Kafka judging them by default): a mock cluster of three brokers for each test
(``kafka_cluster``), read back through its transaction-aware view (``read(topic,
isolation_level="read_committed")``: what Apache Kafka would serve, worked out from the
recorded transactional traffic, since the mock itself serves everything to everyone and fences
nobody), and the session's three Apache Kafka nodes (``apache_kafka_cluster``, transactions
v2), each topic replicated 3 with a min ISR of 2, read back by a real ``read_committed``
consumer: Apache Kafka itself judges. JetStream on the session's NATS, without ``id_col``.

The batch scenario is the issue's: 50,000 rows over 4 partitions (20,000 on Apache Kafka), one
task's Python worker dying (``os._exit``) on its first attempt about 100 rows before the end of
its partition (row 12,400 of 12,500; 4,900 of 5,000), through ``publish()`` and through
``format("producerkit")``; and the same job with one partition failing on every attempt. The
streaming ones kill a query's driver (its whole process group) during a micro-batch and restart
it from its checkpoint (a query into Kafka; on the mock cluster's run one into JetStream too).
On Apache Kafka only: a batch job with speculation on, on a standalone Spark cluster of two
workers on two loopback addresses (``slow``), and a task's transaction whose first batch is lost
on the wire while more are in flight (what the worker-dying scenario found there).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import TRANSACTIONS_ON_THE_FAST_PATH, kafka_stored, read_jetstream

import producerkit as pk
from producerkit.testing.apache_kafka import ApacheKafka
from producerkit.testing.kafka_cluster import KafkaCluster
from producerkit.testing.pytest_plugin import NatsSessionBroker

pyspark = pytest.importorskip("pyspark")
pytestmark = [pytest.mark.spark, TRANSACTIONS_ON_THE_FAST_PATH]

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import producerkit.spark as pks  # noqa: E402
from producerkit.spark import _exactly_once as exactly  # noqa: E402
from producerkit.transactions import PreparedTransaction  # noqa: E402

PARTITIONS = 4


def _topic(cluster: KafkaCluster, partitions: int = 6) -> str:
    name = f"eo-{uuid.uuid4().hex[:10]}"
    cluster.create_topic(name, partitions=partitions, replication=3)
    return name


# ---------------------------------------------------------------------- the Kafkas judged


class _Target:
    """A Kafka a scenario writes into and reads back as a ``read_committed`` consumer would:
    ``rows`` for its batch job, the row (``dies_at``) of partition 0 at which a first attempt
    dies. Values are returned as bytes, in partition and offset order."""

    name: str
    url: str
    rows: int
    dies_at: int

    def topic(self, partitions: int = 6) -> str:
        """A new topic of ``partitions``, replicated on the three brokers."""
        raise NotImplementedError

    def written(self, topic: str) -> list[bytes]:
        """Every record stored (``read_uncommitted``: open, aborted and committed ones)."""
        raise NotImplementedError

    def committed(self, topic: str, expected: int = 0) -> list[bytes]:
        """What a ``read_committed`` consumer is served: with ``expected``, once that many came
        (and a little longer, so that a duplicate shows); without, up to each partition's
        last stable offset once no transaction is open."""
        raise NotImplementedError

    def states(self, topic: str) -> dict[str, int]:
        """Records per state (``committed``, ``aborted``, ``open``, ``not_stored``) where the
        Kafka can tell (the mock's view); on Apache Kafka only ``open`` (records from the first
        open transaction on, in the partitions whose last stable offset stays behind their end
        for 10 s), which every scenario asserts absent: an open transaction would hold back
        every ``read_committed`` consumer of its partitions."""
        raise NotImplementedError

    def explain(self, topic: str) -> str:
        """What a failed assertion shows about the transactions left open."""
        return ""


class _MockTarget(_Target):
    name, rows, dies_at = "mock-cluster", 50_000, 12_400

    def __init__(self, cluster: KafkaCluster) -> None:
        self.cluster, self.url = cluster, cluster.url

    def topic(self, partitions: int = 6) -> str:
        return _topic(self.cluster, partitions)

    def written(self, topic: str) -> list[bytes]:
        return _values(record.value for record in self.cluster.read(topic, timeout=60.0))

    def committed(self, topic: str, expected: int = 0) -> list[bytes]:
        records = self.cluster.read(topic, timeout=60.0, isolation_level="read_committed")
        return _values(record.value for record in records)

    def states(self, topic: str) -> dict[str, int]:
        return _states(self.cluster, topic)

    def explain(self, topic: str) -> str:
        return _open(self.cluster, topic)


class _ApacheTarget(_Target):
    name, rows, dies_at = "apache-kafka", 20_000, 4_900

    def __init__(self, kafka: ApacheKafka) -> None:
        self.kafka, self.url = kafka, kafka.url

    def topic(self, partitions: int = 6) -> str:
        name = f"eo-{uuid.uuid4().hex[:10]}"
        self.kafka.create_topic(name, partitions, replication_factor=3, min_insync_replicas=2)
        return name

    def written(self, topic: str) -> list[bytes]:
        records = self.kafka.read(topic, isolation="read_uncommitted", timeout=60.0)
        return _values(record["value"] for record in records)

    def committed(self, topic: str, expected: int = 0) -> list[bytes]:
        if not expected:
            self._wait_stable(topic, 60.0)
        records = self.kafka.read(topic, expected=expected or None, timeout=60.0)
        return _values(record["value"] for record in records)

    def states(self, topic: str) -> dict[str, int]:
        behind = self._wait_stable(topic, 10.0)
        return {"open": sum(behind.values())} if behind else {}

    def explain(self, topic: str) -> str:
        """Each partition's records from its last stable offset on, by the Spark partition
        (``id // (rows / 4)``) that wrote them, and whether they are stable 60 s later."""
        behind = self._behind(topic)
        records = self.kafka.read(topic, isolation="read_uncommitted", timeout=60.0)
        ends = {p: max(r["offset"] for r in records if r["partition"] == p) for p in behind}
        writers: dict[int, int] = {}
        for record in records:
            p = record["partition"]
            if p in behind and record["offset"] > ends[p] - behind[p] and record["value"]:
                writer = int(record["value"].split(b"-")[1]) // (self.rows // PARTITIONS)
                writers[writer] = writers.get(writer, 0) + 1
        later = self._wait_stable(topic, 60.0)
        return (
            f"last stable offset behind the end (partition: records): {behind}; those records "
            f"by the Spark partition that wrote them: {writers}; 60 s later: {later}"
        )

    def _behind(self, topic: str) -> dict[int, int]:
        """Each partition whose last stable offset (a read_committed ListOffsets) is behind its
        high watermark (a read_uncommitted one), by how much."""
        from confluent_kafka import Consumer, TopicPartition

        ends: dict[str, dict[int, int]] = {}
        for isolation in ("read_committed", "read_uncommitted"):
            consumer = Consumer(
                {
                    "bootstrap.servers": self.kafka.bootstrap_servers,
                    "group.id": "producerkit-eo-offsets",
                    "isolation.level": isolation,
                    "log_level": 3,
                }
            )
            try:
                ends[isolation] = {
                    p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10.0)[1]
                    for p in self.kafka.leaders(topic)
                }
            finally:
                consumer.close()
        return {
            p: end - ends["read_committed"][p]
            for p, end in ends["read_uncommitted"].items()
            if ends["read_committed"][p] < end
        }

    def _wait_stable(self, topic: str, timeout: float) -> dict[int, int]:
        """Wait until no partition of ``topic`` has a transaction open (an ended one's markers
        are written after EndTxn answers), at most ``timeout`` s; what is still behind."""
        deadline = time.monotonic() + timeout
        while (behind := self._behind(topic)) and time.monotonic() < deadline:
            time.sleep(0.5)
        return behind


#: The mark conftest gives a test of a session broker fixture it names (it cannot see one
#: ``target`` asks for): the Apache Kafka cases are ``brokers``, the mock cluster's are not.
BROKERS = pytest.mark.brokers


@pytest.fixture(
    params=[
        # slow: Apache Kafka judges these scenarios by default (the view's verdicts on the same
        # Spark retries are compared with Apache Kafka's in test_view_against_apache_kafka.py)
        pytest.param("mock-cluster", id="mock-cluster", marks=pytest.mark.slow),
        pytest.param("apache-kafka", id="apache-kafka", marks=BROKERS),
    ]
)
def target(request: pytest.FixtureRequest) -> _Target:
    """Each scenario on the mock cluster (judged by its transaction view) and on the three
    Apache Kafka nodes (judged by a real read_committed consumer)."""
    if request.param == "mock-cluster":
        return _MockTarget(request.getfixturevalue("kafka_cluster"))
    return _ApacheTarget(request.getfixturevalue("apache_kafka_cluster"))


def _breaking(row: int, *, every_attempt: bool, written: Any = None) -> Any:
    """A UDF passing values through; at ``row``, on the task's first attempt, it waits until
    ``written()`` returns (the publisher downstream wrote rows of the task before it) and its
    Python worker exits (``os._exit``), or, ``every_attempt``, it raises on each attempt once
    ``written()`` returns (the other tasks wrote their rows)."""

    def check(value: str, number: int) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if number == row and context is not None:
            if every_attempt:
                if written is not None:
                    written()
                raise RuntimeError(f"injected failure at row {row}")
            if context.attemptNumber() == 0:
                if written is not None:
                    written()
                os._exit(1)
        return value

    return F.udf(check, "string")


def _written_before_dying(target: _Target) -> int:
    """How many rows the dying task's first attempt has written when it dies, at least: its
    rows up to ``dies_at`` but the last Arrow batches' and UDF batches' worth (2,400)."""
    return target.dies_at - 2_400


def _rows(
    spark: SparkSession, target: _Target, topic: str = "", *, every_attempt: bool = False
) -> Any:
    """The batch job's rows; with ``topic``, the first attempt of partition 0 dies at
    ``target.dies_at`` once ``_written_before_dying(target)`` of its rows are in ``topic``, or,
    ``every_attempt``, each attempt raises there once the other partitions' rows all are (in
    ``topic``, prepared: a job can fail only after them, whatever Spark's tasks' pace)."""
    padded = F.concat(F.lit("v-"), F.col("id"), F.lit("-"), F.repeat(F.lit("x"), 100))
    written = None
    if topic and every_attempt:
        first_other = target.rows // PARTITIONS  # partition 0 holds the ids below it
        count = target.rows - first_other
        written = kafka_stored(target.url, topic, target.rows, count, at_least=first_other)
    elif topic:
        count = _written_before_dying(target)
        written = kafka_stored(target.url, topic, target.dies_at, count)
    breaking = _breaking(target.dies_at, every_attempt=every_attempt, written=written)
    return spark.range(target.rows, numPartitions=PARTITIONS).select(
        F.col("id").cast("string").alias("key"),
        breaking(padded, F.col("id")).alias("value"),
    )


def _write(path: str, df: Any, target: _Target, topic: str) -> None:
    if path == "publish":
        report = pks.publish(df, target.url, topic=topic, exactly_once=True)
        assert report.delivered == target.rows and report.retried_partitions == 1
        return
    (
        df.write.format("producerkit")
        .option("url", target.url)
        .option("topic", topic)
        .option("exactly_once", "true")
        .mode("append")
        .save()
    )


def _values(values: Iterable[bytes | None]) -> list[bytes]:
    """``values``, every one of them a value (no record of these tests has none)."""
    listed = list(values)
    assert None not in listed, "a record without a value"
    return [value for value in listed if value is not None]


def _ids(values: list[bytes]) -> list[int]:
    return sorted(int(value.split(b"-")[1]) for value in values)


def _states(cluster: KafkaCluster, topic: str) -> dict[str, int]:
    """How many records of ``topic`` are in each state, as the view has it (no transaction
    may be left open: it would hold back every read_committed consumer of its partitions)."""
    cluster.transactions.settle(5.0)
    states: dict[str, int] = {}
    for batch, state in cluster.transactions.view(topic).batches:
        states[state] = states.get(state, 0) + batch.record_count
    return states


def _open(cluster: KafkaCluster, topic: str) -> str:
    """What a failed assertion shows: each transaction left open, with its id's requests."""
    view = cluster.transactions.view(topic)
    opened = {
        (b.transactional_id, b.producer_id, b.epoch) for b, state in view.batches if state == "open"
    }
    lines = []
    for transactional_id in sorted({item[0] for item in opened}):
        lines.append(f"open: {sorted(item for item in opened if item[0] == transactional_id)}")
        lines.append(f"  inits: {cluster.transactions.inits(transactional_id)}")
        lines.append(f"  ends: {cluster.transactions.ends(transactional_id)}")
    return "\n".join(lines) or f"nothing open: {_states(cluster, topic)}"


@pytest.fixture
def small_arrow_batches(spark: SparkSession) -> Any:
    """Arrow batches of 1,000 rows: a task's rows reach its publisher as they come."""
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    yield
    spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


@pytest.mark.parametrize("path", ["publish", "format"])
def test_a_worker_dying_mid_task_leaves_each_row_once(
    spark: SparkSession, target: _Target, small_arrow_batches: Any, path: str
) -> None:
    topic = target.topic()
    _write(path, _rows(spark, target, topic), target, topic)
    # the first attempt's rows went out before its worker died (the log holds them)...
    written = target.written(topic)
    assert len(written) >= target.rows + _written_before_dying(target), len(written)
    # ... and a read_committed consumer is served each row once
    committed = target.committed(topic, expected=target.rows)
    assert _ids(committed) == list(range(target.rows))
    states = target.states(topic)
    assert "open" not in states, target.explain(topic)
    assert states.get("committed", target.rows) == target.rows, states


@pytest.mark.parametrize("path", ["publish", "format"])
def test_a_partition_failing_on_every_attempt_stores_no_row(
    spark: SparkSession, target: _Target, small_arrow_batches: Any, path: str
) -> None:
    topic = target.topic()
    with pytest.raises(Exception, match="injected failure"):
        _write(path, _rows(spark, target, topic, every_attempt=True), target, topic)
    _check_a_failed_job_stored_nothing(target, topic)


def _check_a_failed_job_stored_nothing(target: _Target, topic: str) -> None:
    """Three quarters of the rows were written, none is served, no transaction is left open."""
    assert len(target.written(topic)) >= target.rows * 3 // 4  # written, ...
    states = target.states(topic)
    assert "open" not in states, target.explain(topic)
    assert target.committed(topic) == []  # ... and none served
    assert set(states) <= {"aborted", "not_stored"}, states
    assert states.get("aborted", target.rows) >= target.rows * 3 // 4, states


@BROKERS
def test_the_check_catches_a_driver_that_leaves_a_failed_jobs_transactions_open(
    spark: SparkSession,
    apache_kafka_cluster: ApacheKafka,
    small_arrow_batches: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broken on purpose: the driver of a failed exactly-once job aborts nothing, so the tasks
    that succeeded leave their prepared transactions open. Apache Kafka holds every
    read_committed reader of those partitions back at the last stable offset, and the check
    above must refuse the run."""
    target = _ApacheTarget(apache_kafka_cluster)
    topic = target.topic()
    monkeypatch.setattr(exactly, "abort_job", lambda *args, **kwargs: False)
    with pytest.raises(Exception, match="injected failure"):
        _write("publish", _rows(spark, target, topic, every_attempt=True), target, topic)
    target.explain = lambda topic: "left open"  # type: ignore[method-assign]  # (no 60 s wait)
    with pytest.raises(AssertionError, match="left open"):
        _check_a_failed_job_stored_nothing(target, topic)


def _spark_script(master: str, arrow_records: int) -> str:
    """The start of a script run in a subprocess of its own: this interpreter on the
    executors, ``spark`` on ``master`` with Arrow batches of ``arrow_records`` rows, ``F``."""
    return f"""
import os, sys
os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
from pyspark.sql import SparkSession, functions as F
spark = (SparkSession.builder.master("{master}").config("spark.ui.enabled", "false")
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", "{arrow_records}").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
"""


#: Streaming queries into ``format("producerkit")`` with exactly_once (``name=url`` arguments:
#: one into Kafka, and on the mock cluster's run one into JetStream too), run together in a
#: process of its own (the test kills its whole process group): three files of 1,000 rows, one a
#: micro-batch, each micro-batch's rows over 3 partitions. In micro-batch 1, row 1,500 (past the
#: shuffle, in the write's own stage) stops on the first run: it creates ``reached-<query>`` and
#: waits to be killed.
_STREAMING = (
    _spark_script("local[4]", 50)
    + """
import time
source, workdir, topic = sys.argv[1:4]

def start(name, url):
    reached, resume = f"{workdir}/reached-{name}", f"{workdir}/resume"

    def hold(value, number):
        if number == 1500 and not os.path.exists(resume):
            open(reached, "w").close()
            time.sleep(600)
        return value

    rows = spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(source)
    value = F.udf(hold, "string")(F.concat(F.lit("v-"), F.col("id")), F.col("id"))
    writer = (rows.repartition(3).select(F.col("id").cast("string").alias("key"),
                                         value.alias("value"))
              .writeStream.format("producerkit").option("url", url).option("topic", topic)
              .option("exactly_once", "true").option("exactly_once_timeout", "600"))
    return (writer.option("checkpointLocation", f"{workdir}/checkpoint-{name}")
            .trigger(availableNow=True).start())

queries = [start(*argument.split("=", 1)) for argument in sys.argv[4:]]
for query in queries:
    query.awaitTermination(240)
    print("STOPPED", query.exception())
"""
)


async def _add_stream(url: str, subject: str, duplicate_window: float) -> None:
    import nats

    client = await nats.connect(url.replace("jetstream://", "nats://"))
    try:
        stream = client.jetstream()
        await stream.add_stream(
            name=subject, subjects=[subject, f"{subject}.>"], duplicate_window=duplicate_window
        )
    finally:
        await client.close()


@pytest.mark.timeout(540)  # two Spark runs in subprocesses: 50 s here, minutes on a busy machine
@pytest.mark.parametrize(
    "target",
    [
        pytest.param("mock-cluster", id="mock-cluster"),
        # slow: two more Spark JVMs beside three Kafka nodes (287 s with the machine's 2 cores
        # busy); the batch scenarios check the same commit steps on Apache Kafka by default
        pytest.param("apache-kafka", id="apache-kafka", marks=[pytest.mark.slow, BROKERS]),
    ],
    indirect=True,
)
def test_streaming_queries_killed_mid_batch_store_each_row_once(
    target: _Target, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A streaming query into Kafka (and, on the mock cluster's run, one into JetStream without
    id_col), killed during a micro-batch (the driver, its JVM and its Python workers: the
    process group) and run again from their checkpoints to the end of the input: each row
    stored once, no transaction left open."""
    source = tmp_path / "in"
    source.mkdir()
    for number in range(3):
        lines = (json.dumps({"id": i}) for i in range(number * 1000, number * 1000 + 1000))
        (source / f"part-{number}.json").write_text("\n".join(lines) + "\n")
        os.utime(source / f"part-{number}.json", (number + 1, number + 1))  # in this order
    topic = target.topic()
    queries = {"kafka": target.url}
    if isinstance(target, _MockTarget):  # JetStream's part does not depend on the Kafka
        nats_broker: NatsSessionBroker = request.getfixturevalue("nats_broker")
        queries["jetstream"] = nats_broker.jetstream_url
        # a stream that drops duplicates for 10 minutes: a loaded machine's two runs may well
        # take longer than the server's default 2 (the query checks its exactly_once_timeout
        # against it)
        anyio.run(_add_stream, nats_broker.jetstream_url, topic, 600.0)
    arguments = [f"{name}={url}" for name, url in queries.items()]
    command = [sys.executable, "-c", _STREAMING, str(source), str(tmp_path), topic, *arguments]
    reached = [tmp_path / f"reached-{name}" for name in queries]
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and first.poll() is None:
                if all(path.exists() for path in reached):
                    break
                time.sleep(0.1)
            # The micro-batch's other tasks go on: wait for a row of theirs in each query's
            # topic (JetStream's query as well as Kafka's).
            kafka_stored(target.url, topic, 2000, 1, timeout=60.0, at_least=1000)()
            if "jetstream" in queries:
                anyio.run(read_jetstream, queries["jetstream"], topic, 1001, 60.0)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert all(path.exists() for path in reached), (tmp_path / "first.log").read_text()[-3000:]
    # micro-batch 0 was stored, and some of micro-batch 1 written before the kill
    assert len(target.written(topic)) > 1000
    if "jetstream" in queries:
        before = anyio.run(read_jetstream, queries["jetstream"], topic, 1001, 10.0)
        assert len(before) > 1000
    (tmp_path / "resume").touch()
    again = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert again.stdout.count("STOPPED None") == len(queries), again.stderr[-3000:]

    assert len(target.written(topic)) > 3000  # micro-batch 1's rows of the killed run, aborted
    committed = target.committed(topic, expected=3000)
    assert sorted(int(value[2:]) for value in committed) == list(range(3000))
    assert "open" not in target.states(topic), target.explain(topic)
    commit_log = exactly.CommitLog(tmp_path / "checkpoint-kafka" / "producerkit-exactly-once")
    states = {batch: entry["state"] for batch, entry in commit_log.entries().items()}
    assert states == {0: "done", 1: "done", 2: "done"}

    if "jetstream" in queries:
        stored = anyio.run(read_jetstream, queries["jetstream"], topic, 3000)
        assert sorted(int(record["value"][2:]) for record in stored) == list(range(3000))
        ids = {record["headers"]["Nats-Msg-Id"] for record in stored}
        assert len(ids) == 3000
        assert all(re.fullmatch(r"pk-[0-9a-f-]{36}-\d+-\d+-\d+", msg_id) for msg_id in ids)


# ---------------------------------------------------------------------- speculation

#: A batch job with speculation on, written with exactly_once through ``publish()`` and then
#: ``format("producerkit")`` (argv: master URL, work directory, kafka URL, the two topics):
#: 20,000 rows of ~110 bytes over 4 partitions (short values would stay in the UDF worker's
#: 64 KiB output buffer, and the stuck attempt would write none of its first 2,500 rows).
#: Partition 3's first attempt sleeps at row 17,500 (some of the rows before went out in its
#: transaction: 1,000 in the runs so far), so once the 3 others finished (quantile 0.75) it
#: runs past 1.5 times their median and Spark starts a copy of it on the other executor. Each
#: partition's attempts leave a file ``<path>-<partition>-<attempt>``.
_SPECULATION = """
import os, sys, time
os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
from pyspark.sql import SparkSession, functions as F
import producerkit.spark as pks
master, workdir, url, publish_topic, format_topic = sys.argv[1:6]
spark = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.memory", "512m")
         .config("spark.executor.memory", "512m").config("spark.cores.max", "2")
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
         .config("spark.speculation", "true").config("spark.speculation.interval", "200ms")
         .config("spark.speculation.quantile", "0.75")
         .config("spark.speculation.multiplier", "1.5")
         .config("spark.speculation.minTaskRuntime", "1s")
         .config("spark.speculation.efficiency.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
pks.register(spark)  # format("producerkit") without discovery (this cwd is not the project's)
while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < 3:  # driver + 2
    time.sleep(0.2)

def rows(path):
    def mark(value, number):
        from pyspark import TaskContext

        context = TaskContext.get()
        if number % 5000 == 0:
            name = f"{path}-{context.partitionId()}-{context.attemptNumber()}"
            open(os.path.join(workdir, name), "w").close()
        if number == 17500 and context.attemptNumber() == 0:
            time.sleep(150)
        return value

    padded = F.concat(F.lit("v-"), F.col("id"), F.lit("-"), F.repeat(F.lit("x"), 100))
    value = F.udf(mark, "string")(padded, F.col("id"))
    return spark.range(20000, numPartitions=4).select(
        F.col("id").cast("string").alias("key"), value.alias("value"))

report = pks.publish(rows("publish"), url, topic=publish_topic, exactly_once=True)
print("RESULT publish", report.delivered, flush=True)
(rows("format").write.format("producerkit").option("url", url).option("topic", format_topic)
 .option("exactly_once", "true").mode("append").save())
print("RESULT format", 20000, flush=True)
spark.stop()
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def _standalone_spark(workdir: Path) -> Iterator[str]:
    """A standalone Spark cluster: a master and two workers of one core, one on 127.0.0.1 and
    one on 127.0.0.2; yields the master's URL, kills every process (executors and their Python
    workers are in their worker's process group) on the way out.

    Not ``local-cluster``: its executors all run on one host, and Spark starts no speculative
    copy of a task on a host where an attempt of it ran (``TaskSetManager.hasAttemptOnHost``),
    so speculation never runs there (measured: no copy in 30 s of a stuck task)."""
    home = Path(pyspark.__file__).parent
    spark_class = str(home / "bin" / "spark-class")
    environment = {**os.environ, "SPARK_HOME": str(home), "SPARK_NO_DAEMONIZE": "1"}
    port = _free_port()
    master = f"spark://127.0.0.1:{port}"
    master_command = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
    commands = [[spark_class, *master_command, "--port", str(port), "--webui-port", "0"]]
    for host in ("127.0.0.1", "127.0.0.2"):
        worker = ["org.apache.spark.deploy.worker.Worker", "--host", host, "--cores", "1"]
        work_dir = str(workdir / f"worker-{host}")
        options = ["--memory", "1g", "--webui-port", "0", "--work-dir", work_dir]
        commands.append([spark_class, *worker, *options, master])
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for number, command in enumerate(commands):
            with open(workdir / f"standalone-{number}.log", "wb") as log:
                process = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=environment,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            processes.append(process)
        yield master
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.slow  # a standalone Spark cluster: six JVMs, 1-3 minutes on 2 busy cores
@pytest.mark.timeout(600)
def test_speculative_attempts_leave_each_row_once(
    apache_kafka_cluster: ApacheKafka, tmp_path: Path, record_property: Any
) -> None:
    """Speculation on (``spark.speculation``), one task stuck halfway through its partition on
    its first attempt: Spark runs a copy of it on the other executor, whose InitProducerId
    fences the stuck attempt and aborts its transaction, and the driver commits the copy's.
    Apache Kafka serves a read_committed consumer each row once, through ``publish()`` and
    ``format("producerkit")``, and the stuck attempt's rows are in the log, aborted.

    The test asserts that the copy ran (a file from partition 3's attempt 1): with the three
    other tasks done first (quantile 0.75), the stuck task is the only one Spark can copy, so
    no copy of a task that then finishes on its own (whose handle the copy fenced: the job
    would fail typed, by design) can happen. ``speculative_attempts`` is recorded as a user
    property (``--junitxml``)."""
    target = _ApacheTarget(apache_kafka_cluster)
    topics = {"publish": target.topic(4), "format": target.topic(4)}
    with _standalone_spark(tmp_path) as master:
        command = [sys.executable, "-c", _SPECULATION, master, str(tmp_path), target.url]
        done = subprocess.run(
            [*command, topics["publish"], topics["format"]],
            capture_output=True, text=True, timeout=480, cwd=tmp_path,
        )  # fmt: skip
    results = [line.split() for line in done.stdout.splitlines() if line.startswith("RESULT")]
    expected = [["RESULT", "publish", "20000"], ["RESULT", "format", "20000"]]
    assert results == expected, done.stderr[-3000:]
    attempts = sorted(path.name for path in tmp_path.glob("*-[0-9]-[0-9]"))
    speculative = [name for name in attempts if not name.endswith("-0")]
    record_property("speculative_attempts", speculative)
    for path, topic in topics.items():
        assert f"{path}-3-1" in speculative, attempts
        committed = target.committed(topic, expected=20_000)
        assert _ids(committed) == list(range(20_000)), (len(committed), path)
        assert "open" not in target.states(topic), target.explain(topic)
        # the stuck attempt's rows went out before it was fenced: stored, and aborted
        written = len(target.written(topic))
        record_property(f"{path}_records_stored", written)
        assert written > 20_000, path


# ---------------------------------------------------------------------- what they found


def test_a_task_whose_earlier_batch_is_lost_keeps_its_transaction(
    apache_kafka_cluster: ApacheKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's transaction with several batches of a partition in flight, the first one's
    request lost on the wire (its answer a dropped connection, 0.5 s later): Apache Kafka
    refuses the batches after it with OUT_OF_ORDER_SEQUENCE_NUMBER (their predecessor is not
    stored), and the producer sends them again behind it, as the idempotent producer does; the
    transaction is prepared and committed whole.

    The worker-dying scenario found it on Apache Kafka on a loaded machine: another task's
    transaction failed with OutOfOrderSequenceNumber (a retriable refusal of a batch with four
    more behind it), and its task was retried; a transactional producer failed every sequence
    error outright."""
    from aiokafka import errors as kafka_errors

    from producerkit.backends.kafka import _aiokafka_compat, sender

    target = _ApacheTarget(apache_kafka_cluster)
    topic = target.topic(1)
    write = _aiokafka_compat.ProduceWire.write
    lost: list[int] = []

    def losing_the_first(self: Any, conn: Any, batches: Any) -> Any:
        if not lost and any(item[0] == topic and item[2] is not None for item in batches):
            lost.append(len(batches))
            loop = asyncio.get_running_loop()
            answer = loop.create_future()
            error = kafka_errors.KafkaConnectionError("connection lost (injected)")
            loop.call_later(0.5, answer.set_exception, error)
            return answer
        return write(self, conn, batches)

    refused: list[int] = []
    settle = sender.Sender._settle_sequence_error

    def recording(self: sender.Sender, batch: Any, code: int) -> None:
        refused.append(code)
        settle(self, batch, code)

    monkeypatch.setattr(_aiokafka_compat.ProduceWire, "write", losing_the_first)
    monkeypatch.setattr(sender.Sender, "_settle_sequence_error", recording)
    values = [b"v-%d-%s" % (row, b"x" * 100) for row in range(20_000)]
    # an exactly-once task's id: {job}-{partition}
    options: dict[str, Any] = {"transactional_id": f"pk-{uuid.uuid4().hex[:16]}-0"}
    # a transaction's messages count in flight until it is prepared: the window holds them all
    options.update(timeout=60.0, max_in_flight_messages=30_000)
    with pk.SyncProducer(target.url, topic=topic, **options) as producer:
        prepared = producer.prepare_transaction([{"values": values, "keys": values}])
    assert lost and prepared is not None and prepared.messages == 20_000
    assert 45 in refused, refused  # OUT_OF_ORDER_SEQUENCE_NUMBER: the later batches came first
    config = pks._publish.make_config(target.url, topic=topic, exactly_once=True)
    exactly.commit_job(config, [prepared])
    assert _ids(target.committed(topic, expected=20_000)) == list(range(20_000))
    assert "open" not in target.states(topic), target.explain(topic)


# ---------------------------------------------------------------------- the driver's steps


def _prepared(
    cluster: KafkaCluster, topic: str, transactional_id: str, rows: range
) -> PreparedTransaction:
    """A transaction of ``rows`` (values ``v-<row>``) written by ``transactional_id`` and left
    open, as a task leaves it."""
    values = [b"v-%d" % row for row in rows]
    with pk.SyncProducer(cluster.url, topic=topic, transactional_id=transactional_id) as producer:
        prepared = producer.prepare_transaction([{"values": values, "keys": values}])
    assert prepared is not None and prepared.messages == len(rows)
    return prepared


#: A hook (``sitecustomize``, loaded by every Python process of the job below, Spark's workers
#: included) holding back the InitProducerId of partition 0's first attempt until its retry
#: took the id: the first attempt's writer lives on after its task failed (Spark stops the
#: failed task's UDF worker, not it) and asks for the id late, as when its coordinator was
#: being elected. Each step leaves a file named after the transactional id.
_HOLD_FIRST_ATTEMPT = """
import os, sys
hold = os.environ.get("PRODUCERKIT_TEST_HOLD")
# Not in the process where Spark looks for data sources: importing producerkit here imports
# importlib.metadata, and on Python 3.12+ Spark's search then fails (CPython gh-121342; see
# docs/spark.md) and format("producerkit") is not found.
if hold and "pyspark.sql.worker.lookup_data_sources" not in sys.argv:
    from producerkit.backends.kafka import transactions

    original = transactions.Coordinator.init_producer_id

    async def init_producer_id(self, **kwargs):
        import asyncio
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None or context.partitionId() != 0:
            return await original(self, **kwargs)
        path = os.path.join(hold, self.transactional_id)
        if context.attemptNumber() > 0:
            granted = await original(self, **kwargs)
            open(f"{path}.retry-granted", "w").close()
            return granted
        for _ in range(1200):  # the retry's, at most 2 minutes
            if os.path.exists(f"{path}.retry-granted"):
                break
            await asyncio.sleep(0.1)
        try:
            granted = await original(self, **kwargs)
        except Exception as exc:
            with open(f"{path}.first-refused", "w") as out:
                out.write(repr(exc))
            raise
        with open(f"{path}.first-granted", "w") as out:
            out.write(repr(granted))
        return granted

    transactions.Coordinator.init_producer_id = init_producer_id
"""

#: A job per path, 4,000 rows over 4 partitions; partition 0's first attempt fails at its row
#: 100 (its UDF's Python worker exits) while its writer waits in the hook above.
_LATE_FIRST_ATTEMPT = (
    _spark_script("local[2,3]", 1000)
    + """
from pyspark import TaskContext
import producerkit.spark as pks

url, publish_topic, format_topic = sys.argv[1:4]

def check(value, number):
    if number == 100 and TaskContext.get().attemptNumber() == 0:
        os._exit(1)
    return value

value = F.udf(check, "string")(F.concat(F.lit("v-"), F.col("id")), F.col("id"))
df = spark.range(4000, numPartitions=4).select(F.col("id").cast("string").alias("key"),
                                                value.alias("value"))
report = pks.publish(df, url, topic=publish_topic, exactly_once=True)
print("RESULT publish", report.delivered, report.retried_partitions)
(df.write.format("producerkit").option("url", url).option("topic", format_topic)
 .option("exactly_once", "true").mode("append").save())
print("RESULT format")
"""
)


@BROKERS
def test_a_first_attempt_that_takes_its_id_after_the_retry_is_refused(
    apache_kafka_cluster: ApacheKafka, tmp_path: Path
) -> None:
    """What a CI run found: a task's first attempt whose writer asked for its transactional id
    only after the retry had (its InitProducerId held up, its task already failed upstream)
    aborted the retry's prepared transaction, and the job failed "fenced" at the commit (or,
    later still, it left a transaction of its own open). A batch job's first attempts take
    their id only if it is new: the late one is refused, the retry's transaction committed,
    each row served once, nothing of the first attempt written and nothing left open."""
    target = _ApacheTarget(apache_kafka_cluster)
    topics = {"publish": target.topic(4), "format": target.topic(4)}
    hook, hold = tmp_path / "hook", tmp_path / "hold"
    hook.mkdir()
    hold.mkdir()
    (hook / "sitecustomize.py").write_text(_HOLD_FIRST_ATTEMPT)
    path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PRODUCERKIT_TEST_HOLD": str(hold)}
    command = [sys.executable, "-c", _LATE_FIRST_ATTEMPT, target.url, *topics.values()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert results == ["RESULT publish 4000 1", "RESULT format"], done.stderr[-3000:]
    steps = sorted(name.rsplit(".", 1)[1] for name in os.listdir(hold))
    assert steps == ["first-refused"] * 2 + ["retry-granted"] * 2, steps
    for topic in topics.values():
        committed = target.committed(topic, expected=4_000)
        assert _ids(committed) == list(range(4_000))
        assert "open" not in target.states(topic), target.explain(topic)
        assert len(target.written(topic)) == 4_000  # the late first attempt wrote nothing


def _committed(cluster: KafkaCluster, topic: str) -> list[int]:
    records = cluster.read(topic, timeout=30.0, isolation_level="read_committed")
    return _ids(_values(record.value for record in records))


def test_the_commit_log_commits_a_batch_whose_driver_died_before_the_replay(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    """A driver that recorded micro-batch 7's intent and died before (or while) committing:
    the next writer Spark asks for commits it before the replay's tasks run (they would fence
    it), and the replay's own transactions are aborted."""
    topic = _topic(kafka_cluster, partitions=2)
    config = pks._publish.make_config(kafka_cluster.url, topic=topic, exactly_once=True)
    log = exactly.CommitLog(tmp_path / "log")
    first = [
        _prepared(kafka_cluster, topic, f"pk-q-7-{p}", range(p * 10, p * 10 + 10)) for p in (0, 1)
    ]
    log.write(7, "intent", first)
    exactly.commit_batch(config, log, 6, [])  # an earlier batch, done (nothing to commit)
    assert _committed(kafka_cluster, topic) == []  # open: nothing served yet

    job = exactly.recover(config, log)
    assert job.skip == {6: None, 7: None}  # replays of both write nothing
    assert _committed(kafka_cluster, topic) == list(range(20))
    # a replay's tasks that wrote all the same (an older writer): aborted, not committed again
    replay = [
        _prepared(kafka_cluster, topic, f"pk-q-7-{p}", range(p * 10, p * 10 + 10)) for p in (0, 1)
    ]
    exactly.commit_batch(config, log, 7, replay)
    assert _committed(kafka_cluster, topic) == list(range(20))
    assert log.read(7)["state"] == "done"  # type: ignore[index]
    assert "open" not in _states(kafka_cluster, topic)


def test_a_refused_commit_makes_the_batch_partial_and_its_replay_writes_the_rest(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    """One partition's commit refused (fenced: a speculative attempt took its id): the commit
    raises typed naming it, the others are committed, the log says which; the replay's tasks
    skip the committed partitions, and its transaction for the refused one is committed."""
    topic = _topic(kafka_cluster, partitions=2)
    config = pks._publish.make_config(
        kafka_cluster.url, topic=topic, exactly_once=True, timeout=2.0
    )
    log = exactly.CommitLog(tmp_path / "log")
    handles = [
        _prepared(kafka_cluster, topic, f"pk-q-3-{p}", range(p * 10, p * 10 + 10)) for p in (0, 1)
    ]
    kafka_cluster.fail_requests("EndTxn", ["PRODUCER_FENCED"])
    try:
        with pytest.raises(
            pk.AtomicBatchError, match=r"partition\(s\) \[\d\] was refused"
        ) as refused:
            exactly.commit_batch(config, log, 3, handles)
    finally:
        kafka_cluster.clear_request_errors("EndTxn")
    assert refused.value.kind == "fenced"
    entry = log.read(3)
    assert entry is not None and entry["state"] == "partial" and len(entry["committed"]) == 1
    (kept,) = entry["committed"]
    lost = 1 - kept
    assert _committed(kafka_cluster, topic) == list(range(kept * 10, kept * 10 + 10))

    assert exactly.recover(config, log).skip == {3: (kept,)}  # the replay writes partition `lost`
    again = _prepared(kafka_cluster, topic, f"pk-q-3-{lost}", range(lost * 10, lost * 10 + 10))
    exactly.commit_batch(config, log, 3, [again])
    assert _committed(kafka_cluster, topic) == list(range(20))
    assert log.read(3)["state"] == "done"  # type: ignore[index]


def test_a_job_that_failed_aborts_what_its_tasks_prepared_and_left_open(
    kafka_cluster: KafkaCluster,
) -> None:
    topic = _topic(kafka_cluster, partitions=2)
    config = pks._publish.make_config(kafka_cluster.url, topic=topic, exactly_once=True)
    prepared = _prepared(kafka_cluster, topic, "pk-j-0", range(10))
    _prepared(kafka_cluster, topic, "pk-j-1", range(10, 20))  # its handle never came back
    exactly.abort_job(config, [prepared], exactly.prepared_names("pk-j", 3))
    assert _committed(kafka_cluster, topic) == []
    states = _states(kafka_cluster, topic)
    assert states == {"aborted": 20}, states


def test_exactly_once_settings_are_checked_on_the_driver(
    spark: SparkSession, kafka_cluster: KafkaCluster, nats_broker: NatsSessionBroker
) -> None:
    df = spark.range(10).select(F.col("id").cast("string").alias("value"), F.lit(0).alias("p"))
    with pytest.raises(pk.ConfigurationError, match=r"kafka:// .* and jetstream://"):
        pks.publish(df, "null://", topic="t", exactly_once=True)
    with pytest.raises(pk.ConfigurationError, match="drop partition_col"):
        pks.publish(df, kafka_cluster.url, topic="t", partition_col="p", exactly_once=True)
    with pytest.raises(pk.ConfigurationError, match='on_error="fail"'):
        pks.publish(df, kafka_cluster.url, topic="t", on_error="count", exactly_once=True)
    with pytest.raises(pk.ConfigurationError, match="disagree"):
        pks.publish(
            df, kafka_cluster.url, topic="t", exactly_once=True, exactly_once_timeout=60,
            transaction_timeout_ms=30_000,
        )  # fmt: skip
    with pytest.raises(pk.ConfigurationError, match="seconds > 0"):
        pks.publish(df, kafka_cluster.url, topic="t", exactly_once=True, exactly_once_timeout=0)
    with pytest.raises(pk.ConfigurationError, match="use publish"):
        pks.partition_writer(kafka_cluster.url, topic="t", exactly_once=True)
    with pytest.raises(pk.ConfigurationError, match="replayed after a restart"):
        pks.batch_publisher(kafka_cluster.url, topic="t", exactly_once=True)
    # a stream the job creates keeps the server's 2-minute window: a longer job is refused
    with pytest.raises(pk.ConfigurationError, match="longer than the stream of"):
        pks.publish(
            df, nats_broker.jetstream_url, topic=f"eo-{uuid.uuid4().hex[:8]}",
            create_stream=True, exactly_once=True, exactly_once_timeout=600,
        )  # fmt: skip
    with pytest.raises(pk.ConfigurationError, match="checkpointLocation"):
        exactly.log_directory({}, None)
    with pytest.raises(pk.ConfigurationError, match="plain file calls"):
        exactly.log_directory({"checkpointLocation": "s3a://bucket/chk"}, None)
    assert str(exactly.log_directory({"checkpointLocation": "file:///tmp/c"}, None)) == (
        "/tmp/c/producerkit-exactly-once"
    )


def test_a_commit_no_coordinator_answers_stays_an_intent_for_the_restart(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    topic = _topic(kafka_cluster, partitions=2)
    config = pks._publish.make_config(
        kafka_cluster.url, topic=topic, exactly_once=True, timeout=1.0
    )
    log = exactly.CommitLog(tmp_path / "log")
    handles = [
        _prepared(kafka_cluster, topic, f"pk-q-5-{p}", range(p * 10, p * 10 + 10)) for p in (0, 1)
    ]
    kafka_cluster.fail_requests("EndTxn", ["COORDINATOR_NOT_AVAILABLE"] * 100)
    try:
        with pytest.raises(pk.AtomicBatchError) as refused:
            exactly.commit_batch(config, log, 5, handles)
    finally:
        kafka_cluster.clear_request_errors("EndTxn")
    assert refused.value.kind == "coordinator_unavailable"
    assert log.read(5)["state"] == "intent"  # type: ignore[index]
    assert exactly.recover(config, log).skip == {5: None}
    assert _committed(kafka_cluster, topic) == list(range(20))


def test_a_job_whose_commit_is_refused_fails_typed_naming_the_partitions(
    kafka_cluster: KafkaCluster,
) -> None:
    """The driver got a handle a speculative attempt fenced (injected here: the mock does not
    fence): the commit fails with the refusal's kind, naming what is stored and what is not;
    the other partitions are committed, the refused one's id initialized again."""
    topic = _topic(kafka_cluster, partitions=2)
    config = pks._publish.make_config(
        kafka_cluster.url, topic=topic, exactly_once=True, timeout=2.0
    )
    handles = [
        _prepared(kafka_cluster, topic, f"pk-s-{p}", range(p * 10, p * 10 + 10)) for p in (0, 1)
    ]
    kafka_cluster.fail_requests("EndTxn", ["PRODUCER_FENCED"])
    try:
        with pytest.raises(pk.AtomicBatchError, match=r"rows are not stored") as refused:
            exactly.commit_job(config, handles)
    finally:
        kafka_cluster.clear_request_errors("EndTxn")
    assert refused.value.kind == "fenced" and refused.value.code == 90
    stored = _committed(kafka_cluster, topic)
    assert len(stored) == 10 and "open" not in _states(kafka_cluster, topic)


def test_publish_into_jetstream_gives_each_row_an_id_from_its_place(
    spark: SparkSession, nats_broker: NatsSessionBroker
) -> None:
    subject = f"eo-{uuid.uuid4().hex[:10]}"
    df = spark.range(2000, numPartitions=2).select(
        F.concat(F.lit("v-"), F.col("id")).alias("value")
    )
    report = pks.publish(
        df, nats_broker.jetstream_url, topic=subject, create_stream=True, exactly_once=True,
        exactly_once_timeout=60,
    )  # fmt: skip
    assert report.delivered == 2000
    stored = anyio.run(read_jetstream, nats_broker.jetstream_url, subject, 2000)
    ids = [record["headers"]["Nats-Msg-Id"] for record in stored]
    (job,) = {msg_id.rsplit("-", 2)[0] for msg_id in ids}
    assert re.fullmatch(r"pk-[0-9a-f]{16}", job)
    places = sorted(tuple(map(int, msg_id.rsplit("-", 2)[1:])) for msg_id in ids)
    assert places == [(partition, row) for partition in (0, 1) for row in range(1000)]


class _Task:
    """What ``write_task`` asks of Spark's TaskContext, for a streaming task."""

    def __init__(self, partition: int, batch: int) -> None:
        self._partition, self._batch = partition, batch

    def partitionId(self) -> int:
        return self._partition

    def getLocalProperty(self, key: str) -> str | None:
        return {"sql.streaming.queryId": "q", "streaming.sql.batchId": str(self._batch)}.get(key)


def test_a_replayed_batch_writes_only_what_the_log_says_was_not_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark import TaskContext

    config = pks._publish.make_config("kafka://127.0.0.1:1", topic="t", exactly_once=True)
    job = exactly.Job(prefix=None, skip={4: None, 5: (0,)})

    def never() -> Any:
        raise AssertionError("a skipped task reads no row")
        yield

    for partition, batch in ((0, 4), (1, 4), (0, 5)):
        task = _Task(partition, batch)
        monkeypatch.setattr(TaskContext, "get", staticmethod(lambda task=task: task))
        assert exactly.write_task(config, never(), job) == (pks._worker.TaskCounts(), None)
    assert exactly.Job.from_dict(job.to_dict()) == job
