"""Issue 48, items 1, 3 and 4: what a new user of transactions and exactly-once Spark tripped on.

- A Spark exactly-once job never leaves a transaction open: a commit step that fails after the
  tasks wrote aborts what it did not commit, and says so (the raised error, the log); an option
  exactly-once sets itself (``transactional_id``) is refused on the driver before any task runs.
  Judged on Apache Kafka (``apache_kafka``) by a real ``read_committed`` consumer: an open
  transaction holds back every such reader of its partitions at the last stable offset, so a
  marker written after the job is read only once nothing is left open.
- Every row of docs/atomic.md's error table, each by the condition that makes it: on the mock
  cluster where it can be made there (the coordinator's broker down, a refused write or commit),
  on Apache Kafka where only a real broker does it (fencing, what ``read_committed`` sees).
- Two-phase commit from blocking code: ``SyncProducer.atomic_batch(prepare=True)`` and
  ``producerkit.transactions.commit_prepared_sync`` / ``abort_prepared_sync``.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import anyio
import pytest
from conftest import TRANSACTIONS_ON_THE_FAST_PATH

import producerkit as pk
from producerkit import transactions
from producerkit.backends.kafka.prepared import PREPARED
from producerkit.testing.apache_kafka import ApacheKafka
from producerkit.testing.kafka_cluster import KafkaCluster
from producerkit.testing.pytest_plugin import NatsSessionBroker

pytestmark = TRANSACTIONS_ON_THE_FAST_PATH

#: Seconds a read waits for records that come only where nothing is left open (a bound on a
#: wait, not on how fast anything is: a correct run returns as soon as they arrived).
READ_WAIT = 60.0


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _values(records: list[dict[str, Any]]) -> list[bytes]:
    return sorted(record["value"] for record in records)


def _write_markers(kafka: ApacheKafka, topic: str, partitions: int) -> list[bytes]:
    """One plain message into each partition of ``topic``: a ``read_committed`` reader gets
    them only if no transaction is open before them (the last stable offset)."""
    markers = [b"marker-%d" % partition for partition in range(partitions)]
    with pk.SyncProducer(kafka.url, topic=topic, timeout=30.0) as producer:
        for partition, marker in enumerate(markers):
            producer.produce(marker, partition=partition)
    return markers


class Outcomes:
    """An ``on_delivery`` that keeps every failure."""

    def __init__(self) -> None:
        self.failures: list[pk.Failure] = []
        self.delivered = 0

    def __call__(self, outcome: pk.Delivery | pk.Failure, context: object) -> None:
        if isinstance(outcome, pk.Failure):
            self.failures.append(outcome)
        else:
            self.delivered += 1


# ---------------------------------------------------------------------- 1. Spark exactly-once

SPARK_ROWS, SPARK_PARTITIONS, TOPIC_PARTITIONS = 40, 4, 3


def _spark_rows(spark: Any) -> Any:
    from pyspark.sql import functions as F

    return spark.range(SPARK_ROWS, numPartitions=SPARK_PARTITIONS).select(
        F.col("id").cast("string").alias("key"),
        F.concat(F.lit("v-"), F.col("id").cast("string")).alias("value"),
    )


@pytest.mark.spark
def test_exactly_once_refuses_a_transactional_id_before_any_task_runs(
    spark: Any, apache_kafka: ApacheKafka
) -> None:
    """``transactional_id`` with ``exactly_once`` (publish() and format()): a ConfigurationError
    on the driver saying why (each task's transaction has an id of its own), and no row written,
    not even uncommitted (today: every row written, then a TypeError, nothing ended)."""
    import producerkit.spark as pks

    topic = _name("eo-tid")
    apache_kafka.create_topic(topic, partitions=TOPIC_PARTITIONS)
    df = _spark_rows(spark)
    with pytest.raises(pk.ConfigurationError, match="transactional_id='mine' with exactly_once"):
        pks.publish(df, apache_kafka.url, topic=topic, exactly_once=True, transactional_id="mine")
    with pytest.raises(Exception, match="drop transactional_id"):
        (
            df.write.format("producerkit")
            .option("url", apache_kafka.url)
            .option("topic", topic)
            .option("exactly_once", "true")
            .option("transactional_id", "mine")
            .mode("append")
            .save()
        )
    with pytest.raises(pk.ConfigurationError, match=r"exactly_once: transactions .* acks='all'"):
        pks.publish(df, apache_kafka.url, topic=topic, exactly_once=True, acks=1)
    assert apache_kafka.read(topic, isolation="read_uncommitted") == []


@pytest.mark.spark
def test_a_commit_step_that_fails_aborts_what_it_did_not_commit(
    spark: Any,
    apache_kafka: ApacheKafka,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The driver's commit of one task's transaction fails (an exception that is no refusal of
    the broker's: here injected): the others are committed, that one is aborted, and the
    driver says so, in the AtomicBatchError it raises and in the log. Nothing is left open: a
    marker written after the job into every partition is read by a read_committed consumer,
    with exactly the other tasks' rows (today: the RuntimeError escapes, nothing is aborted,
    and the open transaction holds back every read_committed reader)."""
    import producerkit.spark as pks

    topic = _name("eo-abort")
    apache_kafka.create_topic(topic, partitions=TOPIC_PARTITIONS)
    end = PREPARED.end

    async def failing_for_partition_1(
        url: str, prepared: transactions.PreparedTransaction, *, commit: bool, **options: Any
    ) -> None:
        if commit and prepared.transactional_id.endswith("-1"):
            raise RuntimeError("injected: the driver failed while committing partition 1")
        await end(url, prepared, commit=commit, **options)

    monkeypatch.setattr(PREPARED, "end", failing_for_partition_1)
    caplog.set_level(logging.ERROR, logger="producerkit.spark")
    with pytest.raises(pk.AtomicBatchError) as raised:
        pks.publish(_spark_rows(spark), apache_kafka.url, topic=topic, exactly_once=True)
    message = str(raised.value)
    assert "partition(s) [1] was refused or failed" in message, message
    assert "their transactions aborted" in message, message
    assert "partition(s) [0, 2, 3] are committed" in message, message
    assert "injected" in message
    logged = [
        r.getMessage() for r in caplog.records if "aborted the transactions" in r.getMessage()
    ]
    assert logged and "-1']" in logged[0], caplog.text

    markers = _write_markers(apache_kafka, topic, TOPIC_PARTITIONS)
    rows = [b"v-%d" % i for i in range(SPARK_ROWS) if not 10 <= i < 20]  # partition 1: 10..19
    expected = sorted(rows + markers)
    read = apache_kafka.read(topic, expected=len(expected), timeout=READ_WAIT)
    assert _values(read) == expected


def test_the_two_phase_commit_functions_refuse_a_transactional_id_typed(
    kafka_cluster: KafkaCluster,
) -> None:
    """The transactional id is the handle's: ``transactional_id`` among the options is a
    ConfigurationError saying so, not a TypeError about duplicate arguments."""
    handle = transactions.PreparedTransaction("t", 1, 0, 1)
    with pytest.raises(pk.ConfigurationError, match="drop transactional_id"):
        transactions.commit_prepared_sync(kafka_cluster.url, handle, transactional_id="t")
    with pytest.raises(pk.ConfigurationError, match="drop transactional_id"):
        transactions.abort_open_sync(kafka_cluster.url, ["t"], transactional_id="t")


# ---------------------------------------------------------------------- 3. the error table


@pytest.fixture
def cluster_topic(kafka_cluster: KafkaCluster) -> str:
    name = _name("rows")
    kafka_cluster.create_topic(name, partitions=3, replication=3)
    return name


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"acks": 1}, "acks='all'"),
        ({"enable_idempotence": False}, "enable_idempotence=False"),
        ({"acks": "all", "max_batches_in_flight": 6}, "max_batches_in_flight"),
    ],
    ids=["acks-1", "not-idempotent", "six-batches-in-flight"],
)
async def test_settings_that_rule_out_transactions_are_refused_not_overridden(
    kafka_cluster: KafkaCluster, cluster_topic: str, options: dict[str, Any], named: str
) -> None:
    """A transaction is written by the idempotent producer: ``acks=1``,
    ``enable_idempotence=False`` or more than 5 batches in flight are refused (as the Java
    client refuses them beside a ``transactional.id``), at construction where a
    ``transactional_id`` is given, else at the ``atomic_batch()`` that needs them; the
    producer goes on producing."""
    with pytest.raises(pk.ConfigurationError, match=named):
        pk.Producer(kafka_cluster.url, topic=cluster_topic, transactional_id="tx", **options)
    async with pk.Producer(
        kafka_cluster.url, topic=cluster_topic, timeout=10.0, **options
    ) as producer:
        with pytest.raises(pk.ConfigurationError, match=rf"atomic_batch\(\).*{named}"):
            async with producer.atomic_batch() as batch:
                await batch.produce(b"never")
        outcome = await producer.produce(b"after")
        assert outcome.offset is not None


@pytest.mark.anyio
async def test_row_aborted_the_block_raised(apache_kafka: ApacheKafka) -> None:
    """``"aborted"``: the block raised; its exception goes on, every message failed with
    kind ``"aborted"``, nothing stored (read_committed reads the marker written after it, and
    nothing of the batch)."""
    topic = _name("row-aborted")
    apache_kafka.create_topic(topic, partitions=2)
    outcomes = Outcomes()
    async with pk.Producer(
        apache_kafka.url, topic=topic, timeout=30.0, on_delivery=outcomes
    ) as producer:
        with pytest.raises(RuntimeError, match="the application failed"):
            async with producer.atomic_batch() as batch:
                for index in range(10):
                    await batch.produce(b"never-%d" % index, key=b"k%d" % index)
                await producer.flush()  # written, answered, open
                raise RuntimeError("the application failed")
    assert len(outcomes.failures) == 10
    errors = [failure.exception for failure in outcomes.failures]
    assert all(isinstance(e, pk.AtomicBatchError) and e.kind == "aborted" for e in errors)
    assert not any(failure.possibly_stored for failure in outcomes.failures)
    markers = await anyio.to_thread.run_sync(_write_markers, apache_kafka, topic, 2)
    read = await anyio.to_thread.run_sync(
        lambda: apache_kafka.read(topic, expected=len(markers), timeout=READ_WAIT)
    )
    assert _values(read) == markers


@pytest.mark.anyio
async def test_row_message_failed_a_write_refused(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    """``"message_failed"``: the broker refused a message of the batch before the commit
    (CORRUPT_MESSAGE, not retried): the batch aborts, every message fails so, none acked."""
    outcomes = Outcomes()
    async with pk.Producer(
        kafka_cluster.url, topic=cluster_topic, timeout=10.0, on_delivery=outcomes
    ) as producer:
        kafka_cluster.fail_requests("Produce", ["CORRUPT_MESSAGE"])
        with pytest.raises(pk.AtomicBatchError) as raised:
            async with producer.atomic_batch() as batch:
                await batch.produce(b"refused", key=b"k")
        kafka_cluster.clear_request_errors("Produce")
    assert raised.value.kind == "message_failed", repr(raised.value)
    assert not raised.value.possibly_stored
    assert outcomes.delivered == 0 and len(outcomes.failures) == 1


@pytest.mark.anyio
async def test_row_refused_the_coordinator_refused_the_commit(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    """``"refused"``: EndTxn refused with another code: that code (59 UNKNOWN_PRODUCER_ID)."""
    async with pk.Producer(kafka_cluster.url, topic=cluster_topic, timeout=5.0) as producer:
        kafka_cluster.fail_requests("EndTxn", ["UNKNOWN_PRODUCER_ID"])
        with pytest.raises(pk.AtomicBatchError) as raised:
            async with producer.atomic_batch() as batch:
                await batch.produce(b"v", key=b"k")
        kafka_cluster.clear_request_errors("EndTxn")
    assert (raised.value.kind, raised.value.code) == ("refused", 59), repr(raised.value)
    assert not raised.value.possibly_stored


@pytest.mark.anyio
async def test_row_fenced_a_newer_producer_of_the_transactional_id(
    apache_kafka: ApacheKafka,
) -> None:
    """``"fenced"`` on Apache Kafka: a newer producer of the transactional id fences the older,
    whose open batch fails so (47 INVALID_PRODUCER_EPOCH or 90 PRODUCER_FENCED), and so does
    its next; nothing of the older's open batch is read committed."""
    topic = _name("row-fenced")
    apache_kafka.create_topic(topic, partitions=2)
    transactional_id = _name("tx")
    async with pk.Producer(
        apache_kafka.url, topic=topic, timeout=30.0, transactional_id=transactional_id
    ) as older:
        with pytest.raises(pk.AtomicBatchError) as raised:
            async with older.atomic_batch() as batch:
                await batch.produce(b"older", key=b"k")
                await older.flush()  # written, open
                newer = pk.Producer(
                    apache_kafka.url, topic=topic, timeout=30.0, transactional_id=transactional_id
                )
                async with newer, newer.atomic_batch() as fresh:
                    await fresh.produce(b"newer", key=b"k")
        assert raised.value.kind == "fenced", repr(raised.value)
        assert raised.value.code in (47, 90), repr(raised.value)
        with pytest.raises(pk.AtomicBatchError) as again:
            async with older.atomic_batch() as batch:
                await batch.produce(b"older-again", key=b"k")
        assert again.value.kind == "fenced"
    read = await anyio.to_thread.run_sync(
        lambda: apache_kafka.read(topic, expected=1, timeout=READ_WAIT)
    )
    assert _values(read) == [b"newer"]


@pytest.mark.anyio
async def test_row_coordinator_unavailable_its_broker_down_at_the_first_batch(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    """``"coordinator_unavailable"``: the transaction coordinator's broker is down when the
    first batch opens the transactional connection: after ``timeout`` the batch fails so, its
    code None, nothing stored (today: ``"refused"``, "InitProducerId refused:
    NodeNotReadyError"). The broker back, the next batch commits."""
    transactional_id = _name("tx")
    kafka_cluster.set_coordinator("transaction", transactional_id, 2)
    async with pk.Producer(
        kafka_cluster.url, topic=cluster_topic, timeout=3.0, transactional_id=transactional_id
    ) as producer:
        kafka_cluster.broker_down(2)
        try:
            with pytest.raises(pk.AtomicBatchError) as raised:
                async with producer.atomic_batch() as batch:
                    await batch.produce(b"v", key=b"k")
        finally:
            kafka_cluster.broker_up(2)
        error = raised.value
        assert error.kind == "coordinator_unavailable", repr(error)
        assert error.code is None and not error.possibly_stored, repr(error)
        assert "no transaction coordinator" in str(error) and "3.0s" in str(error)
        async with producer.atomic_batch() as batch:
            await batch.produce(b"after", key=b"k")
        assert producer.stats.acked == 1


@pytest.mark.anyio
async def test_row_coordinator_unavailable_the_commit_unanswered_is_possibly_stored(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    """``"coordinator_unavailable"`` at the commit (EndTxn answered COORDINATOR_NOT_AVAILABLE
    until the timeout): the one case of the row where the batch may be stored: the error and
    each message's failure say ``possibly_stored``."""
    outcomes = Outcomes()
    async with pk.Producer(
        kafka_cluster.url, topic=cluster_topic, timeout=2.0, on_delivery=outcomes
    ) as producer:
        kafka_cluster.fail_requests("EndTxn", ["COORDINATOR_NOT_AVAILABLE"] * 500)
        try:
            with pytest.raises(pk.AtomicBatchError) as raised:
                async with producer.atomic_batch() as batch:
                    for index in range(5):
                        await batch.produce(b"v-%d" % index, key=b"k%d" % index)
        finally:
            kafka_cluster.clear_request_errors("EndTxn")
    assert raised.value.kind == "coordinator_unavailable", repr(raised.value)
    assert raised.value.possibly_stored
    assert len(outcomes.failures) == 5
    assert all(failure.possibly_stored for failure in outcomes.failures)


@pytest.mark.anyio
async def test_row_unsupported_no_transactions_for_this_id(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    """``"unsupported"``: the broker does not do transactions for this id (FindCoordinator
    refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED), at the first batch."""
    kafka_cluster.fail_requests("FindCoordinator", ["TRANSACTIONAL_ID_AUTHORIZATION_FAILED"])
    try:
        async with pk.Producer(kafka_cluster.url, topic=cluster_topic, timeout=5.0) as producer:
            with pytest.raises(pk.AtomicBatchError) as raised:
                async with producer.atomic_batch() as batch:
                    await batch.produce(b"v")
    finally:
        kafka_cluster.clear_request_errors("FindCoordinator")
    assert raised.value.kind == "unsupported", repr(raised.value)
    assert raised.value.code == 53


@pytest.mark.anyio
async def test_row_aborted_on_jetstream(nats_broker: NatsSessionBroker) -> None:
    """``"aborted"`` on JetStream: the block raised, the commit never sent, nothing stored."""
    from conftest import read_jetstream

    subject = f"{_name('rowjs')}.orders"
    outcomes = Outcomes()
    async with pk.Producer(
        nats_broker.jetstream_url,
        topic=subject,
        create_stream=True,
        allow_atomic=True,
        on_delivery=outcomes,
    ) as producer:
        with pytest.raises(RuntimeError):
            async with producer.atomic_batch() as batch:
                for index in range(3):
                    await batch.produce(b"never-%d" % index)
                raise RuntimeError("the application failed")
        await producer.produce(b"after")
    kinds = {getattr(failure.exception, "kind", None) for failure in outcomes.failures}
    assert outcomes.failures and kinds == {"aborted"}, outcomes.failures
    records = await read_jetstream(nats_broker.jetstream_url, subject, expected=1)
    assert [record["value"] for record in records] == [b"after"]


# ---------------------------------------------------------------------- 4. from sync code


def test_sync_atomic_batch_commits_whole_and_a_raising_block_aborts(
    apache_kafka: ApacheKafka,
) -> None:
    """``SyncProducer.atomic_batch()``: the block's messages committed together at its end
    (acked then, not before), a block that raised aborts its batch and its exception goes on;
    read back by a read_committed consumer: the committed batch's, none of the aborted one's."""
    topic = _name("sync-batch")
    apache_kafka.create_topic(topic, partitions=2)
    outcomes = Outcomes()
    with pk.SyncProducer(
        apache_kafka.url, topic=topic, timeout=30.0, on_delivery=outcomes
    ) as producer:
        with producer.atomic_batch() as batch:
            batch.produce(b"order-1", key="user-1")
            batch.produce_batch([b"line-1", b"line-2"], keys=["user-1", "user-1"])
            assert len(batch) == 3 and producer.stats.acked == 0
        assert producer.stats.acked == 3
        with (
            pytest.raises(RuntimeError, match="the application failed"),
            producer.atomic_batch() as batch,
        ):
            batch.produce(b"never", key="user-2")
            raise RuntimeError("the application failed")
    assert [getattr(f.exception, "kind", None) for f in outcomes.failures] == ["aborted"]
    markers = _write_markers(apache_kafka, topic, 2)
    expected = sorted([b"order-1", b"line-1", b"line-2", *markers])
    assert _values(apache_kafka.read(topic, expected=len(expected), timeout=READ_WAIT)) == expected


def test_sync_two_phase_commit_prepare_then_commit_or_abort(apache_kafka: ApacheKafka) -> None:
    """``SyncProducer.atomic_batch(prepare=True)`` leaves the transaction open (read_committed
    readers see none of it) and ``batch.prepared`` names it; ``commit_prepared_sync`` from
    another client commits it, ``abort_prepared_sync`` aborts another, from blocking code."""
    topic = _name("sync-2pc")
    apache_kafka.create_topic(topic, partitions=2)
    handles = []
    for name in ("committed", "aborted"):
        with pk.SyncProducer(
            apache_kafka.url, topic=topic, timeout=30.0, transactional_id=_name(f"w-{name}")
        ) as writer:
            with writer.atomic_batch(prepare=True) as batch:
                batch.produce(name.encode(), key="k")
                batch.produce(name.encode() + b"-2", key="k2")
            assert batch.prepared is not None and batch.prepared.messages == 2
            handles.append(batch.prepared)
    assert apache_kafka.read(topic) == []  # the last stable offset: before both
    transactions.commit_prepared_sync(apache_kafka.url, handles[0])
    transactions.abort_prepared_sync(apache_kafka.url, handles[1])
    markers = _write_markers(apache_kafka, topic, 2)
    expected = sorted([b"committed", b"committed-2", *markers])
    assert _values(apache_kafka.read(topic, expected=len(expected), timeout=READ_WAIT)) == expected


def test_sync_calls_on_a_thread_that_runs_a_loop(kafka_cluster: KafkaCluster) -> None:
    """The sync two-phase commit functions work where the calling thread runs an event loop
    (a notebook): their step runs on a loop of its own, in a thread of its own."""
    topic = _name("sync-loop")
    kafka_cluster.create_topic(topic, partitions=2, replication=3)
    writer = pk.SyncProducer(kafka_cluster.url, topic=topic, timeout=10.0)
    with writer, writer.atomic_batch(prepare=True) as batch:
        batch.produce(b"v", key="k")
    prepared = batch.prepared
    assert prepared is not None

    async def from_a_running_loop() -> None:
        transactions.commit_prepared_sync(kafka_cluster.url, prepared, timeout=10.0)

    anyio.run(from_a_running_loop)
    committed = kafka_cluster.read(topic, timeout=30.0, isolation_level="read_committed")
    assert [record.value for record in committed] == [b"v"]


def test_sync_atomic_batch_on_jetstream(nats_broker: NatsSessionBroker) -> None:
    """``SyncProducer.atomic_batch()`` on JetStream: the batch stored whole at the block's end,
    ``produce_batch``'s columns in it as on Kafka."""
    from conftest import read_jetstream

    subject = f"{_name('syncjs')}.orders"
    with pk.SyncProducer(
        nats_broker.jetstream_url, topic=subject, create_stream=True, allow_atomic=True
    ) as producer:
        with producer.atomic_batch() as batch:
            for index in range(3):
                batch.produce(b"m-%d" % index)
            batch.produce_batch([b"x", b"y"], headers=[{"h": "1"}, None])
            assert len(batch) == 5
        assert producer.stats.acked == 5
    records = anyio.run(read_jetstream, nats_broker.jetstream_url, subject, 5)
    assert [record["value"] for record in records] == [b"m-0", b"m-1", b"m-2", b"x", b"y"]
