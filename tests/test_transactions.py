"""Kafka atomic batches: one transaction each (``Producer.atomic_batch()`` on ``kafka://``).

On the mock cluster of three brokers and on Tansu: a block's messages are committed together
when it ends and count as acked only then; a block that raises aborts them; the coordinator's
refusals end the batch with a typed ``AtomicBatchError`` whose ``kind`` says why, every message
failed and none acked; a newer producer with the same transactional id fences the older (Tansu:
the mock does not fence). What a ``read_committed`` consumer sees is the cluster's
transaction-aware view's to say (tests/test_transaction_view.py)."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
from conftest import TRANSACTIONS_ON_THE_FAST_PATH

import producerkit as pk
from producerkit.testing.brokers import create_kafka_topic
from producerkit.testing.kafka_cluster import KafkaCluster
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio
fast_path_only = TRANSACTIONS_ON_THE_FAST_PATH

PARTITIONS = 6


@pytest.fixture
def cluster_topic(kafka_cluster: KafkaCluster) -> str:
    name = f"x-{uuid.uuid4().hex[:12]}"
    kafka_cluster.create_topic(name, partitions=PARTITIONS, replication=3)
    return name


@fast_path_only
async def test_batches_commit_whole_and_a_raising_block_aborts(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    """40 atomic batches of 250 keyed messages over 6 partitions, the application raising in
    batch 17 after 125 messages: 39 x 250 acked, batch 17's 125 failed as aborted."""
    failures: list[pk.Failure] = []
    async with pk.Producer(
        kafka_cluster.url, topic=cluster_topic, timeout=20.0, on_delivery=_keep_failures(failures)
    ) as producer:
        for number in range(40):
            with pytest.raises(RuntimeError) if number == 17 else _nothing():
                async with producer.atomic_batch() as batch:
                    for index in range(250):
                        if number == 17 and index == 125:
                            raise RuntimeError("the application failed mid-batch")
                        await batch.produce(b"%d-%d" % (number, index), key=b"k-%d" % (index % 25))
        stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed) == (9875, 9750, 125)
    assert {type(f.exception) for f in failures} == {pk.AtomicBatchError}
    assert {f.exception.kind for f in failures} == {"aborted"}  # type: ignore[attr-defined]
    assert not any(f.possibly_stored for f in failures)
    assert {f.value.split(b"-")[0] for f in failures} == {b"17"}
    stored = kafka_cluster.read(cluster_topic, timeout=30.0)
    assert len(stored) == 9875  # read_uncommitted: the aborted ones are in the log


@fast_path_only
async def test_messages_count_as_acked_only_at_the_commit(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    async with pk.Producer(kafka_cluster.url, topic=cluster_topic, timeout=10.0) as producer:
        async with producer.atomic_batch() as batch:
            for index in range(20):
                await batch.produce(b"v-%d" % index, key=b"k")
            await anyio.sleep(0.5)  # written and answered by now, not committed
            assert producer.stats.acked == 0 and producer.stats.in_flight == 20
        assert producer.stats.acked == 20


@fast_path_only
async def test_a_flush_inside_the_batch_waits_for_its_writes_not_for_its_commit(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    """flush() in the block that opened the batch: the batch's messages are written and answered
    (acked only at the commit, when the block ends) and the producer's other messages acked; it
    does not wait for the commit, which comes after it (it waited for the messages' deadlines,
    then the batch aborted)."""
    async with pk.Producer(kafka_cluster.url, topic=cluster_topic, timeout=20.0) as producer:
        async with producer.atomic_batch() as batch:
            for index in range(30):
                await producer.produce(b"outside-%d" % index, key=b"o", nonblocking=True)
                await batch.produce(b"inside-%d" % index, key=b"k-%d" % (index % 3))
            with anyio.fail_after(5):
                await producer.flush()
            stats = producer.stats
            assert (stats.acked, stats.in_flight, stats.failed) == (30, 30, 0)
            written = await anyio.to_thread.run_sync(kafka_cluster.read, cluster_topic)
            assert len(written) == 60  # read_uncommitted: the batch's are in the log already
        stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed) == (60, 60, 0)
    committed = await anyio.to_thread.run_sync(
        lambda: kafka_cluster.read(cluster_topic, isolation_level="read_committed")
    )
    assert sorted(record.value for record in committed) == sorted(
        [b"outside-%d" % i for i in range(30)] + [b"inside-%d" % i for i in range(30)]
    )


@fast_path_only
@pytest.mark.parametrize(
    ("errors", "kind"),
    [
        (["INVALID_PRODUCER_EPOCH"], "fenced"),
        (["PRODUCER_FENCED"], "fenced"),
        (["UNKNOWN_PRODUCER_ID"], "refused"),
        (["COORDINATOR_NOT_AVAILABLE"] * 200, "coordinator_unavailable"),
    ],
)
async def test_an_end_txn_the_cluster_refuses_fails_the_batch_typed(
    kafka_cluster: KafkaCluster, cluster_topic: str, errors: list[str], kind: str
) -> None:
    """The commit refused: every message of the batch fails with an AtomicBatchError of that
    kind, none is acked."""
    async with pk.Producer(kafka_cluster.url, topic=cluster_topic, timeout=2.0) as producer:
        kafka_cluster.fail_requests("EndTxn", errors)
        with pytest.raises(pk.AtomicBatchError) as raised:
            async with producer.atomic_batch() as batch:
                for index in range(50):
                    await batch.produce(b"v-%d" % index, key=b"k-%d" % index)
        kafka_cluster.clear_request_errors("EndTxn")
        assert raised.value.kind == kind
        stats = producer.stats
        assert (stats.acked, stats.failed, stats.in_flight) == (0, 50, 0)


@fast_path_only
async def test_a_coordinator_busy_for_a_while_is_asked_again(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    async with pk.Producer(kafka_cluster.url, topic=cluster_topic, timeout=10.0) as producer:
        kafka_cluster.fail_requests(
            "EndTxn", ["COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR", "CONCURRENT_TRANSACTIONS"]
        )
        kafka_cluster.fail_requests("AddPartitionsToTxn", ["CONCURRENT_TRANSACTIONS"])
        async with producer.atomic_batch() as batch:
            for index in range(30):
                await batch.produce(b"v-%d" % index)
        assert producer.stats.acked == 30


@fast_path_only
async def test_a_message_failing_aborts_the_batch(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    async with pk.Producer(kafka_cluster.url, topic=cluster_topic, timeout=5.0) as producer:
        kafka_cluster.fail_requests("Produce", [87])  # INVALID_RECORD: not retried
        with pytest.raises(pk.AtomicBatchError) as raised:
            async with producer.atomic_batch() as batch:
                await batch.produce(b"refused", key=b"k")
        assert raised.value.kind == "message_failed"
        assert (producer.stats.acked, producer.stats.failed) == (0, 1)
        async with producer.atomic_batch() as batch:  # the next transaction goes through
            await batch.produce(b"next", key=b"k")
        assert producer.stats.acked == 1


@fast_path_only
async def test_one_transaction_open_at_a_time_per_producer(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    events: list[str] = []

    async def batch_of(name: str) -> None:
        async with producer.atomic_batch() as batch:
            events.append(f"{name} open")
            for index in range(10):
                await batch.produce(b"%s-%d" % (name.encode(), index))
                await anyio.sleep(0.01)
            events.append(f"{name} end")

    async with pk.Producer(kafka_cluster.url, topic=cluster_topic, timeout=10.0) as producer:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(batch_of, "a")
            tasks.start_soon(batch_of, "b")
        assert producer.stats.acked == 20
    assert events in (
        ["a open", "a end", "b open", "b end"],
        ["b open", "b end", "a open", "a end"],
    )


@fast_path_only
async def test_a_broker_without_transactions_is_a_typed_error_at_the_first_batch(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    kafka_cluster.fail_requests("FindCoordinator", ["TRANSACTIONAL_ID_AUTHORIZATION_FAILED"])
    async with pk.Producer(kafka_cluster.url, topic=cluster_topic, timeout=5.0) as producer:
        with pytest.raises(pk.AtomicBatchError) as raised:
            async with producer.atomic_batch() as batch:
                await batch.produce(b"v")
        assert raised.value.kind == "unsupported"


@fast_path_only
async def test_a_newer_producer_of_the_transactional_id_fences_the_older(
    kafka_broker: SessionBroker, topic: str
) -> None:
    """On Tansu, which fences (the mock does not): the older producer's next batch fails with
    kind "fenced", and so does every later one; the newer commits."""
    await create_kafka_topic(kafka_broker.url, topic, 3)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    async with pk.Producer(
        kafka_broker.url, topic=topic, timeout=5.0, transactional_id=transactional_id
    ) as older:
        async with older.atomic_batch() as batch:
            await batch.produce(b"first")
        async with pk.Producer(
            kafka_broker.url, topic=topic, timeout=5.0, transactional_id=transactional_id
        ) as newer:
            async with newer.atomic_batch() as batch:
                await batch.produce(b"newer")
            assert newer.stats.acked == 1
        for _ in range(2):
            with pytest.raises(pk.AtomicBatchError) as raised:
                async with older.atomic_batch() as batch:
                    await batch.produce(b"fenced")
            assert raised.value.kind == "fenced"
        assert older.stats.acked == 1


def _keep_failures(failures: list[pk.Failure]) -> Any:
    def on_delivery(outcome: pk.Delivery | pk.Failure, context: object) -> None:
        if isinstance(outcome, pk.Failure):
            failures.append(outcome)

    return on_delivery


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


async def test_transactions_on_the_public_path_are_refused_typed(
    kafka_cluster: KafkaCluster, cluster_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka transactions are producerkit's own Produce requests: on aiokafka's public API (the
    fallback where its internals are not as expected) the first batch says so, typed."""
    monkeypatch.setenv("PRODUCERKIT_CLIENT_PATH", "public")
    async with pk.Producer(kafka_cluster.url, topic=cluster_topic, timeout=5.0) as producer:
        with pytest.raises(pk.AtomicBatchError, match="public API") as raised:
            async with producer.atomic_batch() as batch:
                await batch.produce(b"v")
        assert raised.value.kind == "unsupported"
        assert producer.stats.produced == 0
