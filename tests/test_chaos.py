"""``benches/chaos`` (``python benches/chaos ...``) in the default suite.

- One minute on Kafka (Tansu) at its defaults behind the fault proxy, seed 7, whose plan draws
  every proxy fault in the minute (reset, blackhole, refuse, stall, slow). Kafka with defaults
  is the run that holds every check at once (per-key order included) and exercises the most
  intricate failure path (records dropped from sealed and retried batches); JetStream's kill -9
  and restart are covered by tests/test_reliability.py. The rate is capped at 10,000 msg/s
  (``--max-messages``; twice the rate of the runs issue 28 reports): the window still fills
  within a fault's first tenth of a second, and the read-back stays short. About 75 s.
- 45 s on the 3-broker mock cluster (``--backend kafka-cluster``) at its defaults, idempotent,
  seed 23, whose plan draws the cluster's three faults: a leader's broker down and its
  partitions moved, bursts of retriable Produce errors with two OUT_OF_ORDER_SEQUENCE_NUMBER
  among them (on which the producer retries, or takes a new epoch: the mock grants a new
  producer id), every leader moved. About 50 s.
- 54 s on three Apache Kafka nodes (``--backend kafka-apache``, a topic of 3 partitions
  replicated 3 with ``min.insync.replicas`` 2) at the producer's defaults, idempotent, seed 143,
  whose plan draws kill -9 of a node leading partitions and its restart at 5 s, then the
  proxy's reset of every connection and every leader moved (a reassignment and a preferred
  election a partition), each once the one before ended: on a loaded machine (a restart or a
  move taking tens of seconds) the last may not fit in the load. Read back ``read_committed``
  by a confluent-kafka consumer: Kafka itself judged the producer's sequences. About 75 s
  (skipped without Java).
- 24 s on three nats-servers (``--backend jetstream-cluster``, an R3 file stream the producer
  creates, every server reached through the fault proxy) at the producer's defaults (fast
  ingest on; a msg_id on alternate runs of 1,000 messages), 2,000 msg/s, seed 317, whose plan
  steps the stream's leader down at 5 s and kills the leader's server at 11 s (restarted 3 s
  later): nothing acked lost, no msg_id stored twice, an ack again after the election. About
  40 s.
- The harness's model of what Kafka would have stored where the mock stored everything
  (``KafkaReplay``), and the cluster's record of idempotent Produce batches it reads.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from chaos.judges.kafka_idempotence import KafkaReplay, kafka_view
from chaos.judges.kafka_recorder import RecordingKafkaCluster
from chaos.judges.kafka_wire import ServedBatch, record_batches
from chaos.judges.stored import Stored
from chaos.readback import fetch_request, fetch_response
from chaos.workload import ACKED, Ledger
from conftest import ON_THE_PUBLIC_PATH

import producerkit as pk
from producerkit.errors import ConfigurationError
from producerkit.testing.kafka_cluster import KafkaCluster

pytestmark = pytest.mark.brokers

#: The bench, a package run as ``python benches/chaos`` (its modules are imported above:
#: tests/conftest.py puts ``benches/`` on ``sys.path``).
CHAOS = Path(__file__).resolve().parent.parent / "benches" / "chaos"
MUST_BE_ZERO = (
    "without_outcome",
    "double_outcomes",
    "acked_missing",
    "acked_wrong_offset",
    "failed_unstored_found",
    "stored_unknown",
    "stats_mismatch",
    "order_violations",
)


def _run_chaos(tmp_path: Path, *args: str, timeout: float = 240) -> tuple[dict[str, Any], str]:
    report_path = tmp_path / "chaos.json"
    done = subprocess.run(
        [sys.executable, str(CHAOS), *args, "--json", str(report_path)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert report_path.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout[-4000:]
    assert done.returncode == 0, summary
    report: dict[str, Any] = json.loads(report_path.read_text())
    return report, summary


def _assert_held(
    report: dict[str, Any], summary: str, must_be_zero: tuple[str, ...], faults: int = 3
) -> None:
    result = report["result"]
    checks = {name: check["value"] for name, check in result["checks"].items()}
    assert {name: checks[name] for name in must_be_zero} == dict.fromkeys(must_be_zero, 0), summary
    assert result["blocked_past_timeout_s"]["value"] <= 1.0, summary
    # The run was one: load, faults, failures and their recovery.
    counts = result["counts"]
    assert counts["produced"] == counts["acked"] + counts["failed"] > 0
    assert len(report["faults"]) >= faults, report["faults"]
    assert result["recovery_s"]["unrecovered"] == 0, report["faults"]


def test_chaos_on_kafka_defaults_loses_nothing(tmp_path: Path) -> None:
    report, summary = _run_chaos(
        tmp_path,
        *["--minutes", "0.7", "--seed", "7", "--backend", "kafka", "--max-messages", "600000"],
        *["--capacity-seconds", "2"],
    )
    _assert_held(report, summary, MUST_BE_ZERO)


def test_chaos_on_the_cluster_loses_nothing_and_stores_nothing_twice(tmp_path: Path) -> None:
    report, summary = _run_chaos(
        tmp_path,
        *["--minutes", "0.75", "--seed", "23", "--backend", "kafka-cluster"],
        *["--modes", "errors,broker_down,leaders", "--capacity-seconds", "1"],
    )
    _assert_held(report, summary, (*MUST_BE_ZERO, "duplicates_stored"))
    assert report["config"]["idempotent"] is True, summary
    assert [w["mode"] for w in report["faults"]] == ["broker_down", "errors", "leaders"]
    cluster = report["cluster"]
    answers = cluster["produce_answers"]
    assert cluster["errors_pushed"]["OUT_OF_ORDER_SEQUENCE_NUMBER"] == 2, cluster
    assert answers["OUT_OF_ORDER_SEQUENCE_NUMBER"] >= 1, answers
    assert answers["NOT_LEADER_OR_FOLLOWER"] >= 10, answers
    assert cluster["unbatched_records"] == 0, summary


def test_chaos_on_apache_kafka_loses_nothing_and_stores_nothing_twice(tmp_path: Path) -> None:
    if shutil.which("java") is None:
        pytest.skip("Apache Kafka needs Java 17+")
    pytest.importorskip("confluent_kafka")
    report, summary = _run_chaos(
        tmp_path,
        *["--minutes", "0.6", "--seed", "143", "--backend", "kafka-apache"],
        *["--modes", "kill,leaders,reset", "--partitions", "3", "--capacity-seconds", "1"],
    )
    _assert_held(report, summary, (*MUST_BE_ZERO, "duplicates_stored"), faults=1)
    assert report["config"]["idempotent"] is True, summary
    modes = [w["mode"] for w in report["faults"]]
    # The seed's bag: each mode once before any repeats (how many fit depends on the machine).
    assert modes[:3] == ["kill", "reset", "leaders"][: len(modes)], summary
    cluster = report["cluster"]
    assert cluster["faults_done"]["kill"] == 1, cluster
    assert (cluster["replication"], cluster["min_insync_replicas"]) == (3, 2), cluster
    counts = report["result"]["counts"]
    # Read back as Kafka stored it: every offset the brokers assigned holds one of the run's.
    assert counts["stored_records"] == counts["stored_records_broker_count"], summary
    assert counts["stored_distinct"] == counts["stored_records"], summary


def test_chaos_on_the_jetstream_cluster_loses_nothing_and_stores_no_id_twice(
    tmp_path: Path,
) -> None:
    report, summary = _run_chaos(
        tmp_path,
        *["--minutes", "0.4", "--seed", "317", "--backend", "jetstream-cluster"],
        *["--modes", "kill,step_down", "--rate", "2000"],
    )
    # JetStream keeps no per-key order through an election (a message published again may be
    # stored after later ones): reported, not judged.
    must_be_zero = tuple(name for name in MUST_BE_ZERO if name != "order_violations")
    _assert_held(report, summary, (*must_be_zero, "duplicates_stored"), faults=1)
    modes = [w["mode"] for w in report["faults"]]
    # The seed's plan (the second may not fit on a loaded machine, after a slow election).
    assert modes == ["step_down", "kill"][: len(modes)], summary
    counts = report["result"]["counts"]
    assert counts["stored_records"] == counts["stored_records_broker_count"], summary
    assert counts["stored_distinct"] == counts["stored_records"], summary
    assert 0 < counts["with_msg_id"] < counts["produced"], summary
    cluster = report["cluster"]
    assert cluster["replication"] == 3, cluster
    # Fast batches are written on producerkit's own path only (the public path: one PubAck each).
    assert (cluster["fast_ingest_acked"] > 0) is not ON_THE_PUBLIC_PATH, cluster
    if "kill" in modes:  # the leader's server, by the seed's role
        assert cluster["faults_done"]["kill_leader"] == 1, cluster
        death = report["result"]["leader_death_to_next_ack_s"]
        assert death["without_an_ack_after"] == 0 and death["max"] is not None, summary


# ---------------------------------------------------------------------- what Kafka would store


def _replay(*batches: tuple[int, int, int, int]) -> tuple[list[str], Any]:
    """The verdicts on ``batches`` ((producer id, epoch, base sequence, count), stored in this
    order), and the replay, closed."""
    replay = KafkaReplay()
    offset, verdicts = 0, []
    for producer_id, epoch, sequence, count in batches:
        verdicts.append(replay.add(ServedBatch(0, offset, producer_id, epoch, sequence, count)))
        offset += count
    replay.close()
    return verdicts, replay


def test_the_replay_keeps_batches_in_sequence() -> None:
    verdicts, replay = _replay((7, 0, 0, 2), (7, 0, 2, 3), (-1, -1, -1, 1), (7, 0, 5, 1))
    assert verdicts == ["stored"] * 4
    assert replay.records == {"stored": 7}


def test_a_batch_stored_again_is_deduplicated() -> None:
    verdicts, replay = _replay((7, 0, 0, 2), (7, 0, 2, 2), (7, 0, 0, 2), (7, 0, 4, 1))
    assert verdicts == ["stored", "stored", "deduplicated", "stored"]
    assert replay.records == {"stored": 5, "deduplicated": 2}


def test_a_batch_past_a_gap_is_held_until_the_batch_that_fills_it() -> None:
    # 0-1 stored, 2-3 failed, 4-5 stored by the mock (Kafka: OUT_OF_ORDER), 2-3 retried.
    verdicts, replay = _replay((7, 0, 0, 2), (7, 0, 4, 2), (7, 0, 4, 2), (7, 0, 2, 2), (7, 0, 6, 1))
    assert verdicts == ["stored", "held", "deduplicated", "stored", "stored"]
    assert replay.records == {"stored": 5, "stored_late": 2, "deduplicated": 2}
    assert replay.gaps == 0


def test_a_gap_never_closed_is_one_kafka_answers_and_the_producer_bumps() -> None:
    # 2-3 given up on; a new epoch (the mock: a new producer id) sends from 0 again.
    verdicts, replay = _replay(
        (7, 0, 0, 2), (7, 0, 4, 2), (7, 0, 6, 1), (7, 1, 0, 3), (7, 0, 7, 1), (8, 0, 0, 1)
    )
    assert verdicts == ["stored", "held", "held", "stored", "refused_old_epoch", "stored"]
    assert replay.records == {"stored": 6, "stored_after_bump": 3, "refused_old_epoch": 1}
    assert replay.gaps == 1


def test_an_old_sequence_is_refused() -> None:
    batches = [(7, 0, 2 * n, 2) for n in range(7)] + [(7, 0, 0, 2)]  # 6 batches after it
    verdicts, replay = _replay(*batches)
    assert verdicts == ["stored"] * 7 + ["refused_old_sequence"]
    assert replay.records == {"stored": 14, "refused_old_sequence": 2}


def _stored_both_ways(
    ledger: Any, records: list[tuple[int, int, int, int, int]]
) -> tuple[Any, Any]:
    """``records`` ((partition, offset, id, key, seq)) read back record by record (Stored.visit)
    and all at once as the live read-back hands them over (Stored.from_positions)."""
    import numpy as np

    one_by_one = Stored(ledger)
    positions: dict[int, Any] = {}
    key, sequence = np.zeros(ledger.sent, np.uint16), np.zeros(ledger.sent, np.uint32)
    for partition, offset, i, k, seq in records:
        one_by_one.visit(partition, offset, b"%d %d %d x" % (i, k, seq))
        column = positions.setdefault(partition, np.zeros(0, np.uint32))
        if offset >= len(column):
            column = positions[partition] = np.concatenate(
                (column, np.zeros(offset + 1 - len(column), np.uint32))
            )
        column[offset] = i + 1
        key[i], sequence[i] = k, seq
    read = {"key": key, "sequence": sequence, "records": len(records), "warm_ups": 0}
    return one_by_one, Stored.from_positions(ledger, {**read, "unknown": 0}, positions)


def test_the_live_read_back_counts_as_a_read_record_by_record_does() -> None:
    ledger = Ledger(5, 0.0)
    ledger.sent = 5
    for i, (partition, offset) in enumerate([(0, 0), (0, 1), (1, 0), (0, 9), (1, 1)]):
        ledger.status[i] = ACKED
        ledger.partition[i], ledger.offset[i] = partition, offset + 1
    records = [
        (0, 0, 0, 1, 0),
        (0, 1, 1, 1, 1),
        (0, 2, 0, 1, 0),  # a second copy of message 0
        (1, 0, 4, 2, 1),  # message 4 where message 2 should be: 2 and 4 out of order
        (1, 1, 2, 2, 0),
        (1, 2, 3, 3, 0),  # message 3 acked at partition 0, offset 9
    ]
    one_by_one, at_once = _stored_both_ways(ledger, records)
    for stored in (one_by_one, at_once):
        assert bytes(stored.copies) == bytes([2, 1, 1, 1, 1])
        assert bytes(stored.at_offset) == bytes([1, 1, 0, 0, 0])
        assert (stored.duplicates, stored.unknown, stored.records) == (1, 0, 6)
        assert stored.order_violations == 1
        assert stored.order_examples == [(2, 1, 4, 0)]


def test_order_in_kafkas_view_excuses_only_what_the_mock_stored_early() -> None:
    """Key 0's messages 0 (seq 0), 1 (seq 1), 2 (seq 2): the mock stored 2 past a gap (held)
    before 1, which Kafka would not have; and, in partition 1, the same without a gap, which
    the producer did."""
    ledger = Ledger(6, 0.0)
    ledger.sent = 6
    records = [
        (partition, offset, i, 0, i % 3)
        for partition, order in ((0, (0, 2, 1)), (1, (3, 5, 4)))
        for offset, i in enumerate(order)
    ]
    one_by_one, stored = _stored_both_ways(ledger, records)
    served = [
        ServedBatch(0, 0, 7, 0, 0, 1),
        ServedBatch(0, 1, 7, 0, 2, 1),  # past the gap at sequence 1
        ServedBatch(0, 2, 7, 0, 1, 1),  # fills it
        *(ServedBatch(1, offset, 7, 0, offset, 1) for offset in range(3)),
    ]
    view = kafka_view(stored, served)
    assert one_by_one.order_violations == stored.order_violations == 2  # the mock's log
    assert view["order_violations"] == 1
    assert view["order_examples"] == [4]
    assert view["records_by_verdict"] == {"stored": 5, "stored_late": 1}
    assert view["duplicates"] == 0


def test_held_batches_are_judged_in_sequence_order() -> None:
    """Past a gap that never closes (sequence 1 never stored) the mock stored two batches Kafka
    would hold; in the mock's order they look fine, but the producer numbered message 1 after
    message 2: Kafka would store them in sequence order, 2 before 1."""
    ledger = Ledger(3, 0.0)
    ledger.sent = 3
    _, stored = _stored_both_ways(ledger, [(0, 0, 0, 0, 0), (0, 1, 1, 0, 1), (0, 2, 2, 0, 2)])
    served = [
        ServedBatch(0, 0, 7, 0, 0, 1),
        ServedBatch(0, 1, 7, 0, 3, 1),  # message 1, numbered 3
        ServedBatch(0, 2, 7, 0, 2, 1),  # message 2, numbered 2
    ]
    view = kafka_view(stored, served)
    assert stored.order_violations == 0  # the mock's log
    assert view["records_by_verdict"] == {"stored": 1, "stored_after_bump": 2}
    assert (view["order_violations"], view["order_violations_in_sequence"]) == (1, 1)
    assert view["order_examples"] == [1]


def test_record_batches_decodes_what_the_mock_serves() -> None:
    """Fetches of the mock's own ports through the harness's wire code: every record where its
    Delivery said, in batches stamped as the recorder saw producerkit's idempotent producer
    send them."""

    async def produce(url: str, topic: str) -> dict[int, tuple[int, int | None]]:
        delivered = {}
        async with pk.Producer(url, topic=topic) as producer:
            for n in range(30):
                delivery = await producer.produce(b"%d" % n, key=b"k%d" % (n % 5))
                delivered[n] = (delivery.partition, delivery.offset)
            for n in range(30, 60):  # some batches of more than one record
                await producer.produce(b"%d" % n, key=b"k%d" % (n % 5), nonblocking=True)
        return delivered

    with RecordingKafkaCluster(3, record_batches=True) as cluster:
        topic = f"r-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(topic, partitions=3, replication=3)
        delivered = anyio.run(produce, cluster.url, topic)
        assert cluster.batches.settle(5.0)
        sent = {
            (b.partition, b.base_offset): (b.producer_id, b.epoch, b.base_sequence, b.record_count)
            for b in cluster.batches.produced(topic)
            if b.error_code == 0
        }
        found: dict[int, tuple[int, int]] = {}
        served = 0
        for partition in range(3):
            address = cluster.mock_addresses[partition % 3]  # its leader's (create_topic)
            position, high = 0, 1
            while position < high:  # the mock serves one batch a partition per Fetch
                frame = _fetch(address, topic, partition, position)
                [(p, error, high, _, records)] = fetch_response(frame)
                assert (p, error) == (partition, 0)
                for batch, values in record_batches(p, records):
                    assert sent[(p, batch.base_offset)] == batch[2:], batch
                    found.update({int(value): (p, offset) for offset, value in values})
                    position = batch.base_offset + batch.record_count
                    served += 1
    assert served == len(sent)
    assert sorted(found) == list(range(60))
    assert {n: found[n] for n in range(30)} == delivered


def _fetch(address: str, topic: str, partition: int, offset: int) -> bytes:
    """One Fetch v5 answer, its size prefix off."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(fetch_request(1, topic, [(partition, offset)], 100))
        data = b""
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            chunk = sock.recv(65536)
            assert chunk, "the broker closed the connection"
            data += chunk
    return data[4:]


def test_the_batch_log_records_idempotent_batches_and_their_answers() -> None:
    async def produce(url: str, topic: str, cluster: KafkaCluster) -> None:
        async with pk.Producer(url, topic=topic) as producer:
            await producer.produce(b"first", key=b"k")
            cluster.fail_requests("Produce", ["NOT_LEADER_OR_FOLLOWER", "NOT_ENOUGH_REPLICAS"])
            for n in range(20):
                await producer.produce(b"%d" % n, key=b"k", nonblocking=True)
            await producer.flush()

    with RecordingKafkaCluster(3, record_batches=True) as cluster:
        topic = f"b-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(topic, partitions=1, replication=3)
        anyio.run(produce, cluster.url, topic, cluster)
        assert cluster.batches.settle(5.0)
        produced = list(cluster.batches.produced(topic))
        assert list(cluster.batches.produced("another")) == []
        assert cluster.batches.unreadable == []
        assert cluster.transactions.produces() == []  # not a transaction's
        assert {b.producer_id for b in produced} == {produced[0].producer_id} != {-1}
        failed = [b for b in produced if b.error_code]
        assert sorted(b.error_code for b in failed) == [6, 19], produced  # the two injected
        stored = [b for b in produced if b.error_code == 0]
        stamps = [(b.epoch, b.base_sequence, b.record_count) for b in stored]
        for batch in failed:  # each retried with the same stamp, and stored
            assert (batch.epoch, batch.base_sequence, batch.record_count) in stamps
            assert batch.base_offset == -1
        # Every record stored once: the stored batches' offsets cover 0..20 once.
        offsets = sorted(
            offset
            for b in stored
            for offset in range(b.base_offset or 0, (b.base_offset or 0) + b.record_count)
        )
        assert offsets == list(range(21))
        assert all(b.answered for b in produced)
        assert len(cluster.read(topic)) == 21


def test_the_batch_log_is_opt_in(kafka_cluster: RecordingKafkaCluster) -> None:
    with pytest.raises(ConfigurationError, match="record_batches=True"):
        _ = kafka_cluster.batches
