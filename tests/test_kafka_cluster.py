"""KafkaCluster, librdkafka's mock cluster of three brokers (the test's ``kafka_cluster``),
with plain clients: confluent-kafka and aiokafka produce to it and read it back; leaders move,
brokers go down and come back, responses slow down and the next requests of a kind fail with
the errors a test names, and the clients get through with every record stored once."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from typing import Any

import anyio
import pytest

import producerkit as pk
from producerkit.testing.kafka_cluster import (
    API_KEYS,
    KafkaCluster,
    KafkaClusterError,
    api_key,
    error_code,
)

confluent_kafka = pytest.importorskip("confluent_kafka")

PARTITIONS = 6


@pytest.fixture
def topic(kafka_cluster: KafkaCluster) -> str:
    """A fresh topic of 6 partitions on the 3 brokers."""
    name = f"c-{uuid.uuid4().hex[:12]}"
    kafka_cluster.create_topic(name, partitions=PARTITIONS, replication=3)
    return name


def _producer(cluster: KafkaCluster, **config: Any) -> Any:
    return confluent_kafka.Producer(
        {"bootstrap.servers": cluster.bootstrap, "linger.ms": 5, "log_level": 3, **config}
    )


def _produce(
    producer: Any, topic: str, count: int, partition: int | None = None, prefix: bytes = b"v"
) -> list[str]:
    """Produce ``count`` keyed records, values ``prefix-0``...; returns the list the delivery
    reports fill (an error name, or "ok")."""
    reports: list[str] = []

    def on_delivery(error: Any, message: Any) -> None:
        reports.append("ok" if error is None else error.name())

    for i in range(count):
        extra = {} if partition is None else {"partition": partition}
        producer.produce(
            topic,
            value=b"%s-%d" % (prefix, i),
            key=b"k-%d" % (i % 40),
            on_delivery=on_delivery,
            **extra,
        )
    return reports


def _values(cluster: KafkaCluster, topic: str) -> list[bytes | None]:
    return [record.value for record in cluster.read(topic)]


def test_a_topic_of_six_partitions_led_by_three_brokers(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    assert kafka_cluster.broker_ids == (1, 2, 3)
    addresses = kafka_cluster.bootstrap.split(",")
    assert len(addresses) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
    assert kafka_cluster.url == f"kafka://{kafka_cluster.bootstrap}"
    assert kafka_cluster.broker_address(2) == addresses[1]
    leaders = kafka_cluster.partition_leaders(topic)
    assert leaders == {0: 1, 1: 2, 2: 3, 3: 1, 4: 2, 5: 3}
    with pytest.raises(KafkaClusterError, match="TOPIC_ALREADY_EXISTS") as caught:
        kafka_cluster.create_topic(topic, partitions=2)
    assert caught.value.code == 36 and caught.value.name == "TOPIC_ALREADY_EXISTS"
    with pytest.raises(pk.ConfigurationError, match=r"replication must be 1\.\.3"):
        kafka_cluster.create_topic("too-replicated", replication=4)
    with pytest.raises(KafkaClusterError, match="no topic 'no-such-topic'"):
        kafka_cluster.read("no-such-topic")


def test_produce_and_read_back(kafka_cluster: KafkaCluster, topic: str) -> None:
    producer = _producer(kafka_cluster)
    producer.produce(topic, value=b"first", key=b"k", headers=[("h", b"1"), ("h", b"2")])
    reports = _produce(producer, topic, 200)
    assert producer.flush(10) == 0
    assert reports == ["ok"] * 200
    records = kafka_cluster.read(topic)
    assert len(records) == 201
    assert {r.partition for r in records} == set(range(PARTITIONS))  # keys spread
    assert [(r.partition, r.offset) for r in records] == sorted(
        (r.partition, r.offset) for r in records
    )
    [first] = [r for r in records if r.value == b"first"]
    assert first.key == b"k" and first.headers == [("h", b"1"), ("h", b"2")]
    assert first.timestamp is not None
    # Each key in one partition, in the order produced.
    for key in {r.key for r in records if r.key != b"k"}:
        mine = [r for r in records if r.key == key]
        assert len({r.partition for r in mine}) == 1
        assert [int(r.value.split(b"-")[1]) for r in mine if r.value] == sorted(
            int(r.value.split(b"-")[1]) for r in mine if r.value
        )


def test_set_leader_moves_a_partition(kafka_cluster: KafkaCluster, topic: str) -> None:
    before = kafka_cluster.partition_leaders(topic)
    other = next(b for b in kafka_cluster.broker_ids if b != before[0])
    kafka_cluster.set_leader(topic, 0, other)
    admin = confluent_kafka.admin.AdminClient(
        {"bootstrap.servers": kafka_cluster.bootstrap, "log_level": 3}
    )
    metadata = admin.list_topics(topic, timeout=10).topics[topic]
    assert metadata.partitions[0].leader == other
    assert {p: metadata.partitions[p].leader for p in range(1, PARTITIONS)} == {
        p: before[p] for p in range(1, PARTITIONS)
    }
    kafka_cluster.move_leaders(topic, 3)
    assert set(kafka_cluster.partition_leaders(topic).values()) == {3}
    with pytest.raises(pk.ConfigurationError, match="no broker 7"):
        kafka_cluster.set_leader(topic, 0, 7)


def test_a_broker_down_holds_its_partitions_until_the_leader_moves(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    kafka_cluster.set_leader(topic, 0, 1)
    producer = _producer(kafka_cluster, **{"enable.idempotence": True})
    warm = _produce(producer, topic, 1, partition=0, prefix=b"warm")
    assert producer.flush(10) == 0 and warm == ["ok"]

    kafka_cluster.broker_down(1)
    reports = _produce(producer, topic, 50, partition=0)
    assert producer.flush(1.5) > 0  # held: its leader refuses connections
    assert reports == []
    kafka_cluster.set_leader(topic, 0, 2)
    assert producer.flush(15) == 0
    assert reports == ["ok"] * 50
    kafka_cluster.broker_up(1)  # it leads other partitions, which read() reads to their end
    records = kafka_cluster.read(topic)
    assert {r.partition for r in records} == {0}
    assert sorted(r.value for r in records) == sorted(
        [b"warm-0"] + [b"v-%d" % i for i in range(50)]
    )


def test_a_broker_down_refuses_connections_on_its_port(kafka_cluster: KafkaCluster) -> None:
    """Through the recorder as without it: a broker down refuses new connections on the port
    clients know, closes the open ones, and takes them again once up; reset() brings it up."""
    import socket

    host, _, port = kafka_cluster.broker_address(2).rpartition(":")
    open_one = socket.create_connection((host, int(port)), timeout=5)
    kafka_cluster.broker_down(2)
    try:
        open_one.settimeout(5)
        # closed by the broker: an orderly close, or a reset (seen in CI)
        with contextlib.suppress(ConnectionResetError):
            assert open_one.recv(1) == b""
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=5).close()
        kafka_cluster.broker_up(2)
        socket.create_connection((host, int(port)), timeout=5).close()
        kafka_cluster.broker_down(2)
        kafka_cluster.reset()
        socket.create_connection((host, int(port)), timeout=5).close()
    finally:
        open_one.close()
        kafka_cluster.broker_up(2)


def test_injected_produce_errors_are_retried_and_stored_once(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    producer = _producer(kafka_cluster, **{"retry.backoff.ms": 10})
    warm = _produce(producer, topic, 1, prefix=b"warm")
    assert producer.flush(10) == 0 and warm == ["ok"]
    kafka_cluster.fail_requests("Produce", ["NOT_LEADER_OR_FOLLOWER"] * 3)
    reports = _produce(producer, topic, 300)
    assert producer.flush(20) == 0
    assert reports == ["ok"] * 300
    values = _values(kafka_cluster, topic)
    assert sorted(values) == sorted([b"warm-0"] + [b"v-%d" % i for i in range(300)])


def test_set_rtt_slows_a_round_trip(kafka_cluster: KafkaCluster, topic: str) -> None:
    kafka_cluster.set_leader(topic, 0, 2)
    producer = _producer(kafka_cluster, **{"linger.ms": 0})

    def round_trip() -> float:
        reports = _produce(producer, topic, 1, partition=0)
        started = time.perf_counter()
        assert producer.flush(10) == 0 and reports == ["ok"]
        return time.perf_counter() - started

    round_trip()  # connected, metadata known
    direct = min(round_trip() for _ in range(3))
    kafka_cluster.set_rtt(2, 300)
    slowed = min(round_trip() for _ in range(2))
    assert slowed - direct >= 0.25, (direct, slowed)
    kafka_cluster.set_rtt(2, 0)
    assert min(round_trip() for _ in range(3)) < 0.15


@pytest.mark.anyio
async def test_aiokafka_idempotent_producer_gets_an_id_and_delivers(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    from aiokafka import AIOKafkaProducer

    kafka_cluster.fail_requests("Produce", ["NOT_LEADER_OR_FOLLOWER"])
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_cluster.bootstrap, enable_idempotence=True, acks="all"
    )
    await producer.start()
    try:
        sent = [await producer.send(topic, b"a-%d" % i, key=b"k-%d" % (i % 3)) for i in range(30)]
        metadata = [await future for future in sent]
        assert producer._txn_manager is not None
        assert producer._txn_manager.producer_id >= 0  # granted by InitProducerId
    finally:
        await producer.stop()
    assert {m.topic for m in metadata} == {topic}
    records = await anyio.to_thread.run_sync(kafka_cluster.read, topic)
    assert sorted(r.value for r in records) == sorted(b"a-%d" % i for i in range(30))


@pytest.mark.anyio
async def test_producerkit_through_the_fault_proxy_reaches_every_broker(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    """The proxy rewrites Metadata: the producer talks to the three brokers through it."""
    async with pk.Producer(kafka_cluster.faulty_url, topic=topic, timeout=20) as producer:
        for i in range(60):
            await producer.produce(b"p-%d" % i, key=b"k-%d" % i, nonblocking=True)
        await producer.flush()
        assert kafka_cluster.faults.connections >= 3  # bootstrap + one per partition leader
    records = await anyio.to_thread.run_sync(kafka_cluster.read, topic)
    assert sorted(r.value for r in records) == sorted(b"p-%d" % i for i in range(60))
    assert {r.partition for r in records} == set(range(PARTITIONS))


def test_reset_restores_the_brokers(kafka_cluster: KafkaCluster, topic: str) -> None:
    kafka_cluster.set_leader(topic, 0, 3)
    kafka_cluster.broker_down(3)
    kafka_cluster.set_rtt(None, 2000)
    kafka_cluster.fail_requests("Produce", ["NOT_ENOUGH_REPLICAS"] * 1000)
    kafka_cluster.fail_requests(0, [19])
    kafka_cluster.reset()
    producer = _producer(kafka_cluster)
    reports = _produce(producer, topic, 20, partition=0)
    started = time.perf_counter()
    assert producer.flush(10) == 0
    assert reports == ["ok"] * 20
    assert time.perf_counter() - started < 1.5
    assert kafka_cluster.partition_leaders(topic)[0] == 3  # leaders stay as they were
    assert len(kafka_cluster.read(topic)) == 20


def test_names_of_apis_and_errors(kafka_cluster: KafkaCluster) -> None:
    expected = {
        "Produce": 0,
        "InitProducerId": 22,
        "Metadata": 3,
        "AddPartitionsToTxn": 24,
        "AddOffsetsToTxn": 25,
        "EndTxn": 26,
        "FindCoordinator": 10,
        "TxnOffsetCommit": 28,
    }
    assert {name: API_KEYS[name] for name in expected} == expected
    assert api_key("produce") == 0 and api_key(22) == 22
    assert error_code("not_leader_or_follower") == 6 and error_code(90) == 90
    assert error_code("PRODUCER_FENCED") == 90 and error_code("DISCONNECT") < 0
    with pytest.raises(pk.ConfigurationError, match=r"did you mean 'InitProducerId'\?"):
        kafka_cluster.fail_requests("InitProducerID2", [6])
    with pytest.raises(
        pk.ConfigurationError, match=r"did you mean 'OUT_OF_ORDER_SEQUENCE_NUMBER'\?"
    ):
        kafka_cluster.fail_requests("Produce", ["OUT_OF_ORDER_SEQUENCE"])
    with pytest.raises(pk.ConfigurationError, match="not one string"):
        kafka_cluster.fail_requests("Produce", "NOT_LEADER_OR_FOLLOWER")
    with pytest.raises(pk.ConfigurationError, match="at least 1 broker"):
        KafkaCluster(brokers=0)


def test_a_closed_cluster_refuses_calls() -> None:
    with KafkaCluster(brokers=1) as cluster:
        cluster.create_topic("one", partitions=1)
        assert cluster.partition_leaders("one") == {0: 1}
        assert "1 brokers" in repr(cluster)
    assert cluster.closed
    with pytest.raises(pk.ConfigurationError, match="closed"):
        cluster.create_topic("two")
    cluster.reset()  # nothing to reset: no error
    cluster.close()  # again: no error


def test_importing_it_imports_no_client() -> None:
    code = (
        "import sys, producerkit, producerkit.testing.kafka_cluster, "
        "producerkit.testing.pytest_plugin; "
        "assert 'confluent_kafka' not in sys.modules, 'confluent_kafka imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _consume(cluster: KafkaCluster, topic: str, isolation_level: str) -> list[bytes]:
    """The values a plain confluent-kafka consumer with ``isolation_level`` is served, every
    partition read to its end: what the mock itself serves, not the cluster's view."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "plain",
            "enable.partition.eof": True,
            "isolation.level": isolation_level,
            "log_level": 3,
        }
    )
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(PARTITIONS)
            ]
        )
        values: list[bytes] = []
        pending, deadline = set(range(PARTITIONS)), time.monotonic() + 10
        while pending and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is None:
                values.append(message.value())
            elif message.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                pending.discard(message.partition())
        assert not pending
        return sorted(values)
    finally:
        consumer.close()


def test_what_the_mock_does_not_model(kafka_cluster: KafkaCluster, topic: str) -> None:
    """Pinned as docs/testing.md states it, so that a librdkafka that models more is noticed:
    a read_committed consumer is served a transaction's records before the commit, and a
    producer whose transactional id another one initialized again is not fenced. The cluster's
    view (``read(..., isolation_level="read_committed")``) serves what Kafka would."""
    txn_id = f"txn-{uuid.uuid4().hex[:8]}"
    old = _producer(kafka_cluster, **{"transactional.id": txn_id})
    old.init_transactions(10)
    old.begin_transaction()
    _produce(old, topic, 5, prefix=b"open")
    assert old.flush(10) == 0
    opened = [b"open-%d" % i for i in range(5)]
    assert _consume(kafka_cluster, topic, "read_committed") == opened
    assert kafka_cluster.read(topic, isolation_level="read_committed") == []
    new = _producer(kafka_cluster, **{"transactional.id": txn_id})
    new.init_transactions(10)
    _produce(old, topic, 1, prefix=b"old")
    assert old.flush(10) == 0
    old.commit_transaction(10)  # a real broker fences it: PRODUCER_FENCED
    assert len(kafka_cluster.read(topic)) == 6
    assert _consume(kafka_cluster, topic, "read_committed") == sorted([*opened, b"old-0"])
    # Kafka: the re-initialization aborted the open transaction, and fenced "old-0" out.
    assert kafka_cluster.read(topic, isolation_level="read_committed") == []


def test_the_recorder_stands_in_for_every_broker(kafka_cluster: KafkaCluster) -> None:
    """Clients of the suite's cluster (tests/conftest.py: a ``RecordingKafkaCluster``) reach
    the brokers through the recorders only: the bootstrap and every address Metadata names are
    theirs (``advertise``), not the mock's own ports; a plain ``KafkaCluster`` names the mock's
    ports, and has no read_committed view (the judge ships in no wheel)."""
    mock_ports = kafka_cluster._lib.rd_kafka_mock_cluster_bootstraps(kafka_cluster._mcluster)
    mock = set(mock_ports.decode().split(","))
    assert set(kafka_cluster.mock_addresses) == mock
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap, "log_level": 3})
    brokers = admin.list_topics(timeout=10).brokers
    named = {f"{b.host}:{b.port}" for b in brokers.values()}
    assert named == set(kafka_cluster.bootstrap.split(","))
    assert not named & mock
    with KafkaCluster(brokers=1) as plain:
        assert (
            plain.bootstrap == plain._lib.rd_kafka_mock_cluster_bootstraps(plain._mcluster).decode()
        )
        assert plain.mock_addresses == (plain.bootstrap,)
        plain.create_topic("one", partitions=1)
        with pytest.raises(TypeError, match="isolation_level"):
            plain.read("one", isolation_level="read_committed")  # type: ignore[call-arg]
        assert not hasattr(plain, "transactions")


def test_without_confluent_kafka_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from producerkit.testing import kafka_cluster

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "confluent_kafka" else real(name, *args),
    )
    with pytest.raises(pk.MissingDependencyError, match=r'pip install "producerkit\[pytest\]"'):
        kafka_cluster._library_path()
