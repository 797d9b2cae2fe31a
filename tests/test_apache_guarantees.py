"""Kafka's guarantees, judged by Apache Kafka itself.

Every check here reads the topic back with a real ``read_committed`` consumer
(:meth:`ApacheKafka.read`, confluent-kafka), never with producerkit's own view of what it sent:

- the idempotent producer at its defaults on three nodes, the node leading most partitions
  killed (SIGKILL) and restarted while it produces: every message acked or failed typed, no
  acked message missing, none stored twice, each key's messages in order;
- atomic batches: a committed one read exactly once, an aborted one never, an open one not
  while it is open, and one left open past ``transaction_timeout_ms`` aborted by the broker and
  reported so (``kind="timed_out"``);
- and that each check catches a deliberately broken producer: one that skips a sequence
  number (the broker answers OUT_OF_ORDER_SEQUENCE_NUMBER), and one that commits before its
  writes were answered (the committed transaction is missing its records).

Fencing (a newer producer of the transactional id) is tested on Apache Kafka in
``tests/test_transactions_v2.py``, not again here.
"""

from __future__ import annotations

import collections
import time
import uuid
from typing import Any

import anyio
import pytest
from conftest import TRANSACTIONS_ON_THE_FAST_PATH

import producerkit as pk
from producerkit.backends.kafka import idempotence, sender
from producerkit.backends.kafka.atomic import _TransactionWriter
from producerkit.testing.apache_kafka import ApacheKafka

pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.anyio

#: The idempotent producer's run: messages, keys, and the pace that spreads them over ~10 s,
#: so that a node is killed and restarted while they are produced.
MESSAGES = 20_000
KEYS = 200
RATE = 2_000.0
KILL_AT, RESTART_AT = 4_000, 10_000
OUT_OF_ORDER_SEQUENCE_NUMBER = 45


@pytest.fixture
def anyio_backend() -> str:
    """asyncio only: these tests measure the brokers, not the event loop."""
    return "asyncio"


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Outcomes:
    """Every message's outcome, from ``on_delivery``: the acked ones by (key, seq) with where
    the broker stored them, the failed ones with their Failure."""

    def __init__(self) -> None:
        self.acked: dict[Any, pk.Delivery] = {}
        self.failed: dict[Any, pk.Failure] = {}

    def __call__(self, outcome: pk.Delivery | pk.Failure, context: Any) -> None:
        """Keep ``outcome`` under ``context`` (the message's (key, seq)), else a new number."""
        name = context if context is not None else len(self.acked) + len(self.failed)
        if isinstance(outcome, pk.Failure):
            self.failed[name] = outcome
        else:
            self.acked[name] = outcome


def _key_seq(record: dict[str, Any]) -> tuple[bytes, int]:
    key, _, seq = record["value"].partition(b":")
    assert key == record["key"], record
    return key, int(seq)


def check_idempotence(
    records: list[dict[str, Any]], outcomes: Outcomes, produced: int
) -> dict[str, int]:
    """The idempotent producer's guarantee, as a ``read_committed`` consumer sees ``records``
    (in partition and offset order): every message acked or failed; no acked message missing;
    none stored twice (a key and sequence number read twice); each key's messages read in the
    order they were produced; a stored message that was not acked only among failures that
    say ``possibly_stored``; each delivery's offset the one the message was read at. Returns
    the figures."""
    acked, failed = outcomes.acked, outcomes.failed
    assert len(acked) + len(failed) == produced, (len(acked), len(failed), produced)
    assert not set(acked) & set(failed)
    for failure in failed.values():
        assert isinstance(failure.exception, pk.ProducerkitError), repr(failure.exception)

    positions: dict[tuple[bytes, int], list[tuple[int, int]]] = collections.defaultdict(list)
    by_key: dict[bytes, list[int]] = collections.defaultdict(list)
    for record in records:
        key, seq = _key_seq(record)
        positions[key, seq].append((record["partition"], record["offset"]))
        by_key[key].append(seq)
    duplicates = sum(len(found) - 1 for found in positions.values())
    missing = [message for message in acked if message not in positions]
    stored_failed = [message for message in positions if message in failed]
    unexplained = [m for m in positions if m not in acked and m not in failed]
    dishonest = [message for message in stored_failed if not failed[message].possibly_stored]
    out_of_order = [key for key, seqs in by_key.items() if seqs != sorted(seqs)]
    misplaced = [
        message
        for message, delivery in acked.items()
        if delivery.offset is not None
        and message in positions
        and (delivery.partition, delivery.offset) not in positions[message]
    ]
    figures = {
        "produced": produced,
        "acked": len(acked),
        "failed": len(failed),
        "failed_possibly_stored": sum(failure.possibly_stored for failure in failed.values()),
        "read": len(records),
        "lost": len(missing),
        "duplicates": duplicates,
        "stored_though_failed": len(stored_failed),
    }
    assert missing == [], (figures, missing[:10])
    assert duplicates == 0, (figures, [m for m, found in positions.items() if len(found) > 1][:9])
    assert unexplained == [], (figures, unexplained[:10])
    assert dishonest == [], (figures, dishonest[:10])
    assert out_of_order == [], (figures, out_of_order[:10])
    assert misplaced == [], (figures, misplaced[:10])
    return figures


# ---------------------------------------------------------------------- 1. idempotence


async def test_idempotent_producer_survives_a_killed_and_restarted_leader(
    apache_kafka_cluster: ApacheKafka,
) -> None:
    """20,000 keyed messages (200 keys, a sequence number per key in the value) at 2,000/s on
    three nodes (6 partitions, replication 3, min.insync.replicas 2), the producer at its
    defaults (idempotent, acks=all). After the 4,000th the node leading most partitions is
    killed with SIGKILL; at the 10,000th, once its partitions have new leaders, it is started
    again, and rejoins while the other 10,000 are produced (its restart waits in a thread).
    Read back ``read_committed``: nothing acked is missing, nothing is stored twice, every
    key's messages are in order; every message was acked or failed with a typed error, and
    one stored though failed said ``possibly_stored``. (Measured: all 20,000 acked, 0 failed,
    0 lost, 0 duplicates, in 17-40 s on 2 busy cores.)"""
    kafka = apache_kafka_cluster
    topic = _topic("idempotent")
    kafka.create_topic(topic, partitions=6, replication_factor=3, min_insync_replicas=2)
    leaders = collections.Counter(kafka.leaders(topic).values())
    victim = leaders.most_common(1)[0][0]
    outcomes = Outcomes()
    next_seq: dict[bytes, int] = collections.defaultdict(int)
    moved = anyio.Event()
    leaders_after: dict[int, int] = {}

    async def fail_over() -> None:
        kafka.kill(victim)
        found = await anyio.to_thread.run_sync(
            lambda: kafka.wait_for_leaders(topic, avoiding=[victim], timeout=60.0)
        )
        leaders_after.update(found)
        moved.set()
        await anyio.to_thread.run_sync(kafka.restart, victim)

    started = time.monotonic()
    failed_close: pk.ProduceError | None = None
    async with anyio.create_task_group() as tasks:
        producer = pk.Producer(
            kafka.url, topic=topic, max_rate=RATE, timeout=30.0, on_delivery=outcomes
        )
        try:
            async with producer:
                for index in range(MESSAGES):
                    key = b"key-%d" % (index % KEYS)
                    seq = next_seq[key]
                    next_seq[key] += 1
                    await producer.produce(
                        b"%s:%d" % (key, seq), key=key, nonblocking=True, context=(key, seq)
                    )
                    if index + 1 == KILL_AT:
                        tasks.start_soon(fail_over)
                    elif index + 1 == RESTART_AT:
                        # The killed node's partitions have new leaders before it restarts (as
                        # the rest of the messages are produced).
                        await moved.wait()
                await producer.flush()
        except pk.ProduceError as error:  # failures were told to on_delivery as well
            failed_close = error
        stats = producer.stats
    elapsed = time.monotonic() - started
    assert kafka.running(victim)
    assert victim not in leaders_after.values(), leaders_after

    assert stats.produced == MESSAGES and stats.acked + stats.failed == MESSAGES, stats
    assert stats.acked == len(outcomes.acked) and stats.failed == len(outcomes.failed)
    assert (failed_close is not None) == bool(outcomes.failed)
    records = kafka.read(topic, expected=len(outcomes.acked), timeout=60.0)
    figures = check_idempotence(records, outcomes, MESSAGES)
    kinds = collections.Counter(type(f.exception).__name__ for f in outcomes.failed.values())
    print(f"killed node {victim} (led {leaders[victim]} of 6); {elapsed:.1f} s; {figures}; {kinds}")


async def test_a_skipped_sequence_number_is_caught_by_the_broker(
    apache_kafka: ApacheKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken idempotent producer that stamps one batch with a sequence number one too high
    (a gap the broker cannot tell from a lost batch): Apache Kafka refuses that batch with
    OUT_OF_ORDER_SEQUENCE_NUMBER instead of storing it. producerkit then does what it does for
    a sequence error (bumps the epoch and sends every batch not acked again, numbered from 0),
    so the read-back still passes the idempotence check: each message once, in order."""
    monkeypatch.setenv("PRODUCERKIT_CLIENT_PATH", "fast")  # producerkit's own stamps
    kafka = apache_kafka
    topic = _topic("skipped-seq")
    kafka.create_topic(topic, partitions=1)
    stamp = idempotence.stamp
    skipped: list[tuple[int, int]] = []  # (epoch, the sequence it should have carried)

    def stamp_skipping_one(
        data: bytes | bytearray,
        producer: idempotence.ProducerId,
        sequence: int,
        *,
        transactional: bool = False,
    ) -> bytes:
        if sequence == 5 and not skipped:  # the sixth message's batch: skip sequence 5
            skipped.append((producer.epoch, sequence))
            sequence += 1
        return stamp(data, producer, sequence, transactional=transactional)

    answered: list[tuple[int, int | None]] = []
    settle_sequence_error = sender.Sender._settle_sequence_error

    def recording(self: sender.Sender, batch: Any, code: int) -> None:
        answered.append((code, batch.sequence))
        settle_sequence_error(self, batch, code)

    monkeypatch.setattr(idempotence, "stamp", stamp_skipping_one)
    monkeypatch.setattr(sender.Sender, "_settle_sequence_error", recording)
    outcomes = Outcomes()
    async with pk.Producer(kafka.url, topic=topic, timeout=30.0, on_delivery=outcomes) as producer:
        for seq in range(10):  # one at a time: one batch per message, sequence = seq
            await producer.produce(b"k:%d" % seq, key=b"k", context=(b"k", seq))

    assert skipped == [(skipped[0][0], 5)]
    # The broker caught it: the batch stamped 6 where 5 was due was refused, not stored.
    assert (OUT_OF_ORDER_SEQUENCE_NUMBER, 5) in answered, answered
    records = kafka.read(topic, expected=10)
    check_idempotence(records, outcomes, 10)
    assert len(outcomes.acked) == 10 and not outcomes.failed
    assert [_key_seq(record)[1] for record in records] == list(range(10))
    # read_uncommitted too: the refused write left nothing behind.
    assert len(kafka.read(topic, isolation="read_uncommitted", expected=10)) == 10


# ---------------------------------------------------------------------- 2. atomic batches


def _values(records: list[dict[str, Any]]) -> list[bytes]:
    return sorted(record["value"] for record in records)


@TRANSACTIONS_ON_THE_FAST_PATH
async def test_atomic_batches_committed_once_aborted_never_open_invisible(
    apache_kafka: ApacheKafka,
) -> None:
    """Three atomic batches over three partitions: one committed, one aborted (its block
    raised), one committed after a ``read_committed`` read while it was open, its messages
    answered by the broker (``flush()``) but not yet committed: that read sees the first
    batch's messages only, while ``read_uncommitted`` sees the open one's too. At the end a
    ``read_committed`` consumer reads the two committed batches' messages exactly once each
    and none of the aborted one's."""
    kafka = apache_kafka
    topic = _topic("atomic")
    kafka.create_topic(topic, partitions=3)
    first = [b"first-%d" % i for i in range(9)]
    aborted = [b"aborted-%d" % i for i in range(9)]
    last = [b"last-%d" % i for i in range(9)]
    async with pk.Producer(
        kafka.url, topic=topic, transactional_id=f"tx-{topic}", timeout=30.0
    ) as producer:
        async with producer.atomic_batch() as batch:
            for index, value in enumerate(first):
                await batch.produce(value, key=b"k%d" % index)
        with pytest.raises(RuntimeError, match="gives up"):
            async with producer.atomic_batch() as batch:
                for index, value in enumerate(aborted):
                    await batch.produce(value, key=b"k%d" % index)
                raise RuntimeError("the application gives up on this one")
        async with producer.atomic_batch() as batch:
            for index, value in enumerate(last):
                await batch.produce(value, key=b"k%d" % index)
            await producer.flush()  # written and answered, not committed
            # Up to each partition's last stable offset: the open transaction's first record.
            seen_open = await anyio.to_thread.run_sync(lambda: kafka.read(topic, timeout=15.0))
            uncommitted = await anyio.to_thread.run_sync(
                lambda: kafka.read(topic, isolation="read_uncommitted", expected=27)
            )
    assert _values(seen_open) == sorted(first)
    assert _values(uncommitted) == sorted(first + aborted + last)

    committed = kafka.read(topic, expected=len(first + last))
    assert _values(committed) == sorted(first + last)  # each once, no aborted one


@TRANSACTIONS_ON_THE_FAST_PATH
@pytest.mark.parametrize("which", ["apache_kafka", "apache_kafka_tv0"])
async def test_a_transaction_left_open_past_its_timeout_is_aborted_by_the_broker(
    which: str, request: pytest.FixtureRequest
) -> None:
    """A batch left open past ``transaction_timeout_ms`` (2 s; the nodes look for such
    transactions every second): the coordinator aborts it, and the commit at the block's end
    fails ``AtomicBatchError(kind="timed_out")``, nothing stored (not ``possibly_stored``),
    the broker's refusal in ``code`` (48 INVALID_TXN_STATE with transactions v2, 47
    INVALID_PRODUCER_EPOCH with v1: the coordinator bumped the epoch). Nothing of it is read
    committed, and the producer is not fenced: its next batch commits."""
    kafka: ApacheKafka = request.getfixturevalue(which)
    topic = _topic("timed-out")
    kafka.create_topic(topic, partitions=2)
    values = [b"late-%d" % i for i in range(4)]
    outcomes = Outcomes()
    async with pk.Producer(
        kafka.url,
        topic=topic,
        transactional_id=f"tx-{topic}",
        transaction_timeout_ms=2000,
        timeout=30.0,
        on_delivery=outcomes,
    ) as producer:
        with pytest.raises(pk.AtomicBatchError) as raised:
            async with producer.atomic_batch() as batch:
                for index, value in enumerate(values):
                    await batch.produce(value, key=b"k%d" % index)
                await producer.flush()
                # Until the broker aborted it: the abort marker takes the partitions' last
                # stable offset to their end.
                await anyio.to_thread.run_sync(_wait_until_stable, kafka, topic)
        error = raised.value
        assert error.kind == "timed_out", repr(error)
        assert error.code == (48 if kafka.transaction_version >= 2 else 47), repr(error)
        assert not error.possibly_stored
        assert "transaction_timeout_ms=2000" in str(error)
        assert len(outcomes.failed) == len(values)
        assert not any(failure.possibly_stored for failure in outcomes.failed.values())

        async with producer.atomic_batch() as batch:
            await batch.produce(b"next", key=b"k0")

    assert _values(kafka.read(topic, expected=1)) == [b"next"]
    assert len(kafka.read(topic, isolation="read_uncommitted", expected=5)) == 5


@TRANSACTIONS_ON_THE_FAST_PATH
async def test_a_producer_whose_batch_timed_out_does_not_take_its_id_back(
    apache_kafka: ApacheKafka,
) -> None:
    """Transactions v2: a producer whose batch the broker aborted for its timeout, the id
    taken by a newer producer meanwhile, whose batch is open on the broker (written): the older
    one's next batch fails ``"fenced"``, and the newer one's commits. The older producer looks
    first (the id is no longer where the timeout left it) and sends no InitProducerId: one
    naming its producer id would abort the newer producer's ongoing transaction (a coordinator
    checks the epoch only of an id with none open), and one without would take the id. (It
    still takes it after a timeout with transactions v1, and after other failures:
    docs/atomic.md.)"""
    kafka = apache_kafka
    topic = _topic("taken-back")
    kafka.create_topic(topic, partitions=1)
    transactional_id = f"tx-{topic}"
    async with pk.Producer(
        kafka.url,
        topic=topic,
        transactional_id=transactional_id,
        transaction_timeout_ms=2000,
        timeout=30.0,
    ) as older:
        with pytest.raises(pk.AtomicBatchError) as raised:
            async with older.atomic_batch() as batch:
                await batch.produce(b"older-late")
                await older.flush()
                await anyio.to_thread.run_sync(_wait_until_stable, kafka, topic)
        assert raised.value.kind == "timed_out", repr(raised.value)
        async with (
            pk.Producer(
                kafka.url, topic=topic, transactional_id=transactional_id, timeout=30.0
            ) as newer,
            newer.atomic_batch() as newer_batch,
        ):
            await newer_batch.produce(b"newer")
            await newer.flush()  # the coordinator has the newer batch ongoing
            with pytest.raises(pk.AtomicBatchError) as fenced:
                async with older.atomic_batch() as batch:
                    await batch.produce(b"older-again")
            assert fenced.value.kind == "fenced", repr(fenced.value)
            assert "is Ongoing" in str(fenced.value), repr(fenced.value)  # it looked, not asked

    assert _values(kafka.read(topic, expected=1)) == [b"newer"]


@TRANSACTIONS_ON_THE_FAST_PATH
@pytest.mark.parametrize("which", ["apache_kafka", "apache_kafka_tv0"])
async def test_a_prepared_transaction_ended_past_its_timeout_is_reported_timed_out(
    which: str, request: pytest.FixtureRequest
) -> None:
    """A prepared transaction (two-phase commit) whose commit comes after the broker aborted
    it for outliving ``transaction_timeout_ms``: ``commit_prepared`` fails
    ``AtomicBatchError(kind="timed_out")`` with the broker's refusal in ``code``, as the
    batch's own commit does, not ``"fenced"`` (no newer producer took the id); nothing of it is
    read committed. The handle carries when the transaction began and its timeout."""
    from producerkit import transactions

    kafka: ApacheKafka = request.getfixturevalue(which)
    topic = _topic("prepared-timed-out")
    kafka.create_topic(topic, partitions=2)
    async with pk.Producer(
        kafka.url, topic=topic, transactional_id=f"tx-{topic}", transaction_timeout_ms=2000
    ) as producer:
        async with producer.atomic_batch(prepare=True) as batch:
            for index in range(4):
                await batch.produce(b"late-%d" % index, key=b"k%d" % index)
        prepared = batch.prepared
    assert prepared is not None and prepared.transaction_timeout_ms == 2000
    assert prepared.began_at is not None and abs(time.time() - prepared.began_at) < 30
    await anyio.to_thread.run_sync(_wait_until_stable, kafka, topic)  # the broker aborted it
    with pytest.raises(pk.AtomicBatchError) as raised:
        await transactions.commit_prepared(kafka.url, prepared)
    error = raised.value
    assert error.kind == "timed_out", repr(error)
    assert error.code == (48 if kafka.transaction_version >= 2 else 47), repr(error)
    assert "transaction_timeout_ms=2000" in str(error)
    assert kafka.read(topic) == []  # to each partition's end: nothing committed


def _wait_until_stable(kafka: ApacheKafka, topic: str, timeout: float = 30.0) -> None:
    """Wait until no partition of ``topic`` holds an open transaction: each partition's end
    as a ``read_committed`` consumer sees it (the last stable offset) is its end as a
    ``read_uncommitted`` one does (the high watermark)."""
    from confluent_kafka import Consumer, TopicPartition

    consumers = [
        Consumer(
            {
                "bootstrap.servers": kafka.bootstrap_servers,
                "group.id": "producerkit-guarantees",
                "isolation.level": isolation,
                "log_level": 3,
            }
        )
        for isolation in ("read_committed", "read_uncommitted")
    ]
    partitions = [TopicPartition(topic, partition) for partition in sorted(kafka.leaders(topic))]
    deadline = time.monotonic() + timeout
    try:
        while True:
            stable, high = (
                [
                    consumer.get_watermark_offsets(tp, timeout=5, cached=False)[1]
                    for tp in partitions
                ]
                for consumer in consumers
            )
            if stable == high and any(high):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: a transaction still open ({stable} < {high})")
            time.sleep(0.2)
    finally:
        for consumer in consumers:
            consumer.close()


@TRANSACTIONS_ON_THE_FAST_PATH
@pytest.mark.parametrize("which", ["apache_kafka", "apache_kafka_tv0"])
async def test_a_commit_before_the_writes_were_answered_is_caught_by_the_broker(
    which: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken producer that ends its batch with the commit (EndTxn) at once, without waiting
    until the broker answered every write of it. Its first message is written and answered
    (``flush()``: the transaction is open on the broker); the four after it wait in the
    accumulator (``linger_ms=2000``), so the EndTxn is written before their Produce request,
    on the same connection: the broker takes them in that order, whatever the machine's load.
    The producer is told the batch committed, but the broker's ``read_committed`` view holds
    its first message only: the later writes came after the commit and are not in the
    committed transaction (refused, or left in one no one commits)."""
    kafka: ApacheKafka = request.getfixturevalue(which)
    topic = _topic("early-commit")
    kafka.create_topic(topic, partitions=1)

    async def commit_at_once(self: _TransactionWriter) -> None:
        return None  # nothing flushed, no answer waited for: the commit goes at once

    answers: list[int | None] = []
    settle = sender.Sender._settle

    def recording(self: sender.Sender, batch: Any, results: dict[Any, Any]) -> None:
        code = results.get((batch.queue.topic, batch.queue.partition), (None,))[0]
        # A partition just made may answer NOT_LEADER_OR_FOLLOWER (6) until its node has loaded
        # it, however its metadata reads; the producer writes it again: not what is judged here.
        if code != 6:
            answers.append(code)
        settle(self, batch, results)

    monkeypatch.setattr(sender.Sender, "_settle", recording)
    settled = _TransactionWriter.settled
    values = [b"early-%d" % i for i in range(5)]
    outcomes = Outcomes()
    async with pk.Producer(
        kafka.url,
        topic=topic,
        transactional_id=f"tx-{topic}",
        linger_ms=2000,
        transaction_timeout_ms=5000,
        timeout=5.0,
        on_delivery=outcomes,
    ) as producer:
        monkeypatch.setattr(_TransactionWriter, "settled", commit_at_once)
        async with producer.atomic_batch() as batch:  # "committed": it raises nothing
            await batch.produce(values[0], key=b"k")
            await producer.flush()
            for value in values[1:]:
                await batch.produce(value, key=b"k")
        monkeypatch.setattr(_TransactionWriter, "settled", settled)
        with anyio.fail_after(20):
            while len(answers) < 2:  # the late Produce goes out and is answered
                await anyio.sleep(0.05)
        # Up to each partition's last stable offset: what read_committed consumers get.
        seen = await anyio.to_thread.run_sync(lambda: kafka.read(topic, timeout=15.0))
    assert _values(seen) == [values[0]]  # a committed transaction without 4 of its records
    if kafka.transaction_version >= 2:
        # Stamped when written, after the EndTxn: with the epoch EndTxn v5 answered, sequence
        # 0, so the broker took them as the first writes of the next transaction, which no
        # one commits (the coordinator aborts it at its timeout).
        assert answers == [0, 0]
    else:
        # The leader asked the coordinator, which has no such transaction open: refused,
        # INVALID_TXN_STATE.
        assert answers == [0, 48]
    # producerkit's accounting shows it too: a batch told committed, four of its messages
    # failed after (their deadline passed unanswered: they were never part of the commit).
    assert len(outcomes.acked) == 1 and len(outcomes.failed) == 4
