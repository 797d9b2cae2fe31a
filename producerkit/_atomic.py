"""Atomic batches: messages stored all together when the block ends, or none of them.

``async with producer.atomic_batch() as batch: await batch.produce(value, ...)`` gives one
:class:`AtomicBatch` on every backend that has them (a JetStream atomic batch, a Kafka
transaction, ``memory://``'s). Its lifecycle is written here once: open (the backend's writer
waits for room and begins the batch), each message validated by the producer's rules and
admitted into its window as any other (the window's bound, the rate limit and each message's
deadline apply), the open-batch registry a ``flush()`` inside the block consults, and at the
block's end: every message answered, none past its deadline, then the commit, or an abort that
fails every message with one :class:`~producerkit.AtomicBatchError` whose ``kind`` says why.
How a batch opens, writes, commits and aborts is the backend's
:class:`~producerkit.backends.base.AtomicWriter` (``backends/nats/atomic.py``,
``backends/kafka/atomic.py``, ``backends/memory.py``).
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from producerkit._batch import columns_of, message_at, transformed
from producerkit._record import Record
from producerkit._submit import ADMITTED_AT_ONCE
from producerkit.errors import AtomicBatchError, MessageError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from producerkit._batch import Columns
    from producerkit._message import MessageRules
    from producerkit._record import Message
    from producerkit._submit import Submitter
    from producerkit.backends.base import AtomicWriter, AtomicWrites, Reports

__all__ = ["AtomicBatch", "OpenBatches"]


class _ToldByTheBatch:
    """What a batch's records carry for a waiter: the batch tells its caller how it ended
    itself, so its messages' failures are neither kept for ``flush()`` nor given to
    ``on_error`` or the spool (as a blocking produce's); ``on_delivery`` is told of each."""

    __slots__ = ()

    def done(self) -> bool:
        return False

    def set_result(self, result: object) -> None:
        pass

    def set_exception(self, exception: BaseException) -> None:
        pass


_TOLD: Final[Any] = _ToldByTheBatch()


class OpenBatches:
    """A producer's atomic batches whose blocks are running, each with the task that opened it
    and the list of its records: a ``flush()`` in that task must not wait for the batch's
    commit, which comes after the flush, when the block ends."""

    def __init__(self) -> None:
        self._open: dict[AtomicBatch, tuple[asyncio.Task[Any] | None, list[Record]]] = {}

    def opened(self, batch: AtomicBatch, records: list[Record]) -> None:
        """``batch`` is open in the running task; ``records``: the list it keeps its admitted
        records in."""
        self._open[batch] = (asyncio.current_task(), records)

    def closed(self, batch: AtomicBatch) -> None:
        self._open.pop(batch, None)

    def of_this_task(self) -> list[tuple[AtomicBatch, list[Record]]]:
        """The batches the running task has open, each with its records."""
        task = asyncio.current_task()
        return [
            (batch, records) for batch, (opener, records) in self._open.items() if opener is task
        ]


class AtomicBatch:
    """One atomic batch (see the module docstring): an async context manager whose
    :meth:`produce` and :meth:`produce_batch` add messages.

    With ``prepare`` (Kafka), the end of the block does not commit: once every message was
    answered, the transaction is left open for another process to end, and ``prepared``
    says which (its messages count as acked then: written whole, visible once committed)."""

    def __init__(
        self,
        start: Callable[[], Awaitable[None]],
        writes: AtomicWrites,
        submitter: Submitter,
        reports: Reports,
        rules: MessageRules,
        topic: str | None,
        timeout: float,
        open_batches: OpenBatches,
        *,
        prepare: bool = False,
        admission: Callable[[], Any] | None = None,
    ) -> None:
        self._start = start
        self._submitter = submitter
        self._reports = reports
        self._rules = rules
        self._topic = topic
        self._timeout = timeout
        self._open_batches = open_batches
        self._prepare = prepare
        #: The producer's Admission (``Submitter.admission``) while it runs, or None: what a
        #: plain chunk of :meth:`produce_batch` is admitted with.
        self._admission = admission
        self._records: list[Record] = []
        self._count = 0
        self._open = False
        self._failed: AtomicBatchError | None = None
        self._batch_writer: AtomicWriter = writes.writer(self)
        #: The batch's id, as its backend names it (a JetStream batch's, a Kafka transaction's).
        self.id = self._batch_writer.id
        #: With ``prepare``: the transaction left open once the block ended (None before).
        self.prepared: Any = None

    def __len__(self) -> int:
        """Messages produced into the batch so far."""
        return self._count

    # ------------------------------------------------------------------ the writer's side

    @property
    def records(self) -> list[Record]:
        return self._records

    async def admit(self, message: Message, connection: int) -> Record:
        record = await self._submitter.admitted(message, _TOLD, connection=connection)
        self._records.append(record)
        return record

    def plain_topic(self, columns: Columns, topic: str | None) -> str | None:
        name = topic or self._rules.default_topic
        if self._admission is None or not columns.plain or not columns.size:
            return None
        return name if type(name) is str else None

    async def admit_plain(
        self, columns: Columns, topic: str, write: Callable[[list[Record]], Awaitable[None]]
    ) -> int:
        """As ``Submitter.admit_plain``: its records carry no slot; the batch tells their
        failure as its own when it fails them (``_told``); one that passes its deadline first
        is failed by the window as any message is, and the batch with it."""
        admission = None if self._admission is None else self._admission()
        if admission is None:
            return 0

        async def admitted(by_connection: list[list[Record]]) -> None:
            records = [record for chunk in by_connection for record in chunk]
            self._records += records
            await write(records)

        return await self._submitter.admit_plain(
            admission, columns, topic, self._rules.takes_tombstones, admitted, closing_stops=False
        )

    # ------------------------------------------------------------------ the user's side

    async def written(self) -> None:
        """Wait until its messages so far were written (their acks held for the commit), or
        its timeout passed (their deadlines then fail them)."""
        await self._batch_writer.written()

    async def __aenter__(self) -> AtomicBatch:
        await self._start()
        await self._batch_writer.open()
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
        expect: Any = None,
    ) -> None:
        """Add a message to the batch (the same arguments as ``Producer.produce``; ``expect``
        where the backend takes expectations). Raises its MessageError at once for a bad
        message, and AtomicBatchError where the batch cannot take it (it is full, an
        expectation a batch cannot carry, or the batch failed)."""
        self._usable()
        self._batch_writer.check(self._count, expect)
        given = None if headers is None else _pairs(headers) or None
        message = self._rules.message(
            value, key, given, topic or self._topic, None, None, expect=expect
        )
        self._count += 1
        await self._add([message])

    async def produce_batch(
        self, values: Any, *, keys: Any = None, headers: Any = None, topic: str | None = None
    ) -> None:
        """As many :meth:`produce` calls, in order, at a fraction of their cost: each argument
        but ``topic`` is a column, one item per message (a list, a tuple or an Arrow array, as
        ``Producer.produce_batch`` takes them). Every message is checked before any is added
        (a bad one's MessageError names its index)."""
        self._usable()
        name = topic or self._topic
        columns = transformed(self._rules, columns_of(values, keys=keys, headers=headers), name)
        if columns.headers is not None:
            pairs = [None if item is None else _pairs(item) or None for item in columns.headers]
            columns = columns._replace(headers=pairs)
        if columns.size:
            self._batch_writer.check(self._count + columns.size - 1, None)
        try:
            start = await self._batch_writer.add_columns(columns, name)
        except AtomicBatchError as exc:
            self._failed = exc
            raise
        self._count += start
        messages = [message_at(self._rules, columns, name, i) for i in range(start, columns.size)]
        for first in range(0, len(messages), ADMITTED_AT_ONCE):
            chunk = messages[first : first + ADMITTED_AT_ONCE]
            self._count += len(chunk)
            await self._add(chunk)

    async def _add(self, messages: list[Message]) -> None:
        try:
            await self._batch_writer.add(messages)
        except AtomicBatchError as exc:
            self._failed = exc
            raise

    def _usable(self) -> None:
        if not self._open:
            raise AtomicBatchError(
                "the batch is over: produce inside its `async with` block", kind="aborted"
            )
        if self._failed is not None:
            raise self._failed

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._open = False
        name = self._batch_writer.name
        try:
            if exc is not None:
                await self._abort(
                    AtomicBatchError(
                        f"{name} not committed: its block raised {type(exc).__name__}: {exc}",
                        kind="aborted",
                    )
                )
                return  # the block's exception goes on
            if self._failed is not None:
                raise await self._abort(self._failed)
            if self._count:
                await self._commit()
        finally:
            self._open_batches.closed(self)
            await self._batch_writer.close()

    async def _commit(self) -> None:
        failure = await self._batch_writer.settled()
        pending = self._reports.pending
        if failure is None and any(record.seq not in pending for record in self._records):
            failure = AtomicBatchError(
                f"{self._batch_writer.name} not committed: a message of it passed its deadline "
                f"({self._timeout}s) before the commit",
                kind="message_failed",
            )
        if failure is not None:
            raise await self._abort(failure)
        try:
            self.prepared = await self._batch_writer.commit(self._prepare)
        except AtomicBatchError as refused:
            self._fail(refused, possibly_stored=refused.possibly_stored)
            raise

    async def _abort(self, error: AtomicBatchError) -> AtomicBatchError:
        error = await self._batch_writer.abort(error)
        self._fail(error, possibly_stored=False)
        return error

    def _fail(self, error: AtomicBatchError, *, possibly_stored: bool) -> None:
        """Every admitted message of the batch fails with ``error``."""
        for record in self._records:
            self._reports.failed(_told(record), error, possibly_stored)


def _told(record: Record) -> Record:
    """``record`` as the batch fails it: one the Admission admitted (no slot) carries the
    batch's ``_TOLD`` then, as :meth:`AtomicBatch.admit`'s do from their admission, so its
    failure is the batch's to raise (not kept for ``flush()``, ``on_error`` or the spool)."""
    if record.slot is not None:
        return record
    return Record(*(getattr(record, name) for name in Record._fields))._replace(slot=_TOLD)


def _pairs(headers: Any) -> list[tuple[str, Any]]:
    if isinstance(headers, dict):
        return list(headers.items())
    if isinstance(headers, (list, tuple)):
        return list(headers)
    raise MessageError(
        "headers must be a mapping of str to bytes/str, or a list of (name, value) pairs, "
        f"not {type(headers).__name__}"
    )
