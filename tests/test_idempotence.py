"""The idempotent producer on Kafka: producer ids, sequence numbers and epochs, on the mock
cluster of three brokers (``kafka_cluster``) and on Tansu (``kafka_broker``).

On both client paths (producerkit's own requests, and aiokafka's public API), through leader
moves, injected retriable errors, the broker's sequence errors and a broker going down, every
message ends acked or failed, and what was acked is read back by another client once, each
key's messages in the order they were produced. The mock checks sequence numbers only for
transactional producers: order with five batches per partition in flight rests there on the
producer alone (the tests of it would fail, as they did, for a producer that wrote a
partition's requests out of order)."""

from __future__ import annotations

import contextlib
import logging
import struct
import time
import uuid
from collections import defaultdict
from typing import Any

import anyio
import pytest

import producerkit as pk
from producerkit.backends.kafka import idempotence
from producerkit.testing.kafka_cluster import KafkaCluster, KafkaRecord
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio

PARTITIONS = 6
KEYS = 60


@pytest.fixture
def cluster_topic(kafka_cluster: KafkaCluster) -> str:
    name = f"i-{uuid.uuid4().hex[:12]}"
    kafka_cluster.create_topic(name, partitions=PARTITIONS, replication=3)
    return name


@pytest.fixture(params=["fast", "public"])
def client_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on both client paths: producerkit's own requests, and aiokafka's public API."""
    path: str = request.param
    monkeypatch.setenv("PRODUCERKIT_CLIENT_PATH", path)
    return path


def _value(number: int) -> bytes:
    return b"%d" % number


def _key(number: int) -> bytes:
    return b"key-%d" % (number % KEYS)


def assert_once_in_key_order(records: list[KafkaRecord], acked: set[int]) -> None:
    """Every acked message read back once, and no key's messages out of produce order."""
    values = [int(record.value or b"-1") for record in records]
    assert len(values) == len(set(values)), "a message stored twice"
    assert acked <= set(values), f"{len(acked - set(values))} acked messages missing"
    by_key: dict[bytes | None, list[int]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_key[record.key].append(int(record.value or b"-1"))
    disordered = [key for key, numbers in by_key.items() if numbers != sorted(numbers)]
    assert not disordered, f"{len(disordered)} keys out of order"


async def _produce_through(producer: pk.Producer, count: int, events: dict[int, Any]) -> None:
    """Produce ``count`` keyed messages nonblocking, calling ``events[n]()`` before message n,
    then wait for every outcome."""
    for number in range(count):
        event = events.get(number)
        if event is not None:
            event()
        await producer.produce(_value(number), key=_key(number), nonblocking=True)
    with contextlib.suppress(pk.ProduceError):
        await producer.flush()


@pytest.mark.parametrize("options", [{"enable_idempotence": True}, {}], ids=["explicit", "default"])
async def test_leader_moves_and_retriable_errors_store_each_message_once_in_key_order(
    kafka_cluster: KafkaCluster, cluster_topic: str, client_path: str, options: dict[str, Any]
) -> None:
    """30,000 keyed messages through a move of every partition's leader and a burst of
    NOT_LEADER_OR_FOLLOWER / NOT_ENOUGH_REPLICAS answers: all acked, each read back once, every
    key in order; idempotent whether asked for or by default."""
    count = 30_000
    deliveries: list[pk.Delivery] = []

    def move_every_leader() -> None:
        for partition in range(PARTITIONS):
            kafka_cluster.set_leader(cluster_topic, partition, (partition + 1) % 3 + 1)

    def burst() -> None:
        errors = ["NOT_LEADER_OR_FOLLOWER", "NOT_ENOUGH_REPLICAS"] * 4
        kafka_cluster.fail_requests("Produce", errors)

    async with pk.Producer(
        kafka_cluster.url, topic=cluster_topic, timeout=30.0, on_delivery=deliveries.append,
        **options,
    ) as producer:  # fmt: skip
        assert producer.backend.idempotent is True
        assert producer.backend.client_path == client_path
        await _produce_through(producer, count, {count // 3: move_every_leader, count // 2: burst})
        stats = producer.stats
    assert stats.acked == stats.produced == count and stats.failed == 0
    assert all(delivery.offset is not None for delivery in deliveries)
    records = kafka_cluster.read(cluster_topic, timeout=30.0)
    assert len(records) == count
    assert_once_in_key_order(records, {int(d.value or b"-1") for d in deliveries})


@pytest.mark.parametrize(
    "error", ["OUT_OF_ORDER_SEQUENCE_NUMBER", "UNKNOWN_PRODUCER_ID", "INVALID_PRODUCER_EPOCH"]
)
async def test_sequence_errors_bump_the_epoch_and_store_each_message_once(
    kafka_cluster: KafkaCluster,
    cluster_topic: str,
    error: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker lost the producer's state (or the sequence before a batch): the producer
    drains, has its epoch bumped (KIP-360) and sends what was not acked again, numbered anew;
    nothing is lost, nothing stored twice, every key in order. (The fast path's own sender:
    aiokafka's has its own handling on the public path.)

    One batch per partition in flight: the error is injected into one request, and the mock,
    which checks no idempotent producer's sequences, stores the next requests' batches where a
    broker that lost the sequence would refuse them too; with five in flight, order then rests
    on the broker (as for the Java client and librdkafka)."""
    monkeypatch.setenv("PRODUCERKIT_CLIENT_PATH", "fast")
    count = 10_000
    async with pk.Producer(
        kafka_cluster.url, topic=cluster_topic, timeout=30.0, max_batches_in_flight=1
    ) as producer:
        sender = producer.backend._sender  # type: ignore[attr-defined]
        first = sender.producer_id
        with caplog.at_level(logging.WARNING, logger="producerkit.kafka"):
            await _produce_through(
                producer,
                count,
                {count // 2: lambda: kafka_cluster.fail_requests("Produce", [error])},
            )
        assert producer.stats.acked == count
        bumped = sender.producer_id
    assert (bumped.id, bumped.epoch) != (first.id, first.epoch)
    assert "bumping the producer epoch" in caplog.text
    records = kafka_cluster.read(cluster_topic, timeout=30.0)
    assert len(records) == count
    assert_once_in_key_order(records, set(range(count)))


async def test_a_duplicate_sequence_is_acked(
    kafka_cluster: KafkaCluster, cluster_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DUPLICATE_SEQUENCE_NUMBER: the broker stored the batch before; its messages are acked
    (without an offset: the broker gives none)."""
    monkeypatch.setenv("PRODUCERKIT_CLIENT_PATH", "fast")
    async with pk.Producer(kafka_cluster.url, topic=cluster_topic, timeout=10.0) as producer:
        await producer.produce(b"warm-up", key=b"k")
        kafka_cluster.fail_requests("Produce", ["DUPLICATE_SEQUENCE_NUMBER"])
        delivery = await producer.produce(b"again", key=b"k")
    assert delivery.offset is None


async def test_a_broker_down_then_its_partitions_moved_recovers_within_5s(
    kafka_cluster: KafkaCluster, cluster_topic: str, client_path: str
) -> None:
    """A leader's broker goes down and its partitions move to the others 2 s later: every
    message ends acked or failed typed, none is lost, and acks resume within 5 s of the move."""
    count = 20_000
    ack_times: list[float] = []
    failures: list[pk.Failure] = []
    leaders = {partition: partition % 3 + 1 for partition in range(PARTITIONS)}
    for partition, broker in leaders.items():
        kafka_cluster.set_leader(cluster_topic, partition, broker)
    moved_at: list[float] = []

    async def fault() -> None:
        await anyio.sleep(0.3)
        kafka_cluster.broker_down(1)
        await anyio.sleep(2.0)
        for partition, broker in leaders.items():
            if broker == 1:
                kafka_cluster.set_leader(cluster_topic, partition, 2)
        moved_at.append(time.monotonic())

    def seen(outcome: pk.Delivery | pk.Failure) -> None:
        if isinstance(outcome, pk.Failure):
            failures.append(outcome)
        else:
            ack_times.append(time.monotonic())

    async with (
        pk.Producer(
            kafka_cluster.url, topic=cluster_topic, timeout=15.0, on_delivery=seen
        ) as producer,
        anyio.create_task_group() as tasks,
    ):
        tasks.start_soon(fault)
        for number in range(count):
            await producer.produce(_value(number), key=_key(number), nonblocking=True)
            if number % 500 == 0:
                await anyio.sleep(0.05)  # spread over the fault
        with contextlib.suppress(pk.ProduceError):
            await producer.flush()
        stats = producer.stats
    assert stats.acked + stats.failed == stats.produced == count
    assert all(isinstance(f.exception, pk.ProducerkitError) for f in failures)
    after_move = [t for t in ack_times if t >= moved_at[0]]
    if stats.acked < count:  # some waited for the move: the first ack after it came soon
        assert after_move and after_move[0] - moved_at[0] < 5.0
    records = kafka_cluster.read(cluster_topic, timeout=30.0)
    acked_values = {int(r.value or b"-1") for r in records}
    assert len(acked_values) >= stats.acked


async def test_tansu_grants_a_producer_id_and_the_default_producer_is_idempotent(
    kafka_broker: SessionBroker, topic: str
) -> None:
    async with pk.Producer(kafka_broker.url, topic=topic) as producer:
        await producer.produce(b"v", key=b"k")
        backend = producer.backend
        assert backend.idempotent is (backend.client_path == "fast"), backend.idempotence_reason
        if backend.client_path == "public":  # aiokafka asks with v0, which Tansu does not grant
            assert "granted no producer id" in backend.idempotence_reason


async def test_explicit_idempotence_on_a_broker_that_refuses_is_a_typed_error_at_start(
    kafka_cluster: KafkaCluster, cluster_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    kafka_cluster.fail_requests("InitProducerId", ["CLUSTER_AUTHORIZATION_FAILED"] * 3)
    with pytest.raises(pk.ConfigurationError, match="enable_idempotence=True needs a producer id"):
        async with pk.Producer(
            kafka_cluster.url, topic=cluster_topic, enable_idempotence=True
        ) as producer:
            await producer.produce(b"v")
    kafka_cluster.clear_request_errors("InitProducerId")
    kafka_cluster.fail_requests("InitProducerId", ["CLUSTER_AUTHORIZATION_FAILED"] * 3)
    with caplog.at_level(logging.INFO, logger="producerkit.kafka"):
        async with pk.Producer(kafka_cluster.url, topic=cluster_topic) as producer:
            delivery = await producer.produce(b"v")
            assert producer.backend.idempotent is False
            assert "granted no producer id" in producer.backend.idempotence_reason
    assert delivery.offset is not None
    assert caplog.text.count("not idempotent") == 1


async def test_settings_that_rule_idempotence_out(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    with pytest.raises(pk.ConfigurationError, match="needs acks='all'"):
        pk.Producer(kafka_cluster.url, topic=cluster_topic, enable_idempotence=True, acks=1)
    with pytest.raises(pk.ConfigurationError, match="at most 5"):
        pk.Producer(
            kafka_cluster.url, topic=cluster_topic, enable_idempotence=True, max_batches_in_flight=6
        )
    async with pk.Producer(kafka_cluster.url, topic=cluster_topic, acks=1) as producer:
        await producer.produce(b"v")
        assert producer.backend.idempotent is False
        assert "acks=1" in producer.backend.idempotence_reason
    async with pk.Producer(
        kafka_cluster.url, topic=cluster_topic, enable_idempotence=False
    ) as producer:
        await producer.produce(b"v")
        assert producer.backend.idempotent is False


def test_a_stamped_batch_carries_the_producer_id_with_a_valid_crc() -> None:
    from aiokafka.record.default_records import DefaultRecordBatch

    from producerkit._record import Record
    from producerkit.backends.kafka.record_batch import encode_batch

    records = [
        Record(n, b"value-%d" % n, b"k", "t", 0, None, None, time.monotonic(), 0, None, None)
        for n in range(10)
    ]
    data, end = encode_batch(records, 0, 1 << 20, 0.0)
    assert end == 10
    head = idempotence.stamp(data, idempotence.ProducerId(4242, 7), 1000, transactional=True)
    batch = DefaultRecordBatch(head + bytes(data[len(head) :]))
    assert batch.validate_crc()
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (4242, 7, 1000)
    assert batch.is_transactional
    assert [record.value for record in batch] == [r.value for r in records]
    (attributes,) = struct.unpack_from(">h", head, 21)
    plain = idempotence.stamp(data, idempotence.ProducerId(1, 0), 0)
    assert not struct.unpack_from(">h", plain, 21)[0] & idempotence.TRANSACTIONAL_BIT
    assert attributes & idempotence.TRANSACTIONAL_BIT
