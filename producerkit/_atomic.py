"""JetStream atomic batches (ADR-50): messages stored all together or not at all.

``async with producer.atomic_batch() as batch: await batch.produce(value, ...)``. Every message
of a batch carries ``Nats-Batch-Id`` and ``Nats-Batch-Sequence`` (1, 2, 3, ...); the last one
also ``Nats-Batch-Commit: 1``, and the server stores the batch at that commit, whole, or refuses
it whole. As the last message is only known when the block ends, each message is held until the
next one comes (then sent), and the one held at the end is sent as the commit. The first message
is sent as a request, so that a stream that takes no batches, or a server with too many open
ones (which is waited out), says so at once; the others are written without an answer, in
order, on one connection; the commit's PubAck (``{"seq": S, "batch": id, "count": N}``) acks
the N messages at stream sequences S-N+1 ... S.

Each message is validated, routed, rate limited and admitted into the window as any other when
it is sent, so the window's bound, the rate limit and each message's deadline apply. A batch
ends acked (every message, at the commit) or failed (every message, with one
:class:`~producerkit.AtomicBatchError`): a refusal by the server (its code), the block raising
(not stored), a message past its deadline before the commit (not committed), or a commit whose
answer was lost (possibly stored).
"""

from __future__ import annotations

import asyncio
import json
import uuid
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import anyio

from producerkit._message import MessageRules
from producerkit._record import Message, Record
from producerkit._submit import Submitter
from producerkit.errors import AtomicBatchError, MessageError, ProducerkitError
from producerkit.jetstream import Expect

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from producerkit._window import InFlightWindow
    from producerkit.backends.base import Connection

__all__ = ["MAX_MESSAGES", "MAX_OPEN", "AtomicBatch"]

#: Messages in one batch (the server's default limit; it refuses more with code 10199).
MAX_MESSAGES: Final = 1000
#: Batches open at once on one stream (the server's default limit, 10210 beyond it).
MAX_OPEN: Final = 50
#: Seconds between attempts at opening a batch while the server has too many open.
_RETRY_OPEN: Final = 0.1
_TOO_MANY_OPEN: Final = 10210
#: The stream does not allow atomic batches.
_NOT_ALLOWED: Final = 10174

#: Each producer's (its submitter's) count of open batches.
_open_batches: weakref.WeakKeyDictionary[Submitter, anyio.Semaphore] = weakref.WeakKeyDictionary()


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
    """A producer's atomic batches (JetStream's and Kafka's) whose blocks are running, each with
    the task that opened it and the list of its records: a ``flush()`` in that task must not
    wait for the batch's commit, which comes after the flush, when the block ends. A batch has
    ``written()``: wait until its messages so far are written (and answered, their acks held
    for the commit)."""

    def __init__(self) -> None:
        self._open: dict[Any, tuple[asyncio.Task[Any] | None, list[Record]]] = {}

    def opened(self, batch: Any, records: list[Record]) -> None:
        """``batch`` is open in the running task; ``records``: the list it keeps its admitted
        records in."""
        self._open[batch] = (asyncio.current_task(), records)

    def closed(self, batch: Any) -> None:
        self._open.pop(batch, None)

    def of_this_task(self) -> list[tuple[Any, list[Record]]]:
        """The batches the running task has open, each with its records."""
        task = asyncio.current_task()
        return [
            (batch, records) for batch, (opener, records) in self._open.items() if opener is task
        ]


class AtomicBatch:
    """One atomic batch (see the module docstring): an async context manager, whose
    :meth:`produce` adds a message."""

    def __init__(
        self,
        start: Callable[[], Awaitable[None]],
        submitter: Submitter,
        window: InFlightWindow,
        rules: MessageRules,
        topic: str | None,
        timeout: float,
        open_batches: OpenBatches,
    ) -> None:
        self._start = start
        self._open_batches = open_batches
        self._submitter = submitter
        self._window = window
        self._rules = rules
        self._topic = topic
        self._timeout = timeout
        #: The batch id (``Nats-Batch-Id``).
        self.id = uuid.uuid4().hex
        self._connection = 0
        self._held: Message | None = None
        self._records: list[Record] = []
        self._count = 0
        self._failed: AtomicBatchError | None = None
        self._open = False
        self._semaphore: anyio.Semaphore | None = None

    def __len__(self) -> int:
        """Messages produced into the batch so far."""
        return self._count

    async def written(self) -> None:
        """Its messages so far are written as they are produced (the last one goes with the
        commit): nothing to wait for."""

    async def __aenter__(self) -> AtomicBatch:
        await self._start()
        self._semaphore = _open_batches.setdefault(self._submitter, anyio.Semaphore(MAX_OPEN))
        await self._semaphore.acquire()  # at most MAX_OPEN at once: the others wait here
        self._connection = int(self.id[:8], 16) % len(self._submitter.connections)
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
        expect: Expect | None = None,
    ) -> None:
        """Add a message to the batch (the same arguments as ``Producer.produce``). Raises its
        MessageError at once for a bad message, and AtomicBatchError where the batch cannot
        take it (it is full, an expectation a batch cannot carry, or the batch failed)."""
        if not self._open:
            raise AtomicBatchError(
                "the batch is over: produce inside its `async with` block", kind="aborted"
            )
        if self._failed is not None:
            raise self._failed
        if self._count >= MAX_MESSAGES:
            raise AtomicBatchError(
                f"an atomic batch takes at most {MAX_MESSAGES} messages (the server's limit): "
                f"message {self._count + 1} was refused before it was sent",
                kind="refused",
            )
        if isinstance(expect, Expect):
            _check_expectation(expect, first=self._count == 0)
        sequence = self._count + 1
        batch_headers = [("Nats-Batch-Id", self.id), ("Nats-Batch-Sequence", str(sequence))]
        given = [] if headers is None else _pairs(headers)
        message = self._rules.message(
            value, key, given + batch_headers, topic or self._topic, None, None, expect=expect
        )
        held, self._held = self._held, message
        self._count = sequence
        if held is not None:
            await self._send(held, sequence - 1)

    async def _send(self, message: Message, sequence: int, *, commit: bool = False) -> Any:
        """Admit and write one message; the answer of a request (the first, and the commit).
        A message that cannot be sent fails the batch."""
        record = await self._submitter.admitted(message, _TOLD, connection=self._connection)
        self._records.append(record)
        connection = self._submitter.connections[self._connection]
        try:
            if sequence > 1 and not commit:
                await connection.send_batch_message(record, reply=False, timeout=self._timeout)
                return None
            return await self._request(connection, record, commit)
        except (ProducerkitError, TimeoutError) as exc:
            if commit or isinstance(exc, AtomicBatchError):
                raise
            self._failed = AtomicBatchError(
                f"atomic batch {self.id}: message {sequence} could not be sent "
                f"({type(exc).__name__}: {exc})",
                kind="message_failed",
            )
            raise self._failed from exc

    async def _request(self, connection: Connection, record: Record, commit: bool) -> Any:
        """The answer to a request; an opening the server refuses for having too many batches
        open is sent again until it is taken (or the timeout)."""
        with anyio.fail_after(self._timeout):
            while True:
                answer = await connection.send_batch_message(
                    record, reply=True, timeout=self._timeout
                )
                assert answer is not None
                data, headers = answer
                if commit or not data:
                    return answer
                error = _refusal(data, headers, self.id)
                if error.code != _TOO_MANY_OPEN:
                    self._failed = error
                    raise error
                await anyio.sleep(_RETRY_OPEN)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._open = False
        try:
            if exc is not None:
                self._fail(
                    AtomicBatchError(
                        f"atomic batch {self.id} not committed: its block raised "
                        f"{type(exc).__name__}: {exc}",
                        kind="aborted",
                    ),
                    possibly_stored=False,
                )
                return  # the block's exception goes on
            if self._failed is not None:
                self._fail(self._failed, possibly_stored=False)
                raise self._failed
            if self._held is not None:
                await self._commit(self._held)
        finally:
            self._open_batches.closed(self)
            if self._semaphore is not None:
                self._semaphore.release()

    async def _commit(self, held: Message) -> None:
        pending = self._window.pending
        if any(record.seq not in pending for record in self._records):
            error = AtomicBatchError(
                f"atomic batch {self.id} not committed: a message of it passed its deadline "
                f"({self._timeout}s) before the commit",
                kind="message_failed",
            )
            self._fail(error, possibly_stored=False)
            raise error
        commit = held._replace(headers=(*(held.headers or ()), ("Nats-Batch-Commit", b"1")))
        try:
            answer = await self._send(commit, self._count, commit=True)
        except AtomicBatchError as refused:
            self._fail(refused, possibly_stored=False)
            raise
        except (ProducerkitError, TimeoutError) as exc:
            error = AtomicBatchError(
                f"atomic batch {self.id}: the commit's answer was lost ({type(exc).__name__}: "
                f"{exc}); it may have been stored",
                possibly_stored=True,
                kind="commit_unanswered",
            )
            self._fail(error, possibly_stored=True)
            raise error from exc
        data, headers = answer
        stored = _committed(data, headers, self.id, self._count)
        if isinstance(stored, AtomicBatchError):
            self._fail(stored, possibly_stored=False)
            raise stored
        self._window.acked_run(self._records, stored - self._count + 1)

    def _fail(self, error: AtomicBatchError, *, possibly_stored: bool) -> None:
        """Every admitted message of the batch fails with ``error`` (the held one, never sent,
        was never counted)."""
        for record in self._records:
            self._window.failed(record, error, possibly_stored)


def _check_expectation(expect: Expect, *, first: bool) -> None:
    if expect.last_msg_id is not None:
        raise AtomicBatchError(
            "a batch cannot expect a last msg id (Nats-Expected-Last-Msg-Id; the server refuses "
            "it with code 10177): refused before sending",
            kind="refused",
        )
    if expect.last_sequence is not None and not first:
        raise AtomicBatchError(
            "only a batch's first message may expect the stream's last sequence (the server "
            "refuses it on the others with code 10164): refused before sending",
            kind="refused",
        )


def _pairs(headers: Any) -> list[tuple[str, Any]]:
    if isinstance(headers, dict):
        return list(headers.items())
    if isinstance(headers, (list, tuple)):
        return list(headers)
    raise MessageError(
        "headers must be a mapping of str to bytes/str, or a list of (name, value) pairs, "
        f"not {type(headers).__name__}"
    )


def _refusal(data: bytes, headers: Any, batch: str) -> AtomicBatchError:
    from producerkit.backends.nats.pubacks import ATOMIC_BATCH_HINTS, puback_error

    error = puback_error(f"atomic batch {batch}", data, headers)
    if error is None:
        return AtomicBatchError(
            f"atomic batch {batch}: an unexpected answer {data[:200]!r}", kind="refused"
        )
    code = getattr(error, "code", None)
    kind = "unsupported" if code == _NOT_ALLOWED else "refused"
    hint = ATOMIC_BATCH_HINTS.get(code) if code is not None else None
    text = f"atomic batch {batch}: {error}" + (f"; {hint}" if hint else "")
    return AtomicBatchError(text, code=code, kind=kind)


def _committed(data: bytes, headers: Any, batch: str, count: int) -> int | AtomicBatchError:
    """The stream sequence of the last message stored by the commit, or why not."""
    try:
        answer = json.loads(data)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or "error" in answer:
        return _refusal(data, headers, batch)
    if answer.get("batch") != batch or answer.get("count") != count:
        return AtomicBatchError(
            f"atomic batch {batch}: the commit answered for batch {answer.get('batch')!r} with "
            f"{answer.get('count')!r} message(s), not {count}",
            kind="refused",
        )
    sequence = answer.get("seq")
    if type(sequence) is not int:
        return AtomicBatchError(
            f"atomic batch {batch}: the commit gave no sequence: {answer!r}", kind="refused"
        )
    return sequence
