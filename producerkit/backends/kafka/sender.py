"""Shipping sealed batches to their leaders, and settling each from the broker's answer.

On the fast path producerkit writes its own Produce requests, one per leader carrying one batch
per partition, on aiokafka's connections (``_aiokafka_compat.ProduceWire``), and acks every
record of a batch from the partition's result: offset ``base_offset + index``; the idempotent
producer's batches too, each stamped with its producer id and sequence (see below). On the
public path each batch goes through aiokafka's ``send_batch()``.

Batching needs no linger: a partition's batch stays open while its previous batch is with the
broker (one in flight per partition by default, which also keeps per-key order), so batches grow
exactly as large as the broker's pace requires. With ``linger_ms=0`` (the default, for latency)
an idle partition ships its batch at the end of the current event-loop iteration. Retriable
errors (connection lost, leader moved, request timed out) retry the batch after
``retry_backoff_ms`` until ``request_timeout_ms`` after it was sealed, as aiokafka does; then its
records fail. Every batch ends acked, retried or failed: an exception anywhere in these
callbacks fails the batches it concerns at once, with the exception as the cause.

Order per key holds under faults too, for what is stored, failed messages included: a request
unanswered past its timeout keeps its partition's turn until it is answered (or its connection
ends; see ``_aiokafka_compat.ProduceWire``), a batch written only once its connection opens
drops the records that failed meanwhile, reported as never sent, and a batch going out again
goes alone, once every earlier request of its partition was answered, as does a partition's
first batch to a new leader.

The idempotent producer (``producer_id`` set once the broker granted one, see ``idempotence``)
stamps each batch with its producer id, epoch and the partition's next sequence when a request
first carries it, and keeps those through its retries, so the broker stores it once and in
order. A batch stamped keeps its records whole (those failed meanwhile were reported possibly
stored): its sequence range must not change. The broker's sequence errors are the sender's to
resolve: OUT_OF_ORDER_SEQUENCE_NUMBER on a batch waiting for an earlier one retries it (a
transaction's batch too: with several in flight, one refused retriably or lost on the wire
makes the broker refuse those after it); on the partition's next batch (the broker lost what
came before, or never had a batch given up on), UNKNOWN_PRODUCER_ID, and an epoch the broker
no longer takes, the sender stops sending, waits until every request was answered, has the
epoch bumped (KIP-360, or a new producer id) and sends every batch not yet acked again,
numbered from 0, as librdkafka does; but a batch whose request went unanswered may be stored,
and under a new epoch the broker could not tell it from a new one: its records fail then,
possibly stored (BrokerUnavailable). A transactional producer bumps no epoch: those errors
fail its transaction, which aborts.
DUPLICATE_SEQUENCE_NUMBER means the broker stored the batch before: its records are acked,
without an offset (the broker gives none).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors

from producerkit._record import Record
from producerkit.backends.base import Reports
from producerkit.backends.kafka import _aiokafka_compat, idempotence
from producerkit.backends.kafka.accumulator import Accumulator, Batch, PartitionQueue
from producerkit.backends.kafka.errors import translate
from producerkit.errors import BrokerUnavailable, DeliveryError, ProducerkitError

logger = logging.getLogger("producerkit.kafka")

_monotonic = time.monotonic

#: Produce error codes the idempotent producer resolves itself (see the module docstring).
_OUT_OF_ORDER_SEQUENCE: Final = 45
_DUPLICATE_SEQUENCE: Final = 46
_INVALID_PRODUCER_EPOCH: Final = 47
_UNKNOWN_PRODUCER_ID: Final = 59
_PRODUCER_FENCED: Final = 90
#: Produce error codes for a batch larger than the topic (``max.message.bytes``) or the log
#: segment (``segment.bytes``) takes.
_MESSAGE_TOO_LARGE: Final = 10
_RECORD_LIST_TOO_LARGE: Final = 18
#: A transaction's Produce, refused while the coordinator still ends the previous transaction
#: (transactions v2: the broker adds the partition itself, and waits only briefly): retried.
_CONCURRENT_TRANSACTIONS: Final = 51
_SEQUENCE_CODES: Final = frozenset(
    {
        _OUT_OF_ORDER_SEQUENCE,
        _DUPLICATE_SEQUENCE,
        _INVALID_PRODUCER_EPOCH,
        _UNKNOWN_PRODUCER_ID,
        _PRODUCER_FENCED,
    }
)


class Sender:
    """Ships what the accumulator sealed: at most ``max_batches_in_flight`` batches per
    partition in requests at once, of which one at most not full (:meth:`ship_all`)."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        accumulator: Accumulator,
        reports: Reports,
        *,
        linger: float,
        acks: int,
        max_batches_in_flight: int,
        retry_backoff: float,
    ) -> None:
        self.use_producer(producer)
        self._accumulator = accumulator
        self._gathering = accumulator.gathering
        self.reports = reports
        self.linger = linger
        self._acks = acks
        self.max_batches_in_flight = max_batches_in_flight
        self._retry_backoff = retry_backoff
        #: The fast path's wire once connected; None while on aiokafka's send_batch().
        self.wire: _aiokafka_compat.ProduceWire | None = None
        self._ship_soon = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Future[None]] = set()
        #: Batches taken for a request that waits for its connection to open.
        self.connecting: set[Batch] = set()
        #: The requests (their batches) waiting for the connection to a leader to open.
        self._waiting_for_connection: dict[int, list[list[Batch]]] = {}
        self._loop = asyncio.get_running_loop()
        self.closing = False
        #: The idempotent producer's id and epoch; None while not idempotent.
        self.producer_id: idempotence.ProducerId | None = None
        #: Asks the broker for a new epoch of the given producer id (or a new id); None for a
        #: transactional producer, whose sequence errors fail the transaction.
        self.renew_producer_id: (
            Callable[[idempotence.ProducerId], Awaitable[idempotence.ProducerId]] | None
        ) = None
        #: Batches are flagged transactional (the connection's transactional id is open).
        self.transactional = False
        #: The epoch must be bumped before anything more is sent; ``_bumping`` while it is.
        self._bump_due = False
        self._bumping = False

    def use_producer(self, producer: AIOKafkaProducer) -> None:
        """Ship through ``producer`` (its client's metadata and connections) from now on."""
        self._producer = producer
        self._client = producer.client

    def schedule_ship(self, delay: float = 0.0) -> None:
        """Ship at the end of this loop iteration, or after ``delay`` (the linger) if nothing is
        due sooner. A full batch or a freed slot ships now even while a linger runs."""
        if self.closing:
            return
        if not delay:
            if not self._ship_soon:
                self._ship_soon = self._gathering.ship_due = True
                self._loop.call_soon(self.ship_all)
        elif not self._gathering.ship_due:
            self._gathering.ship_due = True
            self._linger_timer = self._loop.call_later(delay, self.ship_all)

    def ship_all(self, *, now: bool = False) -> None:
        """Send the next batch of every partition that has one and room in flight
        (``max_batches_in_flight``), in one request per leader. A partition with a request in
        flight sends only full batches until its answers come (or ``now``: a flush): its open
        records gather meanwhile into one batch, not a request each, which a broker answering
        one connection's requests in turn would queue. With a linger, a partition's
        open records wait until the first of them is ``linger`` old (or a batch is full, or
        ``now``), as librdkafka's and the Java client's ``linger.ms`` do."""
        self._ship_soon = self._gathering.ship_due = False
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if self.closing:
            return
        if self._bump_due:
            self._start_bump_when_drained()
            return
        linger = 0.0 if now else self.linger
        lingering_since: float | None = None
        started = _monotonic() if linger else 0.0
        by_leader: dict[int, list[Batch]] = {}
        for queue in self._accumulator.all_queues():
            # One batch per partition per request: a request may name a partition once.
            if (
                queue.in_flight < self.max_batches_in_flight
                and not queue.backoff
                and (queue.records or queue.full)
            ):
                if queue.in_flight and not queue.full and not now:
                    continue  # open records gather until the answers come (they ship then)
                if linger and not queue.full and started - queue.opened_at < linger:
                    if lingering_since is None or queue.opened_at < lingering_since:
                        lingering_since = queue.opened_at
                    continue
                self._ship_next(queue, by_leader)
        for leader, batches in by_leader.items():
            self._ship_to(leader, batches)
        if lingering_since is not None:
            self.schedule_ship(lingering_since + linger - started)

    def _ship_next(self, queue: PartitionQueue, by_leader: dict[int, list[Batch]]) -> None:
        if queue.in_flight and self._waits_for_answers(queue):
            return
        batch = self._next_live_batch(queue)
        if batch is None:
            return
        queue.in_flight += 1
        if not batch.sent:
            batch.sent = True
            try:
                self.reports.batch_sent(queue.topic, queue.partition)
            except Exception:  # a keyless partitioner's trouble is not this batch's
                logger.exception("error reporting a sent batch of %s", queue.key)
        if self.wire is None:
            self._spawn(self._send_through_aiokafka(batch))
            return
        try:
            leader = self._client.cluster.leader_for_partition(queue.key)
        except Exception as exc:
            self._retry_or_fail(batch, exc)
            return
        if leader is None or leader < 0:
            self._client.force_metadata_update()
            self._retry_or_fail(batch, kafka_errors.LeaderNotAvailableError())
            return
        queue.leader = leader
        by_leader.setdefault(leader, []).append(batch)

    def _waits_for_answers(self, queue: PartitionQueue) -> bool:
        """Whether a partition with requests in flight must wait for their answers first."""
        if queue.full and queue.full[0].written:
            return True  # a batch goes out again alone, once its partition's requests were answered
        # The leader moved: the old one's answers come first (they may be errors).
        return self.wire is not None and self._leader_of(queue) != queue.leader

    def _next_live_batch(self, queue: PartitionQueue) -> Batch | None:
        """The partition's next batch to send, sealed now if none is; None while there is
        nothing live to send or its next batch is still being compressed."""
        accumulator = self._accumulator
        while True:
            if not queue.full:
                accumulator.seal(queue)
                if not queue.full:
                    return None  # nothing live to send (or the encoder failed these records)
            if queue.full[0].compressing:
                return None  # its turn comes when it is compressed (the accumulator's batch_ready)
            batch = queue.full.popleft()
            if accumulator.still_live(batch):  # its records that failed meanwhile are dropped
                return batch

    def _leader_of(self, queue: PartitionQueue) -> int | None:
        try:
            leader: int | None = self._client.cluster.leader_for_partition(queue.key)
        except Exception:  # asked again, with its error, when the partition ships next
            return None
        return leader

    def _ship_to(self, leader: int, batches: list[Batch]) -> None:
        assert self.wire is not None
        try:
            conn = self.wire.ready_connection(leader)
        except Exception as exc:
            self._retry_or_fail_all(batches, exc)
            return
        self.connecting.update(batches)
        waiting = self._waiting_for_connection.get(leader)
        if waiting is not None:  # behind the requests already waiting for it, in order
            waiting.append(batches)
        elif conn is not None:
            self.connecting.difference_update(batches)
            self._write_request(conn, batches)
        else:
            self._waiting_for_connection[leader] = [batches]
            self._spawn(self._connect_then_write(leader))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect_then_write(self, leader: int) -> None:
        """Open the connection to ``leader``, then write, in the order they were shipped,
        the requests waiting for it (``_waiting_for_connection``), each with what is still
        live of its batches: records that failed while it opened (their deadline passed, say,
        reported as never sent) are not written."""
        assert self.wire is not None
        conn: Any = None
        error: BaseException = kafka_errors.NodeNotReadyError(
            f"cannot connect to broker node {leader}"
        )
        try:
            conn = await self.wire.connect(leader)
        except Exception as exc:  # None if it cannot connect (aiokafka logs why); else this
            error = exc
        requests = self._waiting_for_connection.pop(leader, [])
        for batches in requests:
            self.connecting.difference_update(batches)
            if conn is None or self.closing:
                self._retry_or_fail_all(batches, error)
                continue
            live = []
            for batch in batches:
                if self._accumulator.still_live(batch):
                    live.append(batch)
                else:  # every record of it failed meanwhile
                    batch.queue.in_flight -= 1
            if live:
                self._write_request(conn, live)
        self.schedule_ship()

    def _write_request(self, conn: Any, batches: list[Batch]) -> None:
        """One Produce request carrying ``batches``, written on ``conn`` by the fast path."""
        assert self.wire is not None
        stamped = self._stamp(batches) if self.producer_id is not None else ()
        try:
            response = self.wire.write(
                conn,
                [
                    (batch.queue.topic, batch.queue.partition, batch.head, batch.data)
                    for batch in batches
                ],
            )
        except Exception as exc:  # nothing was written: each batch retries or fails with it
            for batch in reversed(stamped):  # their sequences go to the next request
                batch.queue.next_sequence = batch.sequence  # type: ignore[assignment]
                batch.sequence = batch.head = None
            self._retry_or_fail_all(batches, exc)
            return
        for batch in batches:
            batch.written = True
        if response is None:  # acks=0: no response will come, written is all there is
            for batch in batches:
                self._acked(batch, None)
            return
        response.add_done_callback(functools.partial(self._request_done, batches))

    def restart_sequences(self, producer_id: idempotence.ProducerId) -> None:
        """Number every partition from 0 under ``producer_id``: a new epoch (bumped after a
        sequence error, by a transaction's InitProducerId, or by transactions v2's EndTxn) or a
        new producer id, which the broker numbers anew."""
        self.producer_id = producer_id
        for queue in self._accumulator.all_queues():
            queue.next_sequence = queue.acked_sequence = 0

    def _stamp(self, batches: list[Batch]) -> list[Batch]:
        """Give each of ``batches`` not yet numbered its partition's next sequence and stamp
        it with the producer id; return those numbered now (each its partition's newest)."""
        producer = self.producer_id
        assert producer is not None
        stamped = []
        for batch in batches:
            if batch.sequence is None:
                queue = batch.queue
                batch.sequence = queue.next_sequence
                queue.next_sequence = idempotence.next_sequence(
                    queue.next_sequence, len(batch.records)
                )
                batch.head = idempotence.stamp(
                    batch.data, producer, batch.sequence, transactional=self.transactional
                )
                stamped.append(batch)
        return stamped

    def _request_done(self, batches: list[Batch], response: asyncio.Future[Any]) -> None:
        error: BaseException | None
        if response.cancelled():
            error = kafka_errors.KafkaConnectionError("request cancelled")
        else:
            error = response.exception()
        results: dict[tuple[str, int], tuple[int, int, int]] = {}
        if error is None:
            try:
                results = _aiokafka_compat.partition_results(response.result())
            except Exception as exc:  # a response not shaped as expected
                error = exc
        if error is not None:
            if getattr(error, "invalid_metadata", False):
                self._client.force_metadata_update()
            for batch in batches:  # written, and no answer came: its records may be stored
                batch.unanswered = True
            self._retry_or_fail_all(batches, error)
        else:
            for batch in batches:
                try:
                    self._settle(batch, results)
                except Exception as exc:  # reported ones stay reported; the rest fail with it
                    logger.exception("error settling a batch of %s", batch.queue.key)
                    self.fail(batch.records, exc)
        self.schedule_ship()

    def _settle(self, batch: Batch, results: dict[tuple[str, int], tuple[int, int, int]]) -> None:
        queue = batch.queue
        code, offset, log_append_time = results.get((queue.topic, queue.partition), (None, 0, -1))
        if code == 0:
            self._acked(batch, offset, None if log_append_time == -1 else log_append_time)
        elif code is None:
            batch.unanswered = True
            self._retry_or_fail(batch, DeliveryError(f"the broker did not answer for {queue.key}"))
        elif batch.sequence is not None and code in _SEQUENCE_CODES:
            self._settle_sequence_error(batch, code)
        elif code in (_MESSAGE_TOO_LARGE, _RECORD_LIST_TOO_LARGE):
            self._retry_or_fail(batch, self._too_large(batch, code))
        else:
            broker_error = kafka_errors.for_code(code)()
            if broker_error.invalid_metadata:
                self._client.force_metadata_update()
            busy = code == _CONCURRENT_TRANSACTIONS and self.transactional
            self._retry_or_fail(batch, broker_error, retriable=True if busy else None)

    def _too_large(self, batch: Batch, code: int) -> kafka_errors.KafkaError:
        """The broker's refusal of ``batch`` as too large, saying which limit refused it and,
        for a batch of several messages, which setting keeps batches under it."""
        count = len(batch.records)
        data = batch.data
        size = f", {len(data):,} bytes" if isinstance(data, bytes | bytearray) else ""
        limit = (
            "the topic's max.message.bytes (or the broker's message.max.bytes)"
            if code == _MESSAGE_TOO_LARGE
            else "the topic's log segment (segment.bytes)"
        )
        text = (
            f"the broker refused a batch of {count} message{'s' if count > 1 else ''}{size} for "
            f"{batch.queue.key} as larger than {limit}"
        )
        if count > 1:
            text += (
                f": set max_batch_size (now {self._accumulator.max_batch_size:,} bytes) below "
                "that limit; producerkit does not split a refused batch"
            )
        error: kafka_errors.KafkaError = kafka_errors.for_code(code)(text)
        return error

    def _settle_sequence_error(self, batch: Batch, code: int) -> None:
        """The broker's answer about the idempotent producer's numbering (see the module
        docstring)."""
        queue = batch.queue
        if code == _DUPLICATE_SEQUENCE:
            self._acked(batch, None)
            return
        error = kafka_errors.for_code(code)()
        if self.renew_producer_id is None:  # a transaction's: it aborts, and numbers anew ...
            # ... unless the broker only had not stored an earlier batch, which goes out again
            # first (refused retriably, or its request lost): then this one follows it
            waiting = code == _OUT_OF_ORDER_SEQUENCE and self._earlier_unsettled(batch)
            self._retry_or_fail(batch, error, retriable=waiting)
            return
        if code != _OUT_OF_ORDER_SEQUENCE or not self._earlier_unsettled(batch):
            if not self._bump_due:
                logger.warning(
                    "%s: %s on %s; bumping the producer epoch and sending every batch not yet "
                    "acked again",
                    self.producer_id,
                    type(error).__name__,
                    queue.key,
                )
            self._bump_due = True
        self._retry_or_fail(batch, error, retriable=True)

    @staticmethod
    def _earlier_unsettled(batch: Batch) -> bool:
        """Whether a batch of ``batch``'s partition written before it may still be stored
        first: one waiting to go out again, or another request in flight."""
        queue = batch.queue
        if batch.sequence == queue.acked_sequence:
            return False  # the broker has every batch before it
        return queue.in_flight > 1 or any(
            waiting.written and waiting.number < batch.number for waiting in queue.full
        )

    def _start_bump_when_drained(self) -> None:
        """Bump the epoch once no request is in flight (new batches wait meanwhile)."""
        if self._bumping or any(queue.in_flight for queue in self._accumulator.all_queues()):
            return
        self._bumping = True
        self._spawn(self._bump_epoch())

    async def _bump_epoch(self) -> None:
        assert self.producer_id is not None and self.renew_producer_id is not None
        try:
            renewed = await self.renew_producer_id(self.producer_id)
        except Exception as exc:  # the records' deadlines bound the retries
            logger.warning("bumping the producer epoch failed (%s); retrying", exc)
            self._bumping = False
            self._loop.call_later(self._retry_backoff, self.schedule_ship)
            return
        self.restart_sequences(renewed)
        error = BrokerUnavailable(
            "this message's request went unanswered, and the producer epoch was bumped since: "
            "it may be stored, and sending it again under the new epoch could store it twice"
        )
        for queue in self._accumulator.all_queues():
            for waiting in [batch for batch in queue.full if batch.unanswered]:
                queue.full.remove(waiting)
                self.fail(waiting.records, error)
            for waiting in queue.full:
                waiting.sequence = waiting.head = None
        self._bump_due = self._bumping = False
        self.schedule_ship()

    def _acked(self, batch: Batch, offset: int | None, stored_at: int | None = None) -> None:
        queue = batch.queue
        queue.in_flight -= 1
        if batch.sequence is not None:
            queue.acked_sequence = idempotence.next_sequence(batch.sequence, len(batch.records))
        self.reports.acked_run(batch.records, offset, stored_at)

    def _retry_or_fail_all(self, batches: list[Batch], error: BaseException) -> None:
        for batch in batches:
            self._retry_or_fail(batch, error)

    def _retry_or_fail(
        self, batch: Batch, error: BaseException, *, retriable: bool | None = None
    ) -> None:
        """Retry a retriable error (``retriable``, else the error's own word) after the backoff
        while the batch has time; else fail it."""
        queue = batch.queue
        if retriable is None:
            retriable = getattr(error, "retriable", False)
        if retriable and not self.closing and _monotonic() < batch.expires:
            queue.requeue(batch)
            queue.in_flight -= 1
            if not queue.backoff:
                queue.backoff = True
                self._loop.call_later(self._retry_backoff, self._retry_ready, queue)
            return
        queue.in_flight -= 1
        self.fail(batch.records, error, possibly_stored=batch.unanswered)

    def _retry_ready(self, queue: PartitionQueue) -> None:
        queue.backoff = False
        self.schedule_ship()

    async def _send_through_aiokafka(self, batch: Batch) -> None:
        queue = batch.queue
        batch.written = batch.unanswered = True  # aiokafka owns it from here, retries included
        try:
            future = await self._producer.send_batch(
                batch.data, queue.topic, partition=queue.partition
            )
            result = await future
        except Exception as exc:
            queue.in_flight -= 1
            self.fail(batch.records, exc)
        else:
            if self._acks == 0:  # no response, no offset: written is all there is
                self._acked(batch, None)
            elif result is None or result.offset is None or result.offset < 0:
                queue.in_flight -= 1
                self.fail(
                    batch.records,
                    DeliveryError(
                        f"aiokafka reported {queue.key} sent but gave no offset ({result!r}): "
                        "not counted as delivered"
                    ),
                )
            else:  # timestamp_type 1: the topic keeps the broker's LogAppendTime
                log_append = result.timestamp if result.timestamp_type == 1 else None
                self._acked(batch, result.offset, log_append)
        self.schedule_ship()

    def fail(
        self, records: list[Record], exc: BaseException, *, possibly_stored: bool = True
    ) -> None:
        """Fail ``records`` with the translation of ``exc`` (kept as its cause);
        ``possibly_stored``: whether the broker may have stored them."""
        if not isinstance(exc, kafka_errors.KafkaError | ProducerkitError | OSError):
            # Not the broker's or the network's doing: producerkit's or aiokafka's. Say so once
            # per batch, with the traceback; the records fail with it as their cause.
            logger.error("%d message(s) failed on an unexpected error", len(records), exc_info=exc)
        error = translate(exc)
        failed = self.reports.failed
        for record in records:
            failed(record, error, possibly_stored)

    def unwritten_records(self) -> list[Record]:
        """The records of batches waiting for their connection that no request carried
        before (a retry's may be stored)."""
        return [
            record for batch in self.connecting if not batch.written for record in batch.records
        ]

    def stop(self) -> None:
        """Stop shipping: cancel the linger timer and the tasks still sending."""
        self.closing = True
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        for task in list(self._tasks):
            task.cancel()
