"""What Apache Kafka would have stored of an idempotent producer's batches where librdkafka's
mock stored every one (KIP-98, KIP-360): :class:`BatchLog` is what the producer sent (each
idempotent Produce batch and its answer, as the recorders saw them); :class:`KafkaReplay`
judges each stored batch by its producer id, epoch and sequence, :func:`kafka_view` counts
duplicates and per-key order in the log Kafka would have kept, :func:`cluster_summary` tells
what the recorders saw."""

from __future__ import annotations

import threading
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from chaos.judges.kafka_transactions import _answered_below
from chaos.judges.kafka_wire import BatchHeader, ServedBatch
from chaos.judges.stored import Stored
from chaos.workload import EXAMPLES

# --------------------------------------------------------------------------- what was sent

#: A produced batch's error code while its answer is on its way, and once its connection closed
#: without one.
_PENDING: Final = -32768
_NEVER: Final = -32767


@dataclass(frozen=True)
class ProducedBatch:
    """One partition's batch of an idempotent Produce request (a producer id, no transactional
    id), and the answer: ``error_code`` and ``base_offset`` are None until it passes the
    recorder, and stay so if it never does (``answered`` False)."""

    producer_id: int
    epoch: int
    topic: str
    partition: int
    base_sequence: int
    record_count: int
    error_code: int | None
    base_offset: int | None
    answered: bool


class BatchLog:
    """Every batch of an idempotent producer's Produce requests (a producer id, no
    transactional id) that a :class:`~chaos.judges.kafka_recorder.RecordingKafkaCluster` made
    with ``record_batches=True`` recorded, in the order the requests reached the cluster, with the
    answer's error code and base offset (:meth:`produced`).

    The mock checks an idempotent producer's sequence numbers nowhere: it stores a retried
    batch again where Apache Kafka would answer with the first copy's offset, and stores a batch
    past a sequence gap where Kafka would refuse it. What the producer sent (producer id, epoch,
    base sequence per partition) and where each answered batch went tells such copies from a
    producer's own duplicates. (The mock stores each batch with the header it came with, so a
    raw Fetch of the log shows the same stamps.)

    The recorder's thread writes it; any thread may read it. Kept in arrays (some 40 bytes a
    batch), never cleared.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition(threading.Lock())
        self._topics: list[str] = []
        self._topic_ids: dict[str, int] = {}
        self._p_topic = array("i")
        self._p_partition = array("i")
        self._p_producer = array("q")
        self._p_epoch = array("h")
        self._p_sequence = array("i")
        self._p_count = array("i")
        self._p_error = array("h")
        self._p_offset = array("q")
        self._pending: set[int] = set()
        self._unreadable_frames: list[tuple[int, int]] = []  # (api key, version)

    # ------------------------------------------------------------------ reading

    def produced(self, topic: str | None = None) -> Iterator[ProducedBatch]:
        """The idempotent Produce batches (of ``topic``, or of every topic) in the order the
        requests reached the cluster: a snapshot, made into objects as it is iterated."""
        with self._lock:
            columns = (
                array("i", self._p_topic),
                array("i", self._p_partition),
                array("q", self._p_producer),
                array("h", self._p_epoch),
                array("i", self._p_sequence),
                array("i", self._p_count),
                array("h", self._p_error),
                array("q", self._p_offset),
            )
            topics = list(self._topics)
        wanted = None if topic is None else self._topic_ids.get(topic, -1)
        for t, partition, producer, epoch, sequence, count, error, offset in zip(
            *columns, strict=True
        ):
            if wanted is not None and t != wanted:
                continue
            answered = error not in (_PENDING, _NEVER)
            yield ProducedBatch(
                producer_id=producer,
                epoch=epoch,
                topic=topics[t],
                partition=partition,
                base_sequence=sequence,
                record_count=count,
                error_code=error if answered else None,
                base_offset=offset if answered else None,
                answered=answered,
            )

    @property
    def unreadable(self) -> list[tuple[int, int]]:
        """``(api key, version)`` of each frame the recorder could not read for this log (what
        it held is missing here)."""
        with self._lock:
            return list(self._unreadable_frames)

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every Produce batch recorded so far was
        answered (or its connection closed): True if they all were."""
        with self._lock:
            return _answered_below(self._lock, self._pending, len(self._p_error), timeout)

    # ------------------------------------------------------------------ recording (one thread)

    def _topic(self, topic: str) -> int:
        index = self._topic_ids.get(topic)
        if index is None:
            index = self._topic_ids[topic] = len(self._topics)
            self._topics.append(topic)
        return index

    def _produce(self, batches: Iterable[BatchHeader]) -> list[int]:
        """Record an idempotent Produce request's batches; returns their indexes, for
        :meth:`_answer`."""
        indexes = []
        with self._lock:
            for batch in batches:
                index = len(self._p_error)
                self._p_topic.append(self._topic(batch.topic))
                self._p_partition.append(batch.partition)
                self._p_producer.append(batch.producer_id)
                self._p_epoch.append(batch.epoch)
                self._p_sequence.append(batch.base_sequence)
                self._p_count.append(batch.record_count)
                self._p_error.append(_PENDING)
                self._p_offset.append(-1)
                self._pending.add(index)
                indexes.append(index)
        return indexes

    def _unreadable(self, api_key: int, api_version: int) -> None:
        with self._lock:
            self._unreadable_frames.append((api_key, api_version))

    def _answer(self, answers: Iterable[tuple[int, tuple[int, int] | None]]) -> None:
        """Fill in answers: ``(error_code, base_offset)`` by index (None: the connection closed
        without one)."""
        with self._lock:
            for index, answer in answers:
                if answer is None:
                    self._p_error[index] = _NEVER
                else:
                    self._p_error[index], self._p_offset[index] = answer
                self._pending.discard(index)
            self._lock.notify_all()


# --------------------------------------------------------------------------- what Kafka stores


class _Sequences:
    """One producer id's state in one partition, as Kafka's partition leader keeps it: the
    epoch, the next sequence, the last 5 batches' (base sequence, count), and here also the
    batches stored past a gap, held until the gap closes."""

    __slots__ = ("epoch", "held", "next", "recent")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.next = 0
        self.recent: list[tuple[int, int]] = []
        self.held: dict[int, Any] = {}  # base sequence -> ServedBatch

    def take(self, batch: Any) -> None:
        self.next = batch.base_sequence + batch.record_count
        self.recent = [*self.recent[-4:], (batch.base_sequence, batch.record_count)]


class KafkaReplay:
    """One partition's stored batches, in offset order, judged as Apache Kafka's partition
    leader judges an idempotent producer's (KIP-98, KIP-360), where the mock took every one.
    :meth:`add` says of each batch:

    - ``stored``: a batch without a producer id; or a producer id's first batch here, or its
      first of a newer epoch (its state starts over: sequence 0 expected); or the next sequence;
    - ``deduplicated``: its (base sequence, count) is one of the last 5 batches of that producer
      id and epoch (or one held, below): Kafka answers with the first copy's offset and does not
      store it again;
    - ``held``: its base sequence is past the next one (a gap: an earlier batch failed, waits
      for a retry, or was given up on). Kafka refuses it (OUT_OF_ORDER_SEQUENCE_NUMBER) where
      the mock stored it; producerkit sends it again after the batch that fills the gap (a retry
      in the same epoch, ``stored_late``) or, where the gap never closes, bumps its epoch (the
      mock grants a new producer id instead) and sends it again first in the new one
      (``stored_after_bump``; each such gap counted in :attr:`gaps`). Either way Kafka stores it
      once, later than the mock did, and in sequence order;
    - ``refused_old_epoch`` (an epoch older than one stored), ``refused_old_sequence`` (a
      sequence below the next one and not among the last 5 batches): refused, not stored.

    :attr:`records` counts records by verdict (a held batch's once its gap closes, or the log
    ends: :meth:`close`)."""

    def __init__(self) -> None:
        self.producers: dict[int, _Sequences] = {}
        self.records: Counter[str] = Counter()
        self.gaps = 0  # sequence gaps that never closed in their epoch

    def add(self, batch: Any) -> str:
        if batch.producer_id < 0:
            return self._count("stored", batch.record_count)
        state = self.producers.get(batch.producer_id)
        if state is None or batch.epoch > state.epoch:
            if state is not None:
                self._never_closed(state)
            state = self.producers[batch.producer_id] = _Sequences(batch.epoch)
        sequence, count = batch.base_sequence, batch.record_count
        if batch.epoch < state.epoch:
            return self._count("refused_old_epoch", count)
        held = state.held.get(sequence)
        if (sequence, count) in state.recent or (held is not None and held.record_count == count):
            return self._count("deduplicated", count)
        if sequence > state.next:
            state.held[sequence] = batch
            return "held"
        if sequence < state.next:
            return self._count("refused_old_sequence", count)
        state.take(batch)
        while state.next in state.held:
            late = state.held.pop(state.next)
            state.take(late)
            self._count("stored_late", late.record_count)
        return self._count("stored", count)

    def close(self) -> None:
        """The partition's log ends: gaps still open never closed."""
        for state in self.producers.values():
            self._never_closed(state)

    def _never_closed(self, state: _Sequences) -> None:
        if state.held:
            self.gaps += 1
            self._count("stored_after_bump", sum(b.record_count for b in state.held.values()))
            state.held.clear()

    def _count(self, verdict: str, records: int) -> str:
        self.records[verdict] += records
        return verdict


#: KafkaReplay's verdicts as kafka_view marks each record (0: in no batch read).
_STORED, _HELD, _NOT_STORED = 1, 2, 3


def kafka_view(stored: Stored, served: Iterable[ServedBatch]) -> dict[str, Any]:
    """Duplicates and per-key order as Apache Kafka would have stored what the mock stored:
    every batch read (with the header the mock stored it with) through KafkaReplay. Extra
    copies count where Kafka stores them too (``stored`` and ``held`` batches: a message
    stored under two sequences, sent twice by the producer); copies in batches Kafka
    deduplicates or refuses do not. Order, among each message's first copy Kafka stores, two
    ways: in the mock's log order, a sequence below a higher one of its key before it, unless
    that higher one sits in a held batch (Kafka stores it later, after the batch that fills its
    gap: the mock's doing, not the producer's); and in the order Kafka keeps an epoch's
    records in, their sequence numbers, a key's messages out of produce order (which also
    covers held batches among themselves). Records read that no batch read holds are taken as
    stored (``unbatched``; none expected)."""
    import numpy as np

    assert stored.positions is not None
    n = stored.ledger.sent
    key = np.frombuffer(stored.key, np.uint16)
    sequence = np.frombuffer(stored.sequence, np.uint32)
    marks = {p: np.zeros(len(column), np.uint8) for p, column in stored.positions.items()}
    # Each record's stamp: producer id (-1: none), epoch, its own sequence (base + index).
    stamps = {
        p: (np.full(len(column), -1, np.int64), np.zeros(len(column), np.int64))
        for p, column in stored.positions.items()
    }
    record_sequence = {p: np.zeros(len(column), np.int64) for p, column in stored.positions.items()}
    replays: dict[int, KafkaReplay] = {}
    codes = {"stored": _STORED, "held": _HELD}
    for batch in served:
        replay = replays.get(batch.partition)
        if replay is None:
            replay = replays[batch.partition] = KafkaReplay()
        verdict = codes.get(replay.add(batch), _NOT_STORED)
        mark = marks.get(batch.partition)
        if mark is not None:
            start, end = batch.base_offset, min(batch.base_offset + batch.record_count, len(mark))
            mark[start:end] = verdict
            producer, epoch = stamps[batch.partition]
            producer[start:end], epoch[start:end] = batch.producer_id, batch.epoch
            record_sequence[batch.partition][start:end] = np.arange(
                batch.base_sequence, batch.base_sequence + end - start
            )
    verdicts: Counter[str] = Counter()
    for replay in replays.values():
        replay.close()
        verdicts.update(replay.records)
    kept: list[Any] = []
    order_violations = in_sequence = 0  # in_sequence: those only the sequence order shows
    examples: list[int] = []
    unbatched = 0
    for partition, column in sorted(stored.positions.items()):
        ids, mark = np.frombuffer(column, np.uint32), marks[partition]
        unbatched += int(((ids > 0) & (mark == 0)).sum())
        at = np.flatnonzero((ids > 0) & (mark != _NOT_STORED))
        messages = ids[at].astype(np.int64) - 1
        held = mark[at] == _HELD
        kept.append(messages)
        _, first = np.unique(messages, return_index=True)
        first.sort()
        firsts, firsts_held = messages[first], held[first]
        producer, epoch = stamps[partition]
        where = at[first]
        behind_in_sequence = _out_of_sequence(
            firsts,
            key,
            sequence,
            producer[where],
            epoch[where],
            record_sequence[partition][where],
        )
        by_key = np.argsort(key[firsts], kind="stable")
        ordered, ordered_held = firsts[by_key], firsts_held[by_key]
        base = key[ordered].astype(np.int64) << 32
        composite = base | sequence[ordered].astype(np.int64)
        # The highest sequence of the key before each first copy, held ones left out.
        highest = np.maximum.accumulate(np.where(ordered_held, base, composite))
        before = np.concatenate(([-1], highest[:-1]))
        behind = ordered[composite < before]
        # A message behind either way counts once.
        behind_either = np.union1d(behind, behind_in_sequence)
        order_violations += len(behind_either)
        in_sequence += len(np.setdiff1d(behind_in_sequence, behind))
        examples += behind_either[: EXAMPLES - len(examples)].tolist()
    all_kept = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    kafka_copies = np.bincount(all_kept, minlength=n)[:n]
    raw_copies = np.frombuffer(stored.copies, np.uint8)[:n]
    return {
        "duplicates": int(np.maximum(kafka_copies - 1, 0).sum()),
        "order_violations": order_violations,
        "order_violations_in_sequence": in_sequence,
        "order_examples": examples,
        "records_by_verdict": dict(sorted(verdicts.items())),
        "sequence_gaps": sum(replay.gaps for replay in replays.values()),
        "unbatched_records": unbatched,
        "stored_only_in_batches_kafka_refuses": int(((raw_copies > 0) & (kafka_copies == 0)).sum()),
    }


def _out_of_sequence(
    messages: Any, key: Any, sequence: Any, producer: Any, epoch: Any, stamped: Any
) -> Any:
    """``messages`` (with a producer's stamp) out of produce order within their key when each
    producer id and epoch's are taken in the order of the sequence numbers they were stamped
    with (``stamped``), as Kafka keeps them: the ones behind a higher sequence of their key."""
    import numpy as np

    has = producer >= 0
    messages, producer, epoch, stamped = messages[has], producer[has], epoch[has], stamped[has]
    if not len(messages):
        return messages
    _, segment = np.unique(np.stack((producer, epoch)), axis=1, return_inverse=True)
    keys = key[messages].astype(np.int64)
    order = np.lexsort((stamped, keys, segment.ravel()))
    group = (segment.ravel()[order] << 16) | keys[order]
    composite = (group << 32) | sequence[messages[order]].astype(np.int64)
    highest = np.maximum.accumulate(composite)
    behind = composite < np.concatenate(([-1], highest[:-1]))
    return messages[order][behind]


def cluster_summary(batches: BatchLog, topic: str, pushed: Counter[str]) -> dict[str, Any]:
    """What the recorders saw of the producer's Produce batches: attempts, answers by error
    code, those never answered, producer ids and epochs; the errors pushed by the plan."""
    from producerkit.testing.kafka_cluster import ERROR_CODES

    names = {code: name for name, code in ERROR_CODES.items()}
    answers: Counter[str] = Counter()
    epochs: set[tuple[int, int]] = set()
    attempts = 0
    for batch in batches.produced(topic):
        attempts += 1
        epochs.add((batch.producer_id, batch.epoch))
        if not batch.answered:
            answers["never answered"] += 1
        else:
            code = batch.error_code
            answers[names.get(code, str(code)) if code else "NONE"] += 1
    return {
        "produce_batches": attempts,
        "produce_answers": dict(sorted(answers.items())),
        "producer_ids_epochs": sorted(epochs),
        "errors_pushed": dict(sorted(pushed.items())),
        "unreadable_frames": batches.unreadable,
    }
