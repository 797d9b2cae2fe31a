"""What a ``read_committed`` consumer of Apache Kafka would be served, worked out from the
transactional traffic :class:`~chaos.judges.kafka_recorder.RecordingKafkaCluster` recorded in
front of librdkafka's mock cluster (this project's tests' ``kafka_cluster``).

librdkafka's mock cluster runs transactions at the protocol level (producer ids, epochs,
AddPartitionsToTxn, EndTxn, control records) but serves every record to every consumer: it
hides neither an open nor an aborted transaction's records from ``read_committed``, and a
transactional id initialized again fences nobody. So the cluster records, between each client
and each broker, the requests that decide what Kafka would serve (KIP-98), with their answers:

- every transactional Produce, per partition: transactional id, producer id, epoch, base
  sequence and record count (from the record batch's header), and the answer's error code and
  base offset (:class:`TransactionalProduce`);
- every EndTxn: transactional id, producer id, epoch, commit or abort, the answer's error code
  (:class:`TransactionEnd`);
- every InitProducerId with a transactional id: the producer id and epoch granted
  (:class:`ProducerInit`).

:meth:`TransactionLog.view` replays them in the order the requests reached the cluster, as
Kafka's transaction coordinator and partition leaders would have applied them:

- a producer's transactional batches belong to the transaction the producer's next successful
  EndTxn ends (same producer id): committed or aborted as that EndTxn says. An EndTxn answered
  with an error ends nothing;
- a successful InitProducerId for a transactional id aborts what that id's producers had open
  (Kafka's coordinator does so before granting the new epoch), and from then on that producer
  id and epoch is the transactional id's only one: a Produce or an EndTxn of the same
  transactional id with another producer id or epoch is one Kafka would have refused
  (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH). The mock takes them; the view counts such batches
  as ``fenced`` (never served) and such an EndTxn as ending nothing;
- a transactional batch of the transactional id's producer id under a higher epoch than the
  one granted follows an epoch bump the recorder did not read: EndTxn v5 (transactions v2,
  KIP-890) answers with the epoch of the producer's next transaction, and the recorder reads
  only an EndTxn answer's error code. From then on that epoch is the id's, and what the
  producer id still had open under the older one is aborted (an EndTxn v5 that was accepted
  ended it already; a bump without one, Kafka's, aborts it);
- a batch answered with an error was not stored; one the mock acked as a duplicate of a batch
  it had (error 0, base offset -1) was not stored again;
- a transaction neither committed nor aborted is open, and Kafka's last stable offset (LSO)
  stops a ``read_committed`` consumer at the first offset of the first open transaction of
  each partition: nothing from there on is served yet, committed and non-transactional
  records included.

So a ``read_committed`` consumer is served every non-transactional record and every record of
a committed transaction below its partition's LSO, and none of an aborted, fenced or open one.

What the view does not model: the transaction timeout (Kafka's coordinator aborts a
transaction open longer than ``transaction.timeout.ms``; here it stays open until an EndTxn or
an InitProducerId ends it); with transactions v2, a write under an epoch an EndTxn v5 ended
(Kafka refuses it: the view takes it into the producer id's open transaction, not knowing the
bump until the next epoch's first batch) and the new producer id EndTxn v5 grants where the
epoch would overflow (taken for another producer's, fenced); and requests that did not pass
the recorder. librdkafka's mock cluster finalizes no ``transaction.version``, so producerkit
speaks transactions v1 to it and none of the v2 cases arises there. A batch whose answer
the recorder never saw (its connection closed first) and whose retry, if any, was acked as a
duplicate may be in the log at offsets nobody told: if its transaction was not committed, the
view cannot say which records to hide and :meth:`TransactionLog.view` raises
:class:`TransactionViewError` rather than guess.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

from chaos.judges.kafka_wire import BatchHeader
from producerkit.errors import ProducerkitError

__all__ = [
    "BatchState",
    "ProducerInit",
    "TransactionEnd",
    "TransactionLog",
    "TransactionView",
    "TransactionViewError",
    "TransactionalProduce",
]

#: What became of one recorded transactional batch, in Kafka's terms:
#:
#: - ``committed``: its transaction committed; served below the LSO;
#: - ``aborted``: its transaction aborted (an EndTxn(abort), or the transactional id
#:   initialized again while it was open); never served;
#: - ``open``: no EndTxn ended it yet; not served, and its partition's LSO is at most its base
#:   offset;
#: - ``fenced``: written by a producer Kafka would have fenced (its transactional id was
#:   initialized again since); never served;
#: - ``not_stored``: answered with an error, or acked as a duplicate of a batch already
#:   stored: none of its records are in the log.
BatchState = Literal["committed", "aborted", "open", "fenced", "not_stored"]

_HIDDEN: Final = frozenset({"aborted", "open", "fenced"})


class TransactionViewError(ProducerkitError, RuntimeError):
    """The recorded traffic does not say which records a ``read_committed`` consumer would be
    served (see the module docstring)."""


@dataclass(frozen=True)
class TransactionalProduce:
    """One partition's batch of one transactional Produce request, and the answer.

    ``error_code`` and ``base_offset`` are None while the answer has not passed the recorder,
    and stay so if it never does (``answered`` False). An answer of error 0 and base offset -1
    is the mock acking a duplicate it did not store again.
    """

    transactional_id: str
    producer_id: int
    epoch: int
    topic: str
    partition: int
    base_sequence: int
    record_count: int
    transactional: bool
    error_code: int | None
    base_offset: int | None
    answered: bool


@dataclass(frozen=True)
class TransactionEnd:
    """One EndTxn request and the answer's error code (None: no answer seen)."""

    transactional_id: str
    producer_id: int
    epoch: int
    committed: bool
    error_code: int | None


@dataclass(frozen=True)
class ProducerInit:
    """One InitProducerId request with a transactional id, and what it was granted (the
    producer id and epoch are None until answered, and -1 when refused)."""

    transactional_id: str
    transaction_timeout_ms: int
    error_code: int | None
    producer_id: int | None
    epoch: int | None


class _Event:
    """A recorded request, filled in by its answer: mutable, recorder thread only."""

    __slots__ = ("answer", "seq")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.answer: tuple[int, ...] | None = None  # None: not answered (yet, or ever)


class _ProduceEvent(_Event):
    __slots__ = ("batch", "transactional_id")

    def __init__(self, seq: int, transactional_id: str, batch: BatchHeader) -> None:
        super().__init__(seq)
        self.transactional_id = transactional_id
        self.batch = batch

    def snapshot(self, answer: tuple[int, ...] | None) -> TransactionalProduce:
        batch = self.batch
        return TransactionalProduce(
            transactional_id=self.transactional_id,
            producer_id=batch.producer_id,
            epoch=batch.epoch,
            topic=batch.topic,
            partition=batch.partition,
            base_sequence=batch.base_sequence,
            record_count=batch.record_count,
            transactional=batch.transactional,
            error_code=None if answer is None else answer[0],
            base_offset=None if answer is None else answer[1],
            answered=answer is not None,
        )


class _EndEvent(_Event):
    __slots__ = ("committed", "epoch", "producer_id", "transactional_id")

    def __init__(
        self, seq: int, transactional_id: str, producer_id: int, epoch: int, committed: bool
    ) -> None:
        super().__init__(seq)
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.epoch = epoch
        self.committed = committed

    def snapshot(self) -> TransactionEnd:
        return TransactionEnd(
            transactional_id=self.transactional_id,
            producer_id=self.producer_id,
            epoch=self.epoch,
            committed=self.committed,
            error_code=None if self.answer is None else self.answer[0],
        )


class _InitEvent(_Event):
    __slots__ = ("timeout_ms", "transactional_id")

    def __init__(self, seq: int, transactional_id: str, timeout_ms: int) -> None:
        super().__init__(seq)
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms

    def snapshot(self) -> ProducerInit:
        answer = self.answer
        return ProducerInit(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self.timeout_ms,
            error_code=None if answer is None else answer[0],
            producer_id=None if answer is None else answer[1],
            epoch=None if answer is None else answer[2],
        )


class TransactionLog:
    """The transactional requests a :class:`~chaos.judges.kafka_recorder.RecordingKafkaCluster`
    recorded, in the order they reached it, and the answers (see the module docstring).

    The recorder's thread writes it; any thread may read it. It is never cleared (the
    cluster's ``reset()`` keeps topics and records, and their transactions with them).
    """

    def __init__(self) -> None:
        self._lock = threading.Condition(threading.Lock())
        self._events: list[_Event] = []
        self._seq = itertools.count()
        self._unanswered: dict[int, _Event] = {}
        self._unreadable_frames: list[tuple[int, int]] = []  # (api key, version)

    # ------------------------------------------------------------------ reading

    def produces(self, topic: str | None = None) -> list[TransactionalProduce]:
        """Every transactional Produce's batches (of ``topic``, or of every topic), in the
        order the requests reached the cluster."""
        with self._lock:
            events = [e for e in self._events if isinstance(e, _ProduceEvent)]
            return [e.snapshot(e.answer) for e in events if topic is None or e.batch.topic == topic]

    def ends(self, transactional_id: str | None = None) -> list[TransactionEnd]:
        """Every EndTxn (of ``transactional_id``, or of every one), in order."""
        with self._lock:
            return [
                e.snapshot()
                for e in self._events
                if isinstance(e, _EndEvent)
                and (transactional_id is None or e.transactional_id == transactional_id)
            ]

    def inits(self, transactional_id: str | None = None) -> list[ProducerInit]:
        """Every InitProducerId with a transactional id (that one, or any), in order."""
        with self._lock:
            return [
                e.snapshot()
                for e in self._events
                if isinstance(e, _InitEvent)
                and (transactional_id is None or e.transactional_id == transactional_id)
            ]

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every request recorded so far was answered
        (or its connection closed): True if they all were."""
        with self._lock:
            return _answered_below(self._lock, self._unanswered, next(self._seq), timeout)

    def view(self, topic: str) -> TransactionView:
        """What Kafka would serve a ``read_committed`` consumer of ``topic``, as far as the
        transactions go: each recorded batch's :data:`BatchState` and each partition's last
        stable offset. A :class:`TransactionViewError` when the records to hide cannot be
        told (see the module docstring)."""
        with self._lock:
            events = [(e, e.answer) for e in self._events]
            unreadable = list(self._unreadable_frames)
        if unreadable:
            raise TransactionViewError(
                f"the recorder could not read {len(unreadable)} frames (api key, version: "
                f"{sorted(set(unreadable))}), so the view would miss what they did"
            )
        return _replay(topic, events)

    # ------------------------------------------------------------------ recording (one thread)

    def _add(self, event: _Event) -> None:
        self._events.append(event)
        self._unanswered[event.seq] = event

    def _produce(self, transactional_id: str, batches: Iterable[BatchHeader]) -> list[_Event]:
        with self._lock:
            events: list[_Event] = []
            for batch in batches:
                event = _ProduceEvent(next(self._seq), transactional_id, batch)
                self._add(event)
                events.append(event)
            return events

    def _end(self, transactional_id: str, producer_id: int, epoch: int, committed: bool) -> _Event:
        with self._lock:
            event = _EndEvent(next(self._seq), transactional_id, producer_id, epoch, committed)
            self._add(event)
            return event

    def _init(self, transactional_id: str, timeout_ms: int) -> _Event:
        with self._lock:
            event = _InitEvent(next(self._seq), transactional_id, timeout_ms)
            self._add(event)
            return event

    def _unreadable(self, api_key: int, api_version: int) -> None:
        with self._lock:
            self._unreadable_frames.append((api_key, api_version))

    def _answer(self, answers: Iterable[tuple[_Event, tuple[int, ...] | None]]) -> None:
        """Fill in answers (None: the connection closed without one)."""
        with self._lock:
            for event, answer in answers:
                event.answer = answer
                self._unanswered.pop(event.seq, None)
            self._lock.notify_all()


@dataclass(frozen=True)
class TransactionView:
    """What Kafka would serve a ``read_committed`` consumer of one topic (see the module
    docstring): every recorded batch of the topic with its :data:`BatchState`, and
    ``last_stable_offsets``, partition -> the first offset of its first open transaction
    (only partitions with one open: elsewhere every record is stable)."""

    topic: str
    batches: tuple[tuple[TransactionalProduce, BatchState], ...]
    last_stable_offsets: dict[int, int]
    #: partition -> (starts, ends) of the hidden batches' offsets, sorted
    _hidden: dict[int, tuple[list[int], list[int]]] = field(repr=False)

    def serves(self, partition: int, offset: int) -> bool:
        """Whether a ``read_committed`` consumer is served the record at ``offset`` of
        ``partition`` (if the log has one there)."""
        stable = self.last_stable_offsets.get(partition)
        if stable is not None and offset >= stable:
            return False
        ranges = self._hidden.get(partition)
        if ranges is None:
            return True
        starts, ends = ranges
        index = bisect.bisect_right(starts, offset) - 1
        return index < 0 or offset >= ends[index]


def _replay(topic: str, events: list[tuple[_Event, tuple[int, ...] | None]]) -> TransactionView:
    """Apply the recorded requests in order, as Kafka would have (see the module docstring)."""
    replay = _Replay(_placed(topic, events))
    for event, answer in events:
        if isinstance(event, _InitEvent):
            replay.init(event, answer)
        elif isinstance(event, _EndEvent):
            replay.end(event, answer)
        elif isinstance(event, _ProduceEvent) and event.batch.topic == topic:
            replay.produce(event, answer)
    return _view(topic, replay.batches, replay.states)


def _placed(
    topic: str, events: list[tuple[_Event, tuple[int, ...] | None]]
) -> dict[tuple[int, int, int, int], int]:
    """The stored attempt of each batch of ``topic``: (producer id, epoch, partition, base
    sequence) -> its base offset. An attempt whose answer was lost is not stored if a retry was
    (a retry of a stored batch is acked as a duplicate and not stored again), else maybe
    stored."""
    placed: dict[tuple[int, int, int, int], int] = {}
    for event, answer in events:
        if (
            isinstance(event, _ProduceEvent)
            and event.batch.topic == topic
            and answer is not None
            and answer[0] == 0
            and answer[1] >= 0
        ):
            placed[_key(event.batch)] = answer[1]
    return placed


class _Replay:
    """The transactional state of one topic's batches as the recorded requests unfold."""

    def __init__(self, placed: dict[tuple[int, int, int, int], int]) -> None:
        self._placed = placed
        self._current: dict[str, tuple[int, int]] = {}  # transactional id -> producer id, epoch
        self._bound: dict[str, set[int]] = {}  # transactional id -> producer ids that wrote
        self._open: dict[int, list[int]] = {}  # producer id -> indexes into batches
        self.batches: list[tuple[_ProduceEvent, tuple[int, ...] | None]] = []
        self.states: list[BatchState] = []

    def _finish(self, producer_id: int, state: BatchState) -> None:
        for index in self._open.pop(producer_id, ()):
            self.states[index] = state

    def init(self, event: _InitEvent, answer: tuple[int, ...] | None) -> None:
        """InitProducerId granted: what the id's earlier producers left open is aborted."""
        if answer is None or answer[0] != 0:
            return
        txn = event.transactional_id
        for producer_id in self._bound.get(txn, ()):
            self._finish(producer_id, "aborted")
        self._current[txn] = (answer[1], answer[2])
        self._bound.setdefault(txn, set()).add(answer[1])

    def end(self, event: _EndEvent, answer: tuple[int, ...] | None) -> None:
        """EndTxn accepted, by the id's current producer: its open batches end."""
        if answer is None or answer[0] != 0:
            return  # refused (or never answered): it ends nothing
        granted = self._current.get(event.transactional_id)
        if granted is not None and granted != (event.producer_id, event.epoch):
            return  # Kafka: PRODUCER_FENCED; the mock ended it
        self._finish(event.producer_id, "committed" if event.committed else "aborted")

    def produce(self, event: _ProduceEvent, answer: tuple[int, ...] | None) -> None:
        """A batch of the topic: stored or not, and open in its transaction where it is one."""
        batch = event.batch
        if answer is not None:
            stored = answer[0] == 0 and answer[1] >= 0
        else:
            stored = _key(batch) not in self._placed
        state: BatchState = "not_stored" if not stored else "committed"
        if stored and batch.transactional:
            txn = event.transactional_id
            granted = self._current.get(txn)
            if (
                granted is not None and granted[0] == batch.producer_id and batch.epoch > granted[1]
            ):  # a bump the recorder did not read (EndTxn v5's answer)
                self._finish(batch.producer_id, "aborted")
                granted = self._current[txn] = (batch.producer_id, batch.epoch)
            if granted is not None and granted != (batch.producer_id, batch.epoch):
                state = "fenced"  # Kafka: PRODUCER_FENCED, not written
            else:
                state = "open"
                self._open.setdefault(batch.producer_id, []).append(len(self.states))
                self._bound.setdefault(event.transactional_id, set()).add(batch.producer_id)
        self.batches.append((event, answer))
        self.states.append(state)


def _view(
    topic: str,
    batches: list[tuple[_ProduceEvent, tuple[int, ...] | None]],
    states: list[BatchState],
) -> TransactionView:
    """The view of ``topic``'s batches in their final states: what a read_committed reader is
    not served, and each partition's last stable offset."""
    recorded: list[tuple[TransactionalProduce, BatchState]] = []
    unplaced: list[tuple[TransactionalProduce, BatchState]] = []
    stable: dict[int, int] = {}
    hidden: dict[int, list[tuple[int, int]]] = {}
    for (event, answer), state in zip(batches, states, strict=True):
        snapshot = event.snapshot(answer)
        recorded.append((snapshot, state))
        if state not in _HIDDEN:
            continue
        if answer is None:
            unplaced.append((snapshot, state))
            continue
        partition, offset = snapshot.partition, answer[1]
        if state == "open":
            stable[partition] = min(offset, stable.get(partition, offset))
        hidden.setdefault(partition, []).append((offset, offset + snapshot.record_count))
    if unplaced:
        first, state = unplaced[0]
        raise TransactionViewError(
            f"{len(unplaced)} transactional batches of {topic!r} not committed may be in the "
            "log at offsets the recorder never saw (the Produce answer was lost, and no retry "
            "of it was stored), so which records to hide is unknown; the first, "
            f"{state}: {first}"
        )
    ranges: dict[int, tuple[list[int], list[int]]] = {}
    for partition, spans in hidden.items():
        spans.sort()
        ranges[partition] = ([start for start, _ in spans], [end for _, end in spans])
    return TransactionView(topic, tuple(recorded), stable, ranges)


def _answered_below(
    lock: threading.Condition, unanswered: Collection[int], last: int, timeout: float
) -> bool:
    """Holding ``lock``, wait up to ``timeout`` seconds (woken by its notifications) until no
    number below ``last`` is ``unanswered``: True if none is then."""
    deadline = time.monotonic() + timeout
    while unanswered and min(unanswered) < last:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        lock.wait(left)
    return True


def _key(batch: BatchHeader) -> tuple[int, int, int, int]:
    return (batch.producer_id, batch.epoch, batch.partition, batch.base_sequence)
