"""Records gathered per partition and sealed into record batches.

Instead of one ``send()`` (and one future) per message, records are appended to an open list per
partition; a full list is encoded as record batches in one call (``record_batch``: C where it
was built, else aiokafka's builder), or, on the public path, filled into aiokafka's own
``BatchBuilder``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Final

from aiokafka import TopicPartition

from producerkit._record import Record
from producerkit.backends.base import Reports
from producerkit.backends.kafka import _aiokafka_compat, wire
from producerkit.backends.kafka.record_batch import CompressedEncoder, Encoder

_monotonic = time.monotonic

#: Records gathered before the first seal measures their size (then it adapts to fill a batch).
INITIAL_BATCH_RECORDS: Final = 256


#: ``partition_runs(records)``: records grouped by (topic, partition), see ``wire``.
partition_runs: Callable[[list[Record]], list[list[Record]]] = wire.ACTIVE.partition_runs


class Batch:
    """A sealed record batch of one partition, with the records it carries in offset order.

    ``expires`` is aiokafka's delivery timeout: a retriable error retries the batch only until
    ``request_timeout_ms`` after it was sealed; the records' own deadlines are the window's.
    ``written``: a request carrying it was written to a connection; ``unanswered``: one such
    request ended without the broker's answer for it (its records may be stored).
    ``failed_seen``: the window's failure count when it was encoded (see
    :meth:`Accumulator.still_live`). ``data`` is None while its records section is being
    compressed on the encoder's thread (:attr:`compressing`): it keeps its place in the queue,
    and its partition sends nothing until it is done. ``sequence`` and ``head``: the idempotent
    producer's base sequence for it and its header stamped with it (``idempotence.stamp``), from
    when a request first carries it (None before, and again after the epoch is bumped).
    """

    __slots__ = (
        "data",
        "expires",
        "failed_seen",
        "head",
        "number",
        "queue",
        "records",
        "sent",
        "sequence",
        "unanswered",
        "written",
    )

    def __init__(
        self,
        queue: PartitionQueue,
        number: int,
        data: bytes | bytearray | Any,
        records: list[Record],
        expires: float,
        failed_seen: int,
    ) -> None:
        self.queue = queue
        self.number = number  # order within the partition: a retry goes back in its place
        self.data = data  # the encoded batch, or an aiokafka BatchBuilder (sent through aiokafka)
        self.records = records
        self.expires = expires
        self.failed_seen = failed_seen
        self.sent = False  # batch_sent was reported for it
        self.written = False
        self.unanswered = False
        self.sequence: int | None = None
        self.head: bytes | None = None

    @property
    def compressing(self) -> bool:
        return self.data is None


class PartitionQueue:
    """One partition: the open records being gathered, and sealed batches waiting their turn.

    ``in_flight`` counts this partition's batches in requests; ``backoff`` is set while a retry
    waits. Capping batches in flight lets the open list grow as large as the broker's pace
    requires, and with ``max_batches_in_flight=1`` keeps per-key order even across retries.
    ``next_sequence`` is the idempotent producer's sequence for the next batch written;
    ``acked_sequence`` the one after the last batch the broker acked (this epoch). ``leader``:
    the broker its last request went to (the fast path). ``opened_at``: with a linger, the
    ``time.monotonic()`` at which the first of the open records came.
    """

    __slots__ = (
        "acked_sequence",
        "backoff",
        "failed_seen",
        "full",
        "in_flight",
        "key",
        "leader",
        "next_sequence",
        "opened_at",
        "partition",
        "records",
        "sealed",
        "topic",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.key = TopicPartition(topic, partition)
        self.records: list[Record] = []
        self.full: deque[Batch] = deque()
        self.in_flight = 0
        self.backoff = False
        self.sealed = 0
        self.failed_seen = 0  # the window's failure count at the last seal
        self.next_sequence = self.acked_sequence = 0
        self.leader: int | None = None  # the broker its last request went to
        self.opened_at = 0.0  # with a linger: when the first of the open records came

    def requeue(self, batch: Batch) -> None:
        """Put a batch back for a retry, ahead of every batch sealed after it."""
        index = 0
        for index, waiting in enumerate(self.full):  # noqa: B007 - the index is the result
            if waiting.number > batch.number:
                break
        else:
            index = len(self.full)
        self.full.insert(index, batch)


class Gathering:
    """What a send reads besides the queue: whether a ship is due, and how many records fill a
    batch."""

    __slots__ = ("batch_records", "ship_due")

    def __init__(self) -> None:
        self.batch_records = INITIAL_BATCH_RECORDS
        self.ship_due = False  # a ship is due: soon, or when the linger timer fires


class Accumulator:
    """Every partition's queue, and the sealing of open records into batches.

    With a :class:`CompressedEncoder`, a large batch is compressed on the encoder's thread:
    when that ends, ``batch_ready()`` is called on the loop (the sender ships it); if it raised,
    the batch's records fail with the error as their cause, as never sent.
    """

    def __init__(
        self,
        *,
        queues: dict[str, dict[int, PartitionQueue]],
        encode: Encoder,
        max_batch_size: int,
        request_timeout: float,
        timeout: float,
        gathering: Gathering,
        fail: Callable[[list[Record], BaseException], None],
        reports: Reports,
    ) -> None:
        self.queues = queues
        self._reports = reports
        self.gathering = gathering
        #: ``encode_batch`` for uncompressed batches (set anew once the producer id is known).
        self.encode = encode
        self._max_batch_size = max_batch_size
        self._request_timeout = request_timeout
        self._timeout = timeout
        self._fail = fail
        #: Set on the public path: batches are aiokafka's
        #: BatchBuilders from ``new_builder``, filled directly when ``fast_fill``.
        self.new_builder: Callable[[], Any] | None = None
        self.fast_fill = False
        self._compressed_encoder = encode if isinstance(encode, CompressedEncoder) else None
        self.batch_ready: Callable[[], object] = lambda: None

    @property
    def max_batch_size(self) -> int:
        """The most bytes of records an uncompressed batch holds (``max_batch_size``)."""
        return self._max_batch_size

    def queue_of(self, record: Record) -> PartitionQueue:
        partitions = self.queues.get(record.topic)
        if partitions is None:
            partitions = self.queues[record.topic] = {}
        queue = partitions.get(record.partition)  # type: ignore[arg-type]
        if queue is None:
            queue = partitions[record.partition] = PartitionQueue(  # type: ignore[index]
                record.topic,
                record.partition,  # type: ignore[arg-type]
            )
        return queue

    def all_queues(self) -> list[PartitionQueue]:
        return [queue for partitions in self.queues.values() for queue in partitions.values()]

    def seal(self, queue: PartitionQueue, count: int | None = None) -> None:
        """Encode the partition's open records (the first ``count`` of them where given; the
        rest stay open) as batches of at most ``max_batch_size`` (those no longer in flight
        are dropped: they failed, and are never written). If the encoder raises, the records
        it could not seal fail with that error as their cause."""
        if count is None or count >= len(queue.records):
            records, queue.records = queue.records, []
        else:
            records, queue.records = queue.records[:count], queue.records[count:]
        failed_seen = self._reports.failed_count
        if failed_seen != queue.failed_seen:  # some record failed since the last seal
            pending = self._reports.pending
            records = [record for record in records if record.seq in pending]
            queue.failed_seen = failed_seen
        now = _monotonic()
        expires = now + self._request_timeout
        # The records' deadlines are monotonic() + timeout at produce time: this shift turns
        # them back into wall-clock CreateTimes.
        time_shift = time.time() - now - self._timeout
        start = 0
        try:
            while start < len(records):
                data, end, size = self._encode_from(records, start, time_shift, later=True)
                queue.sealed += 1
                whole = start == 0 and end == len(records)
                batch_records = records if whole else records[start:end]
                batch = Batch(queue, queue.sealed, data, batch_records, expires, failed_seen)
                if isinstance(data, Future):
                    batch.data = None
                    loop = asyncio.get_running_loop()
                    data.add_done_callback(
                        functools.partial(self._compressed_on_thread, loop, batch)
                    )
                queue.full.append(batch)
                # Gather as many records as fill a batch at the sizes seen last.
                self.gathering.batch_records = max(
                    1, (end - start) * self._max_batch_size // max(size, 1)
                )
                start = end
        except Exception as exc:
            self._fail(records[start:], exc)

    def still_live(self, batch: Batch) -> bool:
        """Whether ``batch`` may be written: its records that failed since it was encoded are
        dropped (re-encoding the rest); False if none is left. A batch numbered by the
        idempotent producer stays whole: it was written, and its sequence range is taken."""
        failed_count = self._reports.failed_count
        if batch.failed_seen == failed_count or batch.sequence is not None:
            return True
        pending = self._reports.pending
        live = [record for record in batch.records if record.seq in pending]
        batch.failed_seen = failed_count
        if len(live) == len(batch.records):
            return True
        if not live:
            return False
        time_shift = time.time() - _monotonic() - self._timeout
        try:
            data, end, _ = self._encode_from(live, 0, time_shift)
        except Exception as exc:
            self._fail(live, exc)
            return False
        if end < len(live):  # cannot happen: fewer records than fitted before
            self._fail(live[end:], RuntimeError("a re-encoded batch did not fit"))
            live = live[:end]
        batch.data, batch.records = data, live
        return True

    def _compressed_on_thread(
        self, loop: asyncio.AbstractEventLoop, batch: Batch, future: Future[bytes]
    ) -> None:
        # On the encoder's thread (or this one, if it is done already): back to the loop.
        with contextlib.suppress(RuntimeError):  # the loop is closed: the batch was stranded
            loop.call_soon_threadsafe(self._compressed, batch, future)

    def _compressed(self, batch: Batch, future: Future[bytes]) -> None:
        if future.cancelled():  # the encoder was closed, with the connection
            return
        error = future.exception()
        if error is None:
            batch.data = future.result()
        elif batch in batch.queue.full:  # not taken meanwhile (purged, stranded)
            batch.queue.full.remove(batch)
            self._fail(batch.records, error)
        self.batch_ready()

    def _encode_from(
        self, records: list[Record], start: int, time_shift: float, *, later: bool = False
    ) -> tuple[Any, int, int]:
        """One batch from ``records[start:]``: (data, where it stopped, its size in bytes).
        ``later``: a large compressed batch's data may be a future (see the class)."""
        if self.new_builder is None:
            if later and self._compressed_encoder is not None:
                return self._compressed_encoder.encode_later(
                    records, start, self._max_batch_size, time_shift
                )
            data, end = self.encode(records, start, self._max_batch_size, time_shift)
            return data, end, len(data)
        builder = self.new_builder()
        end = _aiokafka_compat.fill_builder(
            builder, records, start, time_shift, fast=self.fast_fill
        )
        return builder, end, builder.size()

    def take_unwritten(self) -> list[Record]:
        """Remove and return every record not yet written (open, or in a batch never sent);
        batches written before and waiting for a retry stay."""
        taken: list[Record] = []
        for queue in self.all_queues():
            taken += [
                record for batch in queue.full if not batch.written for record in batch.records
            ]
            taken += queue.records
            queue.full = deque(batch for batch in queue.full if batch.written)
            queue.records = []
        return taken

    def unwritten(self, seqs: set[int]) -> set[int]:
        """Those of ``seqs`` whose records are held here, not yet written."""
        found: set[int] = set()
        for queue in self.all_queues():
            for batch in queue.full:
                if not batch.written:
                    found.update(record.seq for record in batch.records if record.seq in seqs)
            found.update(record.seq for record in queue.records if record.seq in seqs)
        return found

    def strand(self) -> list[Record]:
        """Empty every queue (the connection closes); the records never written, for the
        caller to fail (the rest are failed as possibly stored by the producer)."""
        taken = self.take_unwritten()
        for queue in self.all_queues():
            queue.full.clear()
        return taken
