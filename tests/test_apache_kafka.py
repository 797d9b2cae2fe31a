"""ApacheKafka: real Apache Kafka nodes (KRaft) from the Maven Central jars, through the
plugin's session fixtures ``apache_kafka`` (one node) and ``apache_kafka_cluster`` (three):
producerkit's round trip, read_committed against read_uncommitted, a killed leader replaced and
restarted, a leader moved, and the errors for a node that cannot start and a missing Java."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import pytest
from conftest import ON_THE_PUBLIC_PATH

import producerkit as pk
from producerkit.errors import BrokerUnavailable, ConfigurationError, MissingDependencyError
from producerkit.testing import apache_kafka as apache_kafka_module
from producerkit.testing._kafka_metadata import node_leaders
from producerkit.testing.apache_kafka import ApacheKafka, cache_dir
from producerkit.testing.brokers import free_port

confluent_kafka = pytest.importorskip("confluent_kafka")


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_a_producerkit_round_trip(apache_kafka: ApacheKafka) -> None:
    port = apache_kafka.nodes[0].port
    assert apache_kafka.url == f"kafka://127.0.0.1:{port}"
    assert apache_kafka.bootstrap_servers == f"127.0.0.1:{port}"
    assert apache_kafka.node_ids == [1] and apache_kafka.transaction_version == 2
    topic = fresh("round-trip")
    apache_kafka.create_topic(topic, partitions=2)
    assert set(apache_kafka.leaders(topic)) == {0, 1} and apache_kafka.leader_of(topic, 1) == 1

    before = int(time.time() * 1000)
    with pk.SyncProducer(apache_kafka.url, topic=topic, timeout=20) as producer:
        for i in range(5):
            producer.produce(b"v%d" % i, key=b"k", headers=[("h", b"x"), ("h", b"y")])
    records = apache_kafka.read(topic, expected=5)
    assert [record["value"] for record in records] == [b"v%d" % i for i in range(5)]
    assert len({record["partition"] for record in records}) == 1  # one key, one partition
    assert [record["offset"] for record in records] == list(range(5))
    first = records[0]
    assert first["key"] == b"k" and first["headers"] == [("h", b"x"), ("h", b"y")]
    assert before - 1000 <= first["timestamp"] <= int(time.time() * 1000) + 1000
    # Without ``expected``: up to each partition's end.
    assert apache_kafka.read(topic, isolation="read_uncommitted") == records


def test_a_batch_larger_than_the_topic_takes_fails_naming_max_batch_size(
    apache_kafka: ApacheKafka,
) -> None:
    """A topic whose max.message.bytes is below the batches producerkit builds refuses them:
    each message of a refused batch fails with MessageTooLarge (on producerkit's own path
    naming the limit and max_batch_size, and not stored); the rest are acked and read back.
    Below the limit, every message is stored."""
    topic = fresh("small-batches")
    apache_kafka.create_topic(topic, config={"max.message.bytes": 20_000})
    values = [b"%04d" % i + b"x" * 508 for i in range(200)]
    with pk.SyncProducer(apache_kafka.url, topic=topic, timeout=20) as producer:
        producer.produce_batch(values)
        with pytest.raises(pk.ProduceError) as raised:
            producer.flush()
        failures = raised.value.failures
        stats = producer.stats
    assert failures and stats.acked + stats.failed == 200
    assert all(isinstance(failure.exception, pk.MessageTooLarge) for failure in failures)
    if not ON_THE_PUBLIC_PATH:
        # aiokafka, which sends the batches on the public path, says neither
        assert not any(failure.possibly_stored for failure in failures)
        text = str(failures[0].exception)
        assert "max.message.bytes" in text and "max_batch_size (now 524,288 bytes)" in text
    stored = [record["value"] for record in apache_kafka.read(topic)]
    assert sorted(stored + [failure.value for failure in failures]) == values

    fitting = fresh("fitting-batches")
    apache_kafka.create_topic(fitting, config={"max.message.bytes": 20_000})
    with pk.SyncProducer(
        apache_kafka.url, topic=fitting, timeout=20, max_batch_size=16_384
    ) as producer:
        producer.produce_batch(values)
        producer.flush()
    assert sorted(record["value"] for record in apache_kafka.read(fitting, expected=200)) == values


def test_read_committed_hides_an_aborted_transaction(apache_kafka: ApacheKafka) -> None:
    topic = fresh("aborted")
    apache_kafka.create_topic(topic)
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": apache_kafka.bootstrap_servers,
            "transactional.id": fresh("txn"),
            "log_level": 3,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)

    committed = apache_kafka.read(topic)
    assert [record["value"] for record in committed] == [b"committed"]
    everything = apache_kafka.read(topic, isolation="read_uncommitted")
    # The aborted record, then the committed one (the abort's control marker takes an offset).
    assert [record["value"] for record in everything] == [b"aborted", b"committed"]
    with pytest.raises(ConfigurationError, match="isolation"):
        apache_kafka.read(topic, isolation="committed")


def each_nodes_leaders(kafka: ApacheKafka, topic: str) -> dict[int, dict[int, int] | None]:
    """The partitions' leaders as each running node's own metadata says."""
    return {
        node: node_leaders("127.0.0.1", kafka.node(node).port, topic, timeout=5)
        for node in kafka.node_ids
        if kafka.running(node)
    }


def test_a_killed_leader_is_replaced_and_restarts(apache_kafka_cluster: ApacheKafka) -> None:
    kafka = apache_kafka_cluster
    assert kafka.node_ids == [1, 2, 3] and len(kafka.bootstrap_servers.split(",")) == 3
    topic = fresh("failover")
    kafka.create_topic(topic, partitions=3, replication_factor=3, min_insync_replicas=2)
    # create_topic returns once every node's own metadata has the topic and its leaders (CI
    # once asked a node that had not yet applied it: "unknown topic").
    leaders = kafka.leaders(topic)
    assert each_nodes_leaders(kafka, topic) == {1: leaders, 2: leaders, 3: leaders}
    assert node_leaders("127.0.0.1", kafka.node(1).port, fresh("absent"), timeout=5) is None
    with pk.SyncProducer(kafka.url, topic=topic, timeout=30) as producer:
        producer.produce(b"before", partition=0)

        leader = kafka.leader_of(topic, 0)
        kafka.kill(leader)
        assert not kafka.running(leader)
        new_leaders = kafka.wait_for_leaders(topic, avoiding=[leader])
        assert new_leaders[0] not in (leader, -1)
        alive = {node: new_leaders for node in kafka.node_ids if node != leader}
        assert each_nodes_leaders(kafka, topic) == alive
        producer.produce(b"during", partition=0)  # 2 replicas left: min ISR 2 is met

        kafka.restart(leader)
        assert kafka.running(leader)
        producer.produce(b"after", partition=0)
    values = [record["value"] for record in kafka.read(topic, expected=3)]
    assert values == [b"before", b"during", b"after"]


def test_move_leader(apache_kafka_cluster: ApacheKafka) -> None:
    kafka = apache_kafka_cluster
    topic = fresh("move")
    kafka.create_topic(topic, partitions=1, replication_factor=2)
    leader = kafka.leader_of(topic, 0)
    target = next(node for node in kafka.node_ids if node != leader)
    kafka.move_leader(topic, 0, target)
    assert kafka.leader_of(topic, 0) == target
    assert set(map(str, each_nodes_leaders(kafka, topic).values())) == {str({0: target})}
    # To a node holding no replica: it replaces one and leads.
    replicas = set(kafka._partition(topic, 0).replicas)
    outsider = next(node for node in kafka.node_ids if node not in replicas)
    kafka.move_leader(topic, 0, outsider)
    assert kafka.leader_of(topic, 0) == outsider
    assert len(kafka._partition(topic, 0).replicas) == 2


def test_the_plugin_restarts_a_stopped_node(apache_kafka_cluster: ApacheKafka) -> None:
    """stop_broker is graceful; the plugin's teardown hook (``reset``) starts it again."""
    kafka = apache_kafka_cluster
    kafka.stop_broker(3)
    assert not kafka.running(3)
    kafka.reset()
    assert kafka.running(3)


def test_a_node_that_cannot_start(tmp_path: Path) -> None:
    """A property Kafka refuses: BrokerUnavailable with the exception from the log's end, the
    stack frames left out."""
    kafka = ApacheKafka(workdir=tmp_path, properties={"log.flush.interval.messages": 0})
    with pytest.raises(BrokerUnavailable) as raised:
        kafka.start()
    message = str(raised.value)
    assert "node 1" in message and "log.flush.interval.messages" in message, message
    assert "\tat " not in message
    with pytest.raises(ConfigurationError, match="not started"):
        kafka.url  # noqa: B018


def test_a_port_taken_before_the_node_binds_it_is_chosen_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process binds the controller port chosen for the node before the JVM does
    (seen in whole-suite runs on three workers): the node exits "Address already in use", and
    the start makes the node again on other ports instead of failing."""
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    choices = iter([apache_kafka_module.free_port(), taken.getsockname()[1]])
    monkeypatch.setattr(
        apache_kafka_module, "free_port", lambda: next(choices, None) or free_port()
    )
    kafka = ApacheKafka()
    caplog.set_level("INFO", logger="producerkit.testing.apache_kafka")
    try:
        kafka.start()
        assert kafka.running(1)  # while the port stays taken
        assert "a port was taken before a node bound it" in caplog.text
    finally:
        kafka.stop()
        taken.close()


def test_missing_java_or_maven(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *args, **kwargs: None if name == "java" else real_which(name)
    )
    with pytest.raises(MissingDependencyError, match="apt-get install openjdk-17-jre-headless"):
        ApacheKafka().start()
    # Java present, no jars cached and no Maven to fetch them.
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)
    monkeypatch.setenv("PRODUCERKIT_CACHE", str(tmp_path))
    assert cache_dir("9.9.9") == tmp_path / "apache-kafka-9.9.9"
    with pytest.raises(MissingDependencyError, match="no mvn"):
        apache_kafka_module.resolve_jars("9.9.9")


def test_importing_producerkit_does_not_import_it() -> None:
    import subprocess
    import sys

    code = "import sys, producerkit; print('producerkit.testing.apache_kafka' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr
