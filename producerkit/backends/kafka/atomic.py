"""Kafka atomic batches: the writer of ``Producer.atomic_batch()`` on ``kafka://``, one Kafka
transaction each, through a connection of its own.

The producer's first atomic batch opens a transactional connection beside its others
(``transactional_id`` option, else one made for this producer): its InitProducerId fences any
earlier producer of that id. One transaction is open per producer at a time; other batches wait
for it to end. A message is sent through the transactional connection once its topic was added
to the transaction (``add_to_transaction``: every partition of a topic at its first message). The
broker's acks are held: a message counts as acked only once the commit (``end_transaction``)
committed the whole batch; before it, the batch waits until every message was answered. An abort
ends the transaction at the coordinator where anything was sent in it.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import anyio

from producerkit._connections import close_connections
from producerkit.backends.base import AtomicParts, AtomicSide, AtomicWriter, AtomicWrites
from producerkit.backends.kafka.connection import KafkaConnection
from producerkit.backends.kafka.options import TRANSACTIONAL_OPTION
from producerkit.backends.kafka.prepared import PREPARED, PreparedTransaction
from producerkit.errors import AtomicBatchError, ProducerkitError

if TYPE_CHECKING:
    from producerkit._batch import Columns
    from producerkit._record import Message, Record
    from producerkit.backends.base import Reports

__all__ = ["KafkaAtomicWrites", "PreparedTransaction", "TransactionReports"]


class TransactionReports:
    """The Reports of the transactional connection: what it reports goes to the producer's
    own (the window), but the acks of an open transaction's messages are held for the commit,
    and each outcome is counted, so the batch knows when every message was answered."""

    def __init__(self, reports: Reports) -> None:
        self._reports = reports
        self.topic_changed = reports.topic_changed
        self.batch_sent = reports.batch_sent
        self._held: list[tuple[list[Record], int | None, int | None]] = []
        self._failures: list[tuple[Record, BaseException, bool]] = []
        self._answered = 0
        self._expected = 0
        self._all_answered = anyio.Event()

    @property
    def pending(self) -> Any:
        return self._reports.pending

    @property
    def failed_count(self) -> int:
        return self._reports.failed_count

    def begin(self) -> None:
        """A transaction opens: nothing held, nothing answered yet."""
        self._held, self._failures = [], []
        self._answered = self._expected = 0
        self._all_answered = anyio.Event()

    def expect(self, count: int) -> None:
        """``count`` more messages were sent in the open transaction (an event set when the
        earlier ones were all answered is set no more)."""
        self._expected += count
        if self._all_answered.is_set():
            self._all_answered = anyio.Event()

    async def all_answered(self) -> None:
        while self._answered < self._expected:
            await self._all_answered.wait()

    def _count(self, answered: int) -> None:
        self._answered += answered
        if self._answered >= self._expected:
            self._all_answered.set()

    def acked(self, record: Record, offset: int | None, duplicate: bool = False) -> None:
        self._held.append(([record], offset, None))
        self._count(1)

    def acked_run(
        self, records: list[Record], first_offset: int | None, stored_at: int | None = None
    ) -> None:
        self._held.append((records, first_offset, stored_at))
        self._count(len(records))

    def acked_each(self, records: list[Record], offsets: list[int | None]) -> None:
        for record, offset in zip(records, offsets, strict=True):
            self._held.append(([record], offset, None))
        self._count(len(records))

    def failed(self, record: Record, exc: BaseException, possibly_stored: bool = True) -> None:
        self._failures.append((record, exc, possibly_stored))
        self._count(1)

    @property
    def first_failure(self) -> BaseException | None:
        return self._failures[0][1] if self._failures else None

    def commit(self) -> None:
        """The transaction committed: its held acks reach the window."""
        for records, offset, stored_at in self._held:
            self._reports.acked_run(records, offset, stored_at)
        self._held = []


class KafkaAtomicWrites(AtomicWrites):
    """A producer's transactional connection (opened by its first atomic batch), its reports,
    and the lock that keeps one transaction open at a time."""

    prepare_refusal = None
    prepared = PREPARED

    def __init__(self, parts: AtomicParts) -> None:
        self.parts = parts
        self.reports = TransactionReports(parts.reports)
        self.transactional_id = parts.options.get("transactional_id") or (
            f"producerkit-{uuid.uuid4().hex}"
        )
        self.connection: KafkaConnection | None = None
        self.lock = anyio.Lock()
        #: The topics added to the open transaction.
        self.added: set[str] = set()

    def writer(self, side: AtomicSide) -> AtomicWriter:
        return _TransactionWriter(self, side)

    async def open(self) -> KafkaConnection:
        if self.connection is None:
            parts = self.parts
            options = {**parts.options, TRANSACTIONAL_OPTION: self.transactional_id}
            connection = KafkaConnection(parts.url, options, self.reports, timeout=parts.timeout)
            try:
                await connection.connect()
            except BaseException:
                await close_connections([connection])
                raise
            self.connection = connection
        return self.connection

    async def close(self) -> None:
        if self.connection is not None:
            await close_connections([self.connection])


class _TransactionWriter(AtomicWriter):
    """One Kafka transaction (see the module docstring)."""

    def __init__(self, writes: KafkaAtomicWrites, side: AtomicSide) -> None:
        self._writes = writes
        self._side = side
        self._timeout = writes.parts.timeout
        self.id = writes.transactional_id
        self.name = f"transaction {self.id}"
        self._connection: KafkaConnection | None = None
        self._failed: AtomicBatchError | None = None

    async def open(self) -> None:
        writes = self._writes
        await writes.lock.acquire()  # one open transaction per producer: others wait
        try:
            self._connection = await writes.open()
            await self._connection.begin_transaction()
        except BaseException:
            writes.lock.release()
            raise
        writes.reports.begin()
        writes.added = set()

    async def close(self) -> None:
        self._writes.lock.release()

    async def add(self, messages: list[Message]) -> None:
        for added in dict.fromkeys(message.topic for message in messages):
            await self._add_topic(added)
        records = [await self._side.admit(message, 0) for message in messages]
        await self._write(records)

    async def add_columns(self, columns: Columns, topic: str | None) -> int:
        plain_topic = self._side.plain_topic(columns, topic)
        if plain_topic is None:
            return 0
        await self._add_topic(plain_topic)
        return await self._side.admit_plain(columns, plain_topic, self._write)

    async def _write(self, records: list[Record]) -> None:
        """Send admitted records in the transaction, at once; raise the batch's failure if
        that failed it."""
        connection = self._connection
        assert connection is not None
        self._writes.reports.expect(len(records))
        for _, handed_off in connection.send_many(records, self._send_failed):
            await handed_off
        if self._failed is not None:
            raise self._failed

    async def _add_topic(self, topic: str) -> None:
        """Add every partition of ``topic`` to the transaction, at its first message (and
        prepare the topic on the transaction's connection, as every connection is before its
        first message there: else its first batches wait a retry backoff for the leaders)."""
        writes, connection = self._writes, self._connection
        assert connection is not None
        if topic in writes.added:
            return
        try:
            partitions = await writes.parts.partitions_for(topic)
            await connection.prepare_topic(topic)
            await connection.add_to_transaction(topic, sorted(partitions or {0}))
        except (ProducerkitError, TimeoutError) as exc:
            raise _as_batch_error(exc, f"{self.name}: adding its topic") from exc
        writes.added.add(topic)

    def _send_failed(self, record: Record, exc: BaseException) -> AtomicBatchError:
        """The connection refused ``record`` as it was handed over: the batch fails (the
        error it fails with)."""
        self._failed = _as_batch_error(exc, f"{self.name}: a message not sent")
        self._writes.reports.failed(record, exc, False)
        return self._failed

    async def written(self) -> None:
        assert self._connection is not None
        self._connection.flush()
        with anyio.move_on_after(self._timeout):
            await self._writes.reports.all_answered()

    async def settled(self) -> AtomicBatchError | None:
        await self.written()
        # what is still unanswered then is failed by its deadline: the batch sees it
        failure = self._writes.reports.first_failure
        if failure is None:
            return None
        return _as_batch_error(failure, f"{self.name} aborted: a message of it failed")

    async def commit(self, prepare: bool) -> PreparedTransaction | None:
        writes, connection = self._writes, self._connection
        assert connection is not None
        if prepare:
            producer_id, epoch, began_at, timeout_ms = await connection.prepare_transaction()
            writes.reports.commit()
            messages = len(self._side.records)
            return PreparedTransaction(self.id, producer_id, epoch, messages, began_at, timeout_ms)
        try:
            await connection.end_transaction(commit=True)
        except AtomicBatchError as refused:
            # a commit no coordinator answered may have been taken all the same: the batch
            # and each of its messages say so (docs/atomic.md's table)
            refused.possibly_stored = refused.kind == "coordinator_unavailable"
            raise
        writes.reports.commit()
        return None

    async def abort(self, error: AtomicBatchError) -> AtomicBatchError:
        """End the transaction (if anything was sent in it); ``error``, or the abort's own
        ``"fenced"`` refusal where a message failed (a newer producer of the id explains why
        it did)."""
        writes, connection = self._writes, self._connection
        assert connection is not None
        if self._side.records and writes.added:
            await self.written()
            try:
                await connection.end_transaction(commit=False)
            except AtomicBatchError as refused:  # else the coordinator aborts it later
                if refused.kind == "fenced" and error.kind == "message_failed":
                    error = refused
        return error


def _as_batch_error(exc: BaseException, doing: str) -> AtomicBatchError:
    if isinstance(exc, AtomicBatchError):
        return exc
    return AtomicBatchError(f"{doing}: {type(exc).__name__}: {exc}", kind="message_failed")
