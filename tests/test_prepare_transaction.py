"""``SyncProducer.prepare_transaction`` and ``AtomicBatch.produce_batch``: a Kafka
transaction written from a thread, batch by batch, and left open for another process to commit
(what an exactly-once Spark task does), on the test's mock cluster, read back through its
transaction-aware view."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from conftest import TRANSACTIONS_ON_THE_FAST_PATH

import producerkit as pk
from producerkit import transactions
from producerkit.testing.kafka_cluster import KafkaCluster

pytestmark = TRANSACTIONS_ON_THE_FAST_PATH


@pytest.fixture
def topic(kafka_cluster: KafkaCluster) -> str:
    name = f"prep-{uuid.uuid4().hex[:10]}"
    kafka_cluster.create_topic(name, partitions=4, replication=3)
    return name


def _committed(cluster: KafkaCluster, topic: str) -> list[bytes]:
    records = cluster.read(topic, timeout=30.0, isolation_level="read_committed")
    return sorted(record.value for record in records)


def test_batches_written_in_one_transaction_left_open_then_committed(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    other = f"{topic}-b"
    kafka_cluster.create_topic(other, partitions=2, replication=3)
    values = [b"v-%04d" % i for i in range(3000)]

    def batches() -> Iterator[dict[str, Any]]:
        for start in range(0, 3000, 1000):
            part = values[start : start + 1000]
            yield {"values": part, "keys": part, "headers": [[("h", b"1")]] * len(part)}
        yield {"values": [b"elsewhere"], "topic": other}

    # a transaction's messages count in flight until it is prepared: the window holds them all
    with pk.SyncProducer(
        kafka_cluster.url, topic=topic, transactional_id=f"t-{topic}", max_in_flight_messages=4000
    ) as sync:
        prepared = sync.prepare_transaction(batches())
        assert sync.stats.acked == 3001  # written whole: acked at the prepare
    assert prepared is not None
    assert (prepared.transactional_id, prepared.messages) == (f"t-{topic}", 3001)
    assert _committed(kafka_cluster, topic) == []  # open
    anyio.run(lambda: transactions.commit_prepared(kafka_cluster.url, prepared))
    assert _committed(kafka_cluster, topic) == values
    assert _committed(kafka_cluster, other) == [b"elsewhere"]
    records = kafka_cluster.read(topic, isolation_level="read_committed")
    assert all(record.headers == [("h", b"1")] for record in records)


def test_a_batch_source_that_raises_aborts_the_transaction(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    def batches() -> Iterator[dict[str, Any]]:
        yield {"values": [b"a", b"b"], "keys": [b"1", b"2"]}
        raise ValueError("the task's input failed")

    with pk.SyncProducer(kafka_cluster.url, topic=topic, transactional_id=f"t-{topic}") as sync:
        with pytest.raises(ValueError, match="input failed"):
            sync.prepare_transaction(batches())
        stats = sync.stats
    assert (stats.acked, stats.failed) == (0, 2)
    assert _committed(kafka_cluster, topic) == []
    view = kafka_cluster.transactions.view(topic)
    assert {state for _, state in view.batches} == {"aborted"}


def test_a_bad_message_fails_its_batch_before_any_is_added(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    with pk.SyncProducer(kafka_cluster.url, topic=topic, transactional_id=f"t-{topic}") as sync:
        with pytest.raises(pk.MessageError, match="message 1"):
            sync.prepare_transaction([{"values": [b"a", None, b"c"]}])
        assert sync.stats.produced == 0
    # nothing was written: no transaction, nothing to end
    assert sync.stats.produced == 0


def test_an_empty_source_prepares_nothing(kafka_cluster: KafkaCluster, topic: str) -> None:
    with pk.SyncProducer(kafka_cluster.url, topic=topic, transactional_id=f"t-{topic}") as sync:
        assert sync.prepare_transaction(iter(())) is None


def test_the_prepare_waits_for_every_batch_answered_not_only_the_first(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    """The first batch is answered before the next is drawn; the next ones are answered only
    after a 300 ms round trip. The transaction is prepared once the last was answered too
    (every message acked at the prepare, none left in flight)."""

    def batches() -> Iterator[dict[str, Any]]:
        yield {"values": [b"0-%d" % i for i in range(500)]}
        time.sleep(0.3)  # answered meanwhile
        kafka_cluster.set_rtt(None, 300)
        for number in (1, 2):
            yield {"values": [b"%d-%d" % (number, i) for i in range(500)]}

    try:
        with pk.SyncProducer(
            kafka_cluster.url,
            topic=topic,
            transactional_id=f"t-{topic}",
            timeout=10.0,
            max_in_flight_messages=2000,
        ) as sync:
            prepared = sync.prepare_transaction(batches())
            stats = sync.stats
    finally:
        kafka_cluster.set_rtt(None, 0)
    assert prepared is not None and prepared.messages == 1500
    assert (stats.acked, stats.in_flight) == (1500, 0)
    anyio.run(lambda: transactions.commit_prepared(kafka_cluster.url, prepared))
    assert len(_committed(kafka_cluster, topic)) == 1500


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("memory://prep", "no other process to end"),
        ("jetstream://127.0.0.1:1", "commits when its block ends"),
        ("null://", "no atomic batches"),
    ],
)
def test_ending_a_prepared_transaction_where_none_can_be_prepared_is_refused_typed(
    url: str, why: str
) -> None:
    """The ends go through the URL's backend: one that cannot prepare a batch refuses at the
    call, saying why, before anything connects."""
    handle = transactions.PreparedTransaction("t-0", 7, 0, 1)
    for end in (transactions.commit_prepared_sync, transactions.abort_prepared_sync):
        with pytest.raises(pk.ConfigurationError, match=f"no prepared transactions.*{why}"):
            end(url, handle)
    with pytest.raises(pk.ConfigurationError, match=f"no prepared transactions.*{why}"):
        transactions.abort_open_sync(url, ["t-0"])


def test_an_end_given_a_transactional_id_is_refused_typed() -> None:
    handle = transactions.PreparedTransaction("t-0", 7, 0, 1)
    with pytest.raises(pk.ConfigurationError, match="drop transactional_id"):
        transactions.commit_prepared_sync("kafka://127.0.0.1:1", handle, transactional_id="x")
