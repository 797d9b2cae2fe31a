"""Shipping sealed batches to their leaders, and settling each from the broker's answer.

On the fast path producerkit writes its own Produce requests, one per leader carrying one batch
per partition, on aiokafka's connections (``_aiokafka_compat.ProduceWire``), and acks every
record of a batch from the partition's result: offset ``base_offset + index``. On the public
path, and for the idempotent producer, each batch goes through aiokafka's ``send_batch()``.

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
ends; see ``_aiokafka_compat.ProduceWire``), and a batch written only once its connection opens
drops the records that failed meanwhile, reported as never sent.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Coroutine
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors

from producerkit._record import Record
from producerkit.backends.base import Reports
from producerkit.backends.kafka import _aiokafka_compat
from producerkit.backends.kafka.accumulator import Accumulator, Batch, PartitionQueue
from producerkit.backends.kafka.errors import translate
from producerkit.errors import DeliveryError, ProducerkitError

logger = logging.getLogger("producerkit.kafka")

_monotonic = time.monotonic


class Sender:
    """Ships what the accumulator sealed: at most ``max_batches_in_flight`` batches per
    partition in requests at once."""

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
        self._producer = producer
        self._client = producer.client
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
        self._loop = asyncio.get_running_loop()
        self.closing = False

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

    def ship_all(self) -> None:
        """Send the next batch of every partition that has one and room in flight
        (``max_batches_in_flight``), in one request per leader."""
        self._ship_soon = self._gathering.ship_due = False
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if self.closing:
            return
        by_leader: dict[int, list[Batch]] = {}
        for queue in self._accumulator.all_queues():
            # One batch per partition per request: a request may name a partition once.
            if (
                queue.in_flight < self.max_batches_in_flight
                and not queue.backoff
                and (queue.records or queue.full)
            ):
                self._ship_next(queue, by_leader)
        for leader, batches in by_leader.items():
            self._ship_to(leader, batches)

    def _ship_next(self, queue: PartitionQueue, by_leader: dict[int, list[Batch]]) -> None:
        accumulator = self._accumulator
        while True:
            if not queue.full:
                accumulator.seal(queue)
                if not queue.full:
                    return  # nothing live to send (or the encoder failed these records)
            if queue.full[0].compressing:
                return  # its turn comes when it is compressed (the accumulator's batch_ready)
            batch = queue.full.popleft()
            if accumulator.still_live(batch):  # its records that failed meanwhile are dropped
                break
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
        by_leader.setdefault(leader, []).append(batch)

    def _ship_to(self, leader: int, batches: list[Batch]) -> None:
        assert self.wire is not None
        try:
            conn = self.wire.ready_connection(leader)
        except Exception as exc:
            self._retry_or_fail_all(batches, exc)
            return
        if conn is not None:
            self._write_request(conn, batches)
        else:
            self.connecting.update(batches)
            self._spawn(self._connect_then_write(leader, batches))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect_then_write(self, leader: int, batches: list[Batch]) -> None:
        """Open the connection to ``leader``, then write what is still live of ``batches``:
        records that failed while it opened (their deadline passed, say, reported as never
        sent) are not written."""
        assert self.wire is not None
        try:
            conn = await self.wire.connect(leader)
        except Exception as exc:  # None if it cannot connect (aiokafka logs why); else this
            self.connecting.difference_update(batches)
            self._retry_or_fail_all(batches, exc)
            return
        self.connecting.difference_update(batches)
        if conn is None or self.closing:
            error = kafka_errors.NodeNotReadyError(f"cannot connect to broker node {leader}")
            self._retry_or_fail_all(batches, error)
            return
        live = []
        for batch in batches:
            if self._accumulator.still_live(batch):
                live.append(batch)
            else:  # every record of it failed meanwhile
                batch.queue.in_flight -= 1
        if live:
            self._write_request(conn, live)
        else:
            self.schedule_ship()

    def _write_request(self, conn: Any, batches: list[Batch]) -> None:
        """One Produce request carrying ``batches``, written on ``conn`` by the fast path."""
        assert self.wire is not None
        try:
            response = self.wire.write(
                conn, [(batch.queue.topic, batch.queue.partition, batch.data) for batch in batches]
            )
        except Exception as exc:  # nothing was written: each batch retries or fails with it
            self._retry_or_fail_all(batches, exc)
            return
        for batch in batches:
            batch.written = True
        if response is None:  # acks=0: no response will come, written is all there is
            for batch in batches:
                self._acked(batch, None)
            return
        response.add_done_callback(functools.partial(self._request_done, batches))

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
        else:
            broker_error = kafka_errors.for_code(code)()
            if broker_error.invalid_metadata:
                self._client.force_metadata_update()
            self._retry_or_fail(batch, broker_error)

    def _acked(self, batch: Batch, offset: int | None, stored_at: int | None = None) -> None:
        batch.queue.in_flight -= 1
        self.reports.acked_run(batch.records, offset, stored_at)

    def _retry_or_fail_all(self, batches: list[Batch], error: BaseException) -> None:
        for batch in batches:
            self._retry_or_fail(batch, error)

    def _retry_or_fail(self, batch: Batch, error: BaseException) -> None:
        """Retry a retriable error after the backoff while the batch has time; else fail it."""
        queue = batch.queue
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
