"""The transaction-aware view of the test cluster (benches/chaos/judges: the suite's
``kafka_cluster`` is a ``RecordingKafkaCluster``): ``read(topic,
isolation_level="read_committed")`` and ``transactions``.

The mock serves every record to every consumer, so the view is worked out from the recorded
traffic. Tested three ways: hand-made frames fed through the recorder's tap (every rule of
the view, on the fixed-width and the flexible versions of the three APIs, and transactions
v2's: Produce v12, EndTxn v5), confluent-kafka's
transactional producer (commit, abort, open, re-initialized, interleaved with plain records)
and producerkit's ``atomic_batch()`` on the session cluster.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from chaos.judges.kafka_recorder import _Tap
from chaos.judges.kafka_transactions import (
    TransactionLog,
    TransactionView,
    TransactionViewError,
)
from conftest import TRANSACTIONS_ON_THE_FAST_PATH

import producerkit as pk
from producerkit.testing.kafka_cluster import KafkaCluster

PARTITIONS = 6

# ---------------------------------------------------------------------- hand-made frames


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _string(text: str | None, compact: bool) -> bytes:
    if text is None:
        return b"\x00" if compact else struct.pack(">h", -1)
    raw = text.encode()
    return (_uvarint(len(raw) + 1) if compact else struct.pack(">h", len(raw))) + raw


def _count(n: int, compact: bool) -> bytes:
    return _uvarint(n + 1) if compact else struct.pack(">i", n)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _request(api: int, version: int, correlation: int, body: bytes, compact: bool) -> bytes:
    # Request header v1 (v2 when flexible: the client id stays a plain string, tags follow).
    header = struct.pack(">hhi", api, version, correlation) + _string("test-client", False)
    return _frame(header + (b"\x00" if compact else b"") + body)


def _response(correlation: int, body: bytes, compact: bool) -> bytes:
    return _frame(struct.pack(">i", correlation) + (b"\x00" if compact else b"") + body)


def _batch(producer_id: int, epoch: int, sequence: int, count: int, transactional: bool) -> bytes:
    """A v2 record batch's 61-byte header, then ``count`` bytes standing for the records."""
    attributes = 0x10 if transactional else 0
    header = struct.pack(
        ">qiibihiqqqhii",
        0,  # base offset
        49 + count,  # batch length
        -1,  # partition leader epoch
        2,  # magic
        0,  # crc (nobody checks it here)
        attributes,
        count - 1,  # last offset delta
        0,
        0,  # first and max timestamps
        producer_id,
        epoch,
        sequence,
        count,
    )
    assert len(header) == 61
    return header + bytes(count)


class Versions:
    """The API versions a client speaks: fixed-width (producerkit's through aiokafka),
    flexible (KIP-482: compact strings and arrays, tagged fields), or transactions v2's
    (KIP-890: Produce v12, EndTxn v5, whose answer carries the bumped epoch)."""

    def __init__(self, produce: int, end_txn: int, init: int) -> None:
        self.produce, self.end_txn, self.init = produce, end_txn, init

    def __repr__(self) -> str:
        return f"Produce v{self.produce}, EndTxn v{self.end_txn}, InitProducerId v{self.init}"


class Traffic:
    """A client's transactional requests and the broker's answers, as frames through the
    recorder's tap, in chunks of ``chunk`` bytes (a frame split anywhere)."""

    def __init__(self, versions: Versions, chunk: int = 7) -> None:
        self.log = TransactionLog()
        self.tap = _Tap(self.log)
        self.versions = versions
        self.chunk = chunk
        self.correlation = 0

    def _send(self, frames: list[bytes], feed: Callable[[bytes], None]) -> None:
        data = b"".join(frames)
        for start in range(0, len(data), self.chunk):
            feed(data[start : start + self.chunk])

    def _next(self) -> int:
        self.correlation += 1
        return self.correlation

    def init(self, txn: str, producer_id: int, epoch: int, error: int = 0) -> None:
        version = self.versions.init
        compact = version >= 2
        body = _string(txn, compact) + struct.pack(">i", 60000)
        if version >= 3:
            body += struct.pack(">qh", -1, -1)
        if compact:
            body += b"\x00"
        correlation = self._next()
        self._send([_request(22, version, correlation, body, compact)], self.tap.requests.feed)
        answer = struct.pack(">ihqh", 0, error, producer_id if not error else -1, epoch)
        self._send(
            [_response(correlation, answer + (b"\x00" if compact else b""), compact)],
            self.tap.responses.feed,
        )

    def produce(
        self,
        txn: str | None,
        producer_id: int,
        epoch: int,
        topic: str,
        batches: list[tuple[int, int, int]],  # (partition, base sequence, record count)
        answers: list[tuple[int, int]] | None,  # (error, base offset) per batch; None: lost
        transactional: bool = True,
    ) -> None:
        version = self.versions.produce
        compact = version >= 9
        body = _string(txn, compact) + struct.pack(">hi", -1, 30000) + _count(1, compact)
        body += _string(topic, compact) + _count(len(batches), compact)
        for partition, sequence, count in batches:
            records = _batch(producer_id, epoch, sequence, count, transactional)
            size = _uvarint(len(records) + 1) if compact else struct.pack(">i", len(records))
            body += struct.pack(">i", partition) + size + records
            body += b"\x00" if compact else b""
        body += b"\x00\x00" if compact else b""  # topic tags, request tags
        correlation = self._next()
        self._send([_request(0, version, correlation, body, compact)], self.tap.requests.feed)
        if answers is None:
            return
        answer = _count(1, compact) + _string(topic, compact) + _count(len(answers), compact)
        for (partition, _, _), (error, base_offset) in zip(batches, answers, strict=True):
            answer += struct.pack(">ihqqq", partition, error, base_offset, -1, 0)
            if version >= 8:
                answer += _count(0, compact) + _string(None, compact)
            answer += b"\x00" if compact else b""
        answer += (b"\x00" if compact else b"") + struct.pack(">i", 0)
        answer += b"\x00" if compact else b""
        self._send([_response(correlation, answer, compact)], self.tap.responses.feed)

    def end(self, txn: str, producer_id: int, epoch: int, commit: bool, error: int = 0) -> None:
        """EndTxn; from v5 (transactions v2) its answer carries the epoch bumped."""
        version = self.versions.end_txn
        compact = version >= 3
        body = _string(txn, compact) + struct.pack(">qhb", producer_id, epoch, commit)
        body += b"\x00" if compact else b""
        correlation = self._next()
        answer = struct.pack(">ih", 0, error)
        if version >= 5:
            answer += struct.pack(">qh", producer_id, epoch + 1) if not error else b"\xff" * 10
        answer += b"\x00" if compact else b""
        self._send([_request(26, version, correlation, body, compact)], self.tap.requests.feed)
        self._send([_response(correlation, answer, compact)], self.tap.responses.feed)

    def view(self, topic: str = "t") -> TransactionView:
        return self.log.view(topic)


def _served(view: TransactionView, partition: int, end: int) -> list[int]:
    return [offset for offset in range(end) if view.serves(partition, offset)]


@pytest.fixture(
    params=[
        Versions(produce=8, end_txn=1, init=1),
        Versions(produce=10, end_txn=3, init=4),
        Versions(produce=12, end_txn=5, init=5),
    ],
    ids=["fixed", "flexible", "transactions-v2"],
)
def traffic(request: pytest.FixtureRequest) -> Traffic:
    return Traffic(request.param)


def test_the_tap_records_each_batch_and_end_with_its_answer(traffic: Traffic) -> None:
    traffic.init("a", 1000, 0)
    traffic.produce("a", 1000, 0, "t", [(0, 0, 3), (1, 0, 2)], [(0, 10), (0, 20)])
    traffic.produce(None, 7, 0, "t", [(0, 0, 5)], [(0, 13)])  # not transactional: not recorded
    traffic.end("a", 1000, 0, commit=True)
    traffic.end("a", 1000, 0, commit=False, error=47)
    produced = traffic.log.produces("t")
    assert [(p.partition, p.base_offset, p.record_count, p.error_code) for p in produced] == [
        (0, 10, 3, 0),
        (1, 20, 2, 0),
    ]
    assert {(p.transactional_id, p.producer_id, p.epoch, p.base_sequence) for p in produced} == {
        ("a", 1000, 0, 0)
    }
    assert all(p.transactional and p.answered for p in produced)
    ends = traffic.log.ends("a")
    assert [(e.committed, e.error_code) for e in ends] == [(True, 0), (False, 47)]
    [init] = traffic.log.inits()
    assert (init.transactional_id, init.producer_id, init.epoch, init.error_code) == (
        "a",
        1000,
        0,
        0,
    )
    assert init.transaction_timeout_ms == 60000
    assert traffic.log.settle(0)


def test_committed_served_aborted_not(traffic: Traffic) -> None:
    traffic.init("a", 1000, 0)
    traffic.produce("a", 1000, 0, "t", [(0, 0, 3)], [(0, 0)])  # offsets 0-2
    traffic.end("a", 1000, 0, commit=True)  # marker at 3
    traffic.produce("a", 1000, 0, "t", [(0, 3, 2)], [(0, 4)])  # 4-5
    traffic.end("a", 1000, 0, commit=False)  # marker at 6
    view = traffic.view()
    assert _served(view, 0, 10) == [0, 1, 2, 3, 6, 7, 8, 9]
    assert [state for _, state in view.batches] == ["committed", "aborted"]
    assert view.last_stable_offsets == {}


def test_an_open_transaction_holds_back_what_follows_it_in_its_partition(
    traffic: Traffic,
) -> None:
    """Kafka's last stable offset: nothing from the open transaction's first offset on, in
    that partition, not even committed or plain records; other partitions are not held."""
    traffic.init("a", 1000, 0)
    traffic.init("b", 2000, 0)
    traffic.produce("a", 1000, 0, "t", [(0, 0, 2)], [(0, 0)])  # a open at 0-1
    traffic.produce("b", 2000, 0, "t", [(0, 0, 2), (1, 0, 2)], [(0, 2), (0, 0)])
    traffic.end("b", 2000, 0, commit=True)  # markers at p0 4, p1 2
    view = traffic.view()
    assert view.last_stable_offsets == {0: 0}
    assert _served(view, 0, 8) == []
    assert _served(view, 1, 4) == [0, 1, 2, 3]
    traffic.end("a", 1000, 0, commit=True)
    assert _served(traffic.view(), 0, 6) == [0, 1, 2, 3, 4, 5]


def test_an_end_txn_refused_ends_nothing(traffic: Traffic) -> None:
    traffic.init("a", 1000, 0)
    traffic.produce("a", 1000, 0, "t", [(0, 0, 4)], [(0, 0)])
    traffic.end("a", 1000, 0, commit=True, error=51)  # CONCURRENT_TRANSACTIONS
    assert [state for _, state in traffic.view().batches] == ["open"]
    traffic.end("a", 1000, 0, commit=True, error=47)  # INVALID_PRODUCER_EPOCH
    assert traffic.view().last_stable_offsets == {0: 0}
    traffic.end("a", 1000, 0, commit=True)
    assert _served(traffic.view(), 0, 4) == [0, 1, 2, 3]


def test_an_init_aborts_what_was_open_and_fences_the_old_producer(traffic: Traffic) -> None:
    """The mock grants a re-initialized transactional id a new producer id and lets the old
    one write and commit; Kafka aborts the open transaction and refuses the old producer."""
    traffic.init("a", 1000, 0)
    traffic.produce("a", 1000, 0, "t", [(0, 0, 2)], [(0, 0)])  # open, 0-1
    traffic.init("a", 1001, 0)  # the mock: another producer id, epoch 0
    traffic.produce("a", 1000, 0, "t", [(0, 2, 2)], [(0, 2)])  # the old one, 2-3: fenced
    traffic.end("a", 1000, 0, commit=True)  # the mock commits it; Kafka: PRODUCER_FENCED
    traffic.produce("a", 1001, 0, "t", [(0, 0, 2)], [(0, 5)])  # the new one, 5-6
    traffic.end("a", 1001, 0, commit=True)  # marker at 7
    view = traffic.view()
    assert [state for _, state in view.batches] == ["aborted", "fenced", "committed"]
    assert _served(view, 0, 8) == [4, 5, 6, 7]


def test_an_epoch_bump_aborts_the_open_transaction(traffic: Traffic) -> None:
    """KIP-360: the same producer id initialized again with a bumped epoch."""
    traffic.init("a", 1000, 0)
    traffic.produce("a", 1000, 0, "t", [(0, 0, 2)], [(0, 0)])
    traffic.init("a", 1000, 1)
    traffic.produce("a", 1000, 1, "t", [(0, 0, 2)], [(0, 2)])
    traffic.end("a", 1000, 1, commit=True)
    assert [state for _, state in traffic.view().batches] == ["aborted", "committed"]
    assert _served(traffic.view(), 0, 4) == [2, 3]


def test_a_higher_epoch_of_the_producer_id_follows_a_bump_the_view_did_not_read(
    traffic: Traffic,
) -> None:
    """Transactions v2: EndTxn v5 answers with the next transaction's epoch, which the recorder
    does not read; the producer's next batch under it is its own, not fenced, and what the
    producer id had open under an older epoch is aborted (Kafka bumps only at an end)."""
    traffic.init("a", 1000, 0)
    traffic.produce("a", 1000, 0, "t", [(0, 0, 2)], [(0, 0)])  # 0-1
    traffic.end("a", 1000, 0, commit=True)  # marker at 2; v5: the epoch is 1 from here
    traffic.produce("a", 1000, 1, "t", [(0, 0, 2)], [(0, 3)])  # 3-4
    traffic.end("a", 1000, 1, commit=False)  # marker at 5; the epoch is 2
    traffic.produce("a", 1000, 2, "t", [(0, 0, 2)], [(0, 6)])  # 6-7, open...
    traffic.produce("a", 1000, 4, "t", [(1, 0, 2)], [(0, 0)])  # ...aborted by a bump (p1 0-1)
    traffic.end("a", 1000, 4, commit=True)
    traffic.produce("a", 1000, 3, "t", [(0, 2, 1)], [(0, 8)])  # an older epoch: fenced
    view = traffic.view()
    assert [state for _, state in view.batches] == [
        "committed",
        "aborted",
        "aborted",
        "committed",
        "fenced",
    ]
    assert _served(view, 0, 9) == [0, 1, 2, 5]
    assert _served(view, 1, 2) == [0, 1]
    assert view.last_stable_offsets == {}


def test_failed_and_duplicate_batches_were_not_stored(traffic: Traffic) -> None:
    traffic.init("a", 1000, 0)
    traffic.produce("a", 1000, 0, "t", [(0, 0, 3)], [(6, -1)])  # NOT_LEADER: not stored
    traffic.produce("a", 1000, 0, "t", [(0, 0, 3)], [(0, 0)])  # the retry: stored
    traffic.produce("a", 1000, 0, "t", [(0, 0, 3)], [(0, -1)])  # again: a duplicate
    traffic.end("a", 1000, 0, commit=False)
    view = traffic.view()
    assert [state for _, state in view.batches] == ["not_stored", "aborted", "not_stored"]
    assert _served(view, 0, 5) == [3, 4]


def test_a_lost_answer(traffic: Traffic) -> None:
    """A batch whose answer never passed the recorder: not stored if its retry was; if its
    retry was a duplicate it is stored where nobody said, which matters only when its
    transaction did not commit (then the view refuses to guess)."""
    traffic.init("a", 1000, 0)
    traffic.produce("a", 1000, 0, "t", [(0, 0, 2)], None)
    traffic.produce("a", 1000, 0, "t", [(0, 0, 2)], [(0, 0)])
    traffic.end("a", 1000, 0, commit=False)
    assert [state for _, state in traffic.view().batches] == ["not_stored", "aborted"]

    traffic.produce("a", 1000, 0, "t", [(1, 0, 2)], None)
    traffic.tap.close()  # the connection closed without the answer
    assert traffic.log.settle(0)
    traffic.tap = _Tap(traffic.log)
    traffic.produce("a", 1000, 0, "t", [(1, 0, 2)], [(0, -1)])  # acked as a duplicate
    with pytest.raises(TransactionViewError, match="1 transactional batches of 't'"):
        traffic.view()
    traffic.end("a", 1000, 0, commit=True)
    assert [state for _, state in traffic.view().batches][-2:] == ["committed", "not_stored"]


def test_settle_waits_for_answers_on_their_way(traffic: Traffic) -> None:
    traffic.produce("a", 1000, 0, "t", [(0, 0, 2)], None)
    assert not traffic.log.settle(0.05)
    traffic.tap.close()
    assert traffic.log.settle(0)


def test_an_unreadable_frame_makes_the_view_refuse() -> None:
    log = TransactionLog()
    tap = _Tap(log)
    header = struct.pack(">hhi", 26, 1, 1) + _string("c", False)
    tap.requests.feed(_frame(header + b"\x00\x05ab"))  # EndTxn cut short
    with pytest.raises(TransactionViewError, match="could not read 1 frames"):
        log.view("t")


def test_other_topics_and_plain_batches_do_not_count(traffic: Traffic) -> None:
    traffic.init("a", 1000, 0)
    traffic.produce("a", 1000, 0, "other", [(0, 0, 2)], [(0, 0)])  # open, in another topic
    traffic.produce("a", 1000, 0, "t", [(0, 0, 2)], [(0, 0)], transactional=False)
    assert _served(traffic.view("t"), 0, 2) == [0, 1]
    assert traffic.view("other").last_stable_offsets == {0: 0}


# ---------------------------------------------------------------------- on the cluster


@pytest.fixture
def cluster_topic(kafka_cluster: KafkaCluster) -> str:
    name = f"v-{uuid.uuid4().hex[:12]}"
    kafka_cluster.create_topic(name, partitions=PARTITIONS, replication=3)
    return name


def _confluent(cluster: KafkaCluster, **config: Any) -> Any:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    return confluent_kafka.Producer(
        {"bootstrap.servers": cluster.bootstrap, "linger.ms": 2, "log_level": 3, **config}
    )


def _send(producer: Any, topic: str, prefix: str, partitions: range | list[int]) -> set[bytes]:
    """Two records to each partition, ``prefix-P-i``; flushed, so they are in the log."""
    values = set()
    for partition in partitions:
        for index in range(2):
            value = f"{prefix}-{partition}-{index}".encode()
            producer.produce(topic, value=value, key=b"k", partition=partition)
            values.add(value)
    assert producer.flush(10) == 0
    return values


def _values(cluster: KafkaCluster, topic: str, isolation_level: str) -> set[bytes]:
    records = cluster.read(topic, isolation_level=isolation_level)  # type: ignore[arg-type]
    values = [record.value for record in records]
    assert len(values) == len(set(values))
    return {value for value in values if value is not None}


def test_confluent_kafka_transactions(kafka_cluster: KafkaCluster, cluster_topic: str) -> None:
    """Two transactional ids and a plain producer interleaved: one transaction committed, one
    aborted, one left open (in partitions 0 and 1 only, holding back everything after it
    there), then its id initialized again by another producer (which aborts it; the old
    producer, fenced on Kafka, goes on writing and committing on the mock)."""
    topic, every = cluster_topic, range(PARTITIONS)
    a_id, b_id = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    plain = _confluent(kafka_cluster)
    a = _confluent(kafka_cluster, **{"transactional.id": a_id})
    b = _confluent(kafka_cluster, **{"transactional.id": b_id})
    a.init_transactions(10)
    b.init_transactions(10)

    served = _send(plain, topic, "plain1", every)
    a.begin_transaction()
    served |= _send(a, topic, "a-commit", every)
    a.commit_transaction(10)
    b.begin_transaction()
    aborted = _send(b, topic, "b-abort", every)
    served |= _send(plain, topic, "plain2", every)
    b.abort_transaction(10)
    a.begin_transaction()
    opened = _send(a, topic, "a-open", [0, 1])
    held = _send(plain, topic, "plain3", every)  # after the open transaction: held in 0, 1
    b.begin_transaction()
    held |= _send(b, topic, "b-commit", every)
    b.commit_transaction(10)

    written = served | aborted | opened | held
    assert _values(kafka_cluster, topic, "read_uncommitted") == written
    lso_free = {v for v in held if v.split(b"-")[-2] not in (b"0", b"1")}
    assert _values(kafka_cluster, topic, "read_committed") == served | lso_free
    view = kafka_cluster.transactions.view(topic)
    assert set(view.last_stable_offsets) == {0, 1}
    assert [(e.committed, e.error_code) for e in kafka_cluster.transactions.ends(b_id)] == [
        (False, 0),
        (True, 0),
    ]

    # Another producer initializes a's id: the open transaction is aborted, the LSO freed.
    a2 = _confluent(kafka_cluster, **{"transactional.id": a_id})
    a2.init_transactions(10)
    assert _values(kafka_cluster, topic, "read_committed") == served | held
    fenced = _send(a, topic, "a-fenced", [2])  # the mock takes it...
    a.commit_transaction(10)  # ...and the commit: Kafka fences both
    a2.begin_transaction()
    committed = _send(a2, topic, "a2-commit", every)
    a2.commit_transaction(10)
    assert _values(kafka_cluster, topic, "read_uncommitted") == written | fenced | committed
    assert _values(kafka_cluster, topic, "read_committed") == served | held | committed
    states = [state for _, state in kafka_cluster.transactions.view(topic).batches]
    assert states.count("fenced") == 1 and "open" not in states
    inits = kafka_cluster.transactions.inits(a_id)
    assert len(inits) == 2 and all(i.error_code == 0 for i in inits)


@pytest.mark.anyio
@TRANSACTIONS_ON_THE_FAST_PATH
async def test_atomic_batches_40_by_250_one_raising(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    """40 atomic batches of 250 keyed messages over 6 partitions, the block raising in batch
    17 after 125 messages: 39 x 250 in the read_committed view, none of batch 17; what
    read_uncommitted reads besides is batch 17's."""
    async with pk.Producer(kafka_cluster.url, topic=cluster_topic, timeout=20.0) as producer:
        for number in range(40):
            try:
                async with producer.atomic_batch() as batch:
                    for index in range(250):
                        if number == 17 and index == 125:
                            raise RuntimeError("the application failed mid-batch")
                        await batch.produce(b"%d-%d" % (number, index), key=b"k-%d" % index)
            except RuntimeError:
                assert number == 17
    records = await anyio.to_thread.run_sync(
        lambda: kafka_cluster.read(cluster_topic, 30.0, isolation_level="read_committed")
    )
    values = [record.value for record in records]
    expected = {b"%d-%d" % (n, i) for n in range(40) if n != 17 for i in range(250)}
    assert len(values) == 39 * 250 and set(values) == expected
    assert len({record.partition for record in records}) == PARTITIONS
    everything = await anyio.to_thread.run_sync(
        lambda: kafka_cluster.read(cluster_topic, 30.0, isolation_level="read_uncommitted")
    )
    extra = {r.value for r in everything} - expected
    assert extra and all(value is not None and value.startswith(b"17-") for value in extra)
    states = [state for _, state in kafka_cluster.transactions.view(cluster_topic).batches]
    assert "aborted" in states and "open" not in states and "fenced" not in states


@pytest.mark.anyio
@TRANSACTIONS_ON_THE_FAST_PATH
async def test_an_end_txn_refused_leaves_its_messages_out(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    """The commit refused by the cluster: the batch's messages are in the log, not in the
    view; the transaction stays open (and holds back its partitions) until the producer's
    next batch initializes its id again, which aborts it."""
    async with pk.Producer(kafka_cluster.url, topic=cluster_topic, timeout=5.0) as producer:
        async with producer.atomic_batch() as batch:
            for index in range(30):
                await batch.produce(b"first-%d" % index, key=b"k-%d" % index)
        kafka_cluster.fail_requests("EndTxn", ["UNKNOWN_PRODUCER_ID"])
        with pytest.raises(pk.AtomicBatchError):
            async with producer.atomic_batch() as batch:
                for index in range(30):
                    await batch.produce(b"refused-%d" % index, key=b"k-%d" % index)
        first = {b"first-%d" % index for index in range(30)}
        refused = {b"refused-%d" % index for index in range(30)}
        log = await anyio.to_thread.run_sync(
            lambda: _values(kafka_cluster, cluster_topic, "read_uncommitted")
        )
        assert log == first | refused
        view = await anyio.to_thread.run_sync(
            lambda: _values(kafka_cluster, cluster_topic, "read_committed")
        )
        assert view == first
        assert kafka_cluster.transactions.view(cluster_topic).last_stable_offsets
        txn = kafka_cluster.transactions.produces(cluster_topic)[0].transactional_id
        ends = kafka_cluster.transactions.ends(txn)
        assert [(e.committed, e.error_code) for e in ends] == [(True, 0), (True, 59)]

        async with producer.atomic_batch() as batch:
            for index in range(30):
                await batch.produce(b"then-%d" % index, key=b"k-%d" % index)
    view = await anyio.to_thread.run_sync(
        lambda: _values(kafka_cluster, cluster_topic, "read_committed")
    )
    assert view == first | {b"then-%d" % index for index in range(30)}
    assert not kafka_cluster.transactions.view(cluster_topic).last_stable_offsets
