"""Kafka atomic batches: one Kafka transaction each, through a connection of their own.

``async with producer.atomic_batch() as batch: await batch.produce(value, ...)`` on ``kafka://``
is the same API as JetStream's (``producerkit._atomic``). The producer's first atomic batch opens
a transactional connection beside its others (``transactional_id`` option, else one made for
this producer): its InitProducerId fences any earlier producer of that id. One transaction is
open per producer at a time; other batches wait for it to end.

Each message is validated, routed, rate limited and admitted into the window as any other, and
sent through the transactional connection once its topic was added to the transaction
(``add_to_transaction``: every partition of a topic at its first message, as the backend does
it). The broker's acks are held: a message counts as acked only once the commit
(``end_transaction``) committed the whole batch. When the block ends, the batch waits until
every message was answered, then commits; if the block raised, or a message failed or passed
its deadline, it aborts, and every message fails with one
:class:`~producerkit.AtomicBatchError` whose ``kind`` says why.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio

from producerkit._atomic import _TOLD, OpenBatches, _pairs
from producerkit._batch import Columns, columns_of, message_at, transformed
from producerkit._record import Record
from producerkit._submit import ADMITTED_AT_ONCE
from producerkit.errors import AtomicBatchError, ProducerkitError

if TYPE_CHECKING:
    from producerkit._message import MessageRules
    from producerkit._submit import Submitter
    from producerkit._window import InFlightWindow
    from producerkit.backends.base import Connection, Reports

__all__ = ["KafkaAtomicBatch", "PreparedTransaction", "TransactionReports", "Transactions"]


class PreparedTransaction(NamedTuple):
    """A Kafka transaction written whole and left open for another process to end
    (``producerkit.transactions.commit_prepared`` or ``abort_prepared``): the first phase of a
    two-phase commit. ``messages``: how many it holds."""

    transactional_id: str
    producer_id: int
    epoch: int
    messages: int


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


class Transactions:
    """A producer's transactional connection (opened by its first atomic batch, through
    ``connect(transactional_id, reports)``), its reports, and the lock that keeps one
    transaction open at a time."""

    def __init__(
        self,
        connect: Callable[[str, Reports], Awaitable[Connection]],
        reports: Reports,
        transactional_id: str | None,
    ) -> None:
        self._connect = connect
        self.reports = TransactionReports(reports)
        self.transactional_id = transactional_id or f"producerkit-{uuid.uuid4().hex}"
        self.connection: Connection | None = None
        self.lock = anyio.Lock()
        #: The topics added to the open transaction.
        self.added: set[str] = set()

    async def open(self) -> Connection:
        if self.connection is None:
            self.connection = await self._connect(self.transactional_id, self.reports)
        return self.connection


class KafkaAtomicBatch:
    """One Kafka transaction (see the module docstring): an async context manager, whose
    :meth:`produce` adds a message.

    With ``prepare``, the end of the block does not commit: once every message was answered,
    the transaction is left open for another process to end, and :attr:`prepared` says which
    (its messages count as acked then: written whole, visible once committed). The producer
    begins no other transaction after it."""

    def __init__(
        self,
        start: Callable[[], Awaitable[None]],
        transactions: Transactions,
        partitions_for: Callable[[str], Awaitable[frozenset[int] | None]],
        submitter: Submitter,
        window: InFlightWindow,
        rules: MessageRules,
        topic: str | None,
        timeout: float,
        open_batches: OpenBatches,
        *,
        prepare: bool = False,
        admission: Callable[[], Any] | None = None,
    ) -> None:
        self._start = start
        self._open_batches = open_batches
        self._prepare = prepare
        #: The producer's Admission (``Submitter.admission``) while it runs, or None:
        #: what :meth:`produce_batch` admits a plain chunk with.
        self._admission = admission
        #: With ``prepare``: the transaction left open once the block ended (None before).
        self.prepared: PreparedTransaction | None = None
        self._transactions = transactions
        self._partitions_for = partitions_for
        self._submitter = submitter
        self._window = window
        self._rules = rules
        self._topic = topic
        self._timeout = timeout
        #: The transactional id its messages are written with.
        self.id = transactions.transactional_id
        self._records: list[Record] = []
        self._open = False
        self._failed: AtomicBatchError | None = None
        self._connection: Connection | None = None

    def __len__(self) -> int:
        """Messages produced into the batch so far."""
        return len(self._records)

    async def written(self) -> None:
        """Wait until its messages so far were sent and answered by the broker (their acks
        held for the commit), or its timeout passed (their deadlines then fail them)."""
        assert self._connection is not None
        await self._connection.flush()
        with anyio.move_on_after(self._timeout):
            await self._transactions.reports.all_answered()

    async def __aenter__(self) -> KafkaAtomicBatch:
        await self._start()
        transactions = self._transactions
        await transactions.lock.acquire()  # one open transaction per producer: others wait
        try:
            self._connection = await transactions.open()
            await self._connection.begin_transaction()
        except BaseException:
            transactions.lock.release()
            raise
        transactions.reports.begin()
        transactions.added = set()
        self._open_batches.opened(self, self._records)
        self._open = True
        return self

    async def produce(
        self,
        value: bytes | bytearray | memoryview | str,
        *,
        key: bytes | str | None = None,
        headers: Any = None,
        topic: str | None = None,
    ) -> None:
        """Add a message to the transaction (the same arguments as ``Producer.produce``).
        Raises its MessageError at once for a bad message, and AtomicBatchError where the
        transaction cannot take it (it failed, or its topic could not be added to it)."""
        connection = self._usable()
        given = [] if headers is None else _pairs(headers)
        message = self._rules.message(value, key, given or None, topic or self._topic, None, None)
        await self._add_topic(message.topic)
        record = await self._submitter.admitted(message, _TOLD, connection=0)
        self._records.append(record)
        self._transactions.reports.expect(1)
        try:
            handed_off = connection.send(record)
        except Exception as exc:
            raise self._send_failed(record, exc) from exc
        if handed_off is not None:
            await handed_off

    async def produce_batch(
        self, values: Any, *, keys: Any = None, headers: Any = None, topic: str | None = None
    ) -> None:
        """As many :meth:`produce` calls, in order, at a fraction of their cost: each argument
        but ``topic`` is a column, one item per message (a list, a tuple or an Arrow array, as
        ``Producer.produce_batch`` takes them). Every message is checked before any is added
        (a bad one's MessageError names its index); the records are handed to the connection
        ``ADMITTED_AT_ONCE`` at a time."""
        connection = self._usable()
        name = topic or self._topic
        columns = transformed(self._rules, columns_of(values, keys=keys, headers=headers), name)
        if columns.headers is not None:
            pairs = [None if item is None else _pairs(item) or None for item in columns.headers]
            columns = columns._replace(headers=pairs)
        start = 0
        admission = None if self._admission is None else self._admission()
        plain_topic = name or self._rules.default_topic
        if admission is not None and columns.plain and columns.size and type(plain_topic) is str:
            await self._add_topic(plain_topic)
            start = await self._admit_plain(admission, connection, columns, plain_topic)
        messages = [message_at(self._rules, columns, name, i) for i in range(start, columns.size)]
        for added in dict.fromkeys(message.topic for message in messages):
            await self._add_topic(added)
        admitted = self._submitter.admitted
        for start in range(0, len(messages), ADMITTED_AT_ONCE):
            records = [
                await admitted(message, _TOLD, connection=0)
                for message in messages[start : start + ADMITTED_AT_ONCE]
            ]
            await self._send_many(connection, records)

    async def _send_many(self, connection: Connection, records: list[Record]) -> None:
        """Send admitted records in the transaction, at once; raise the batch's failure if
        that failed it."""
        self._records += records
        self._transactions.reports.expect(len(records))
        for _, handed_off in connection.send_many(records, self._send_failed):
            await handed_off
        if self._failed is not None:
            raise self._failed

    async def _admit_plain(
        self, admission: Any, connection: Connection, columns: Columns, topic: str
    ) -> int:
        """:meth:`produce_batch` for a plain chunk (values and keys), as ``Submitter._submit_plain``
        does it but into the transaction's connection: admitted through the Admission
        ``ADMITTED_AT_ONCE`` at a time (each record's partition routed as ``produce()`` routes it).
        Where it stopped: the size, or the first message it leaves to the checked path; raises what
        admitting raised, once the records before it are handed over. Its records carry no slot: the
        batch tells their failure as its own when it fails them (``_told``); one that passes its
        deadline first is failed by the window as any message is (kept for ``flush()``, given to
        ``on_error``), and the batch with it."""

        async def send(by_connection: list[list[Record]]) -> None:
            await self._send_many(
                connection, [record for admitted in by_connection for record in admitted]
            )

        return await self._submitter.admit_plain(
            admission, columns, topic, self._rules.takes_tombstones, send, closing_stops=False
        )

    def _usable(self) -> Connection:
        """The transaction's connection, or the error that says why it takes no message."""
        if not self._open:
            raise AtomicBatchError(
                "the batch is over: produce inside its `async with` block", kind="aborted"
            )
        if self._failed is not None:
            raise self._failed
        assert self._connection is not None
        return self._connection

    async def _add_topic(self, topic: str) -> None:
        """Add every partition of ``topic`` to the transaction, at its first message (and
        prepare the topic on the transaction's connection, as every connection is before its
        first message there: else its first batches wait a retry backoff for the leaders)."""
        transactions, connection = self._transactions, self._connection
        assert connection is not None
        if topic in transactions.added:
            return
        try:
            partitions = await self._partitions_for(topic)
            await connection.prepare_topic(topic)
            await connection.add_to_transaction(topic, sorted(partitions or {0}))
        except (ProducerkitError, TimeoutError) as exc:
            self._failed = _as_batch_error(exc, f"transaction {self.id}: adding its topic")
            raise self._failed from exc
        transactions.added.add(topic)

    def _send_failed(self, record: Record, exc: BaseException) -> AtomicBatchError:
        """The connection refused ``record`` as it was handed over: the batch fails (the
        error it fails with)."""
        self._failed = _as_batch_error(exc, f"transaction {self.id}: a message not sent")
        self._transactions.reports.failed(record, exc, False)
        return self._failed

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._open = False
        transactions, connection = self._transactions, self._connection
        assert connection is not None
        try:
            if exc is not None:
                error = AtomicBatchError(
                    f"transaction {self.id} aborted: its block raised {type(exc).__name__}: {exc}",
                    kind="aborted",
                )
                await self._abort(error)
                return  # the block's exception goes on
            if self._records:
                await self._commit()
        finally:
            self._open_batches.closed(self)
            transactions.lock.release()

    async def _commit(self) -> None:
        transactions, connection = self._transactions, self._connection
        assert connection is not None
        await connection.flush()
        try:
            with anyio.fail_after(self._timeout):
                await transactions.reports.all_answered()
        except TimeoutError:
            pass  # the deadlines fail what is still unanswered; the pending check sees it
        failure = self._failed or transactions.reports.first_failure
        pending = self._window.pending
        if failure is None and any(record.seq not in pending for record in self._records):
            failure = AtomicBatchError(
                f"transaction {self.id} aborted: a message of it passed its deadline "
                f"({self._timeout}s) before the commit",
                kind="message_failed",
            )
        if failure is not None:
            error = (
                failure
                if isinstance(failure, AtomicBatchError)
                else AtomicBatchError(
                    f"transaction {self.id} aborted: a message of it failed "
                    f"({type(failure).__name__}: {failure})",
                    kind="message_failed",
                )
            )
            raise await self._abort(error)
        if self._prepare:
            producer_id, epoch = await connection.prepare_transaction()
            self.prepared = PreparedTransaction(self.id, producer_id, epoch, len(self._records))
            transactions.reports.commit()
            return
        try:
            await connection.end_transaction(commit=True)
        except AtomicBatchError as refused:
            # a commit no coordinator answered may have been taken all the same: the batch
            # and each of its messages say so (docs/atomic.md's table)
            refused.possibly_stored = refused.kind == "coordinator_unavailable"
            self._fail(refused, possibly_stored=refused.possibly_stored)
            raise
        transactions.reports.commit()

    async def _abort(self, error: AtomicBatchError) -> AtomicBatchError:
        """End the transaction (if anything was sent in it) and fail its messages; return the
        error they failed with: ``error``, or the abort's own ``"fenced"`` refusal where a
        message failed (a newer producer of the id explains why it did)."""
        transactions, connection = self._transactions, self._connection
        assert connection is not None
        if self._records and transactions.added:
            await connection.flush()
            with anyio.move_on_after(self._timeout):
                await transactions.reports.all_answered()
            try:
                await connection.end_transaction(commit=False)
            except AtomicBatchError as refused:  # else the coordinator aborts it later
                if refused.kind == "fenced" and error.kind == "message_failed":
                    error = refused
        self._fail(error, possibly_stored=False)
        return error

    def _fail(self, error: AtomicBatchError, *, possibly_stored: bool) -> None:
        for record in self._records:
            self._window.failed(_told(record), error, possibly_stored)


def _told(record: Record) -> Record:
    """``record`` as the batch fails it: one the Admission admitted (no slot) carries the
    batch's ``_TOLD`` then, as :meth:`KafkaAtomicBatch.produce`'s do from their admission, so
    its failure is the batch's to raise (not kept for ``flush()``, ``on_error`` or the
    spool)."""
    if record.slot is not None:
        return record
    return Record(*(getattr(record, name) for name in Record._fields))._replace(slot=_TOLD)


def _as_batch_error(exc: BaseException, doing: str) -> AtomicBatchError:
    if isinstance(exc, AtomicBatchError):
        return exc
    return AtomicBatchError(f"{doing}: {type(exc).__name__}: {exc}", kind="message_failed")
