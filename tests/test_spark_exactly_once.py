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

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import TRANSACTIONS_ON_THE_FAST_PATH, read_jetstream

import producerkit as pk
from producerkit.testing.kafka_cluster import KafkaCluster
from producerkit.testing.pytest_plugin import NatsSessionBroker

pyspark = pytest.importorskip("pyspark")
pytestmark = [pytest.mark.spark, TRANSACTIONS_ON_THE_FAST_PATH]

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import producerkit.spark as pks  # noqa: E402
from producerkit.spark import _exactly_once as exactly  # noqa: E402
from producerkit.transactions import PreparedTransaction  # noqa: E402

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
    assert states.get("committed") == ROWS and "open" not in states, _open(kafka_cluster, topic)


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
    assert set(states) <= {"aborted", "not_stored"}, _open(kafka_cluster, topic)
    assert states["aborted"] >= ROWS * 3 // 4


#: Two streaming queries into ``format("producerkit")`` with exactly_once, one into Kafka and
#: one into JetStream, run together in a process of its own (the test kills its whole process
#: group): three files of 1,000 rows, one a micro-batch, each micro-batch's rows over 3
#: partitions. In micro-batch 1, row 1,500 (past the shuffle, in the write's own stage) stops on
#: the first run: it creates ``reached-<query>`` and waits to be killed.
_STREAMING = """
import os, sys, time
os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
from pyspark.sql import SparkSession, functions as F
source, workdir, kafka, jetstream, topic = sys.argv[1:6]
spark = (SparkSession.builder.master("local[4]").config("spark.ui.enabled", "false")
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

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

queries = [start("kafka", kafka), start("jetstream", jetstream)]
for query in queries:
    query.awaitTermination(240)
    print("STOPPED", query.exception())
"""


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
def test_streaming_queries_killed_mid_batch_store_each_row_once(
    kafka_cluster: KafkaCluster, nats_broker: NatsSessionBroker, tmp_path: Path
) -> None:
    """A streaming query into Kafka and one into JetStream (without id_col), killed during a
    micro-batch (the driver, its JVM and its Python workers: the process group) and run again
    from their checkpoints to the end of the input: each row stored once."""
    source = tmp_path / "in"
    source.mkdir()
    for number in range(3):
        lines = (json.dumps({"id": i}) for i in range(number * 1000, number * 1000 + 1000))
        (source / f"part-{number}.json").write_text("\n".join(lines) + "\n")
        os.utime(source / f"part-{number}.json", (number + 1, number + 1))  # in this order
    topic = _topic(kafka_cluster)
    # a stream that drops duplicates for 10 minutes: a loaded machine's two runs may well take
    # longer than the server's default 2 (the query checks its exactly_once_timeout against it)
    anyio.run(_add_stream, nats_broker.jetstream_url, topic, 600.0)
    urls = [kafka_cluster.url, nats_broker.jetstream_url]
    command = [sys.executable, "-c", _STREAMING, str(source), str(tmp_path), *urls, topic]
    reached = [tmp_path / "reached-kafka", tmp_path / "reached-jetstream"]
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and first.poll() is None:
                if all(path.exists() for path in reached):
                    break
                time.sleep(0.1)
            time.sleep(1.0)  # the micro-batches' other tasks write meanwhile
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert all(path.exists() for path in reached), (tmp_path / "first.log").read_text()[-3000:]
    # micro-batch 0 was stored, and some of micro-batch 1 written before the kill
    assert len(kafka_cluster.read(topic, timeout=60.0)) > 1000
    before = anyio.run(read_jetstream, nats_broker.jetstream_url, topic, 1001, 10.0)
    assert len(before) > 1000
    (tmp_path / "resume").touch()
    again = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert again.stdout.count("STOPPED None") == 2, again.stderr[-3000:]

    written = kafka_cluster.read(topic, timeout=60.0)
    committed = kafka_cluster.read(topic, timeout=60.0, isolation_level="read_committed")
    assert len(written) > 3000  # micro-batch 1's rows of the killed run, aborted
    assert sorted(int(record.value[2:]) for record in committed) == list(range(3000))
    assert "open" not in _states(kafka_cluster, topic)
    log = exactly.CommitLog(tmp_path / "checkpoint-kafka" / "producerkit-exactly-once")
    states = {batch: entry["state"] for batch, entry in log.entries().items()}
    assert states == {0: "done", 1: "done", 2: "done"}

    stored = anyio.run(read_jetstream, nats_broker.jetstream_url, topic, 3000)
    assert sorted(int(record["value"][2:]) for record in stored) == list(range(3000))
    ids = {record["headers"]["Nats-Msg-Id"] for record in stored}
    assert len(ids) == 3000
    assert all(re.fullmatch(r"pk-[0-9a-f-]{36}-\d+-\d+-\d+", msg_id) for msg_id in ids)


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


def _committed(cluster: KafkaCluster, topic: str) -> list[int]:
    return _ids(cluster.read(topic, timeout=30.0, isolation_level="read_committed"))


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
    exactly.abort_job(config, [prepared], exactly.transactional_ids("pk-j", 3))
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
