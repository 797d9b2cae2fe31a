"""JetStream atomic batches (ADR-50): the writer of ``Producer.atomic_batch()`` on ``jetstream://``.

Every message of a batch carries ``Nats-Batch-Id`` and ``Nats-Batch-Sequence`` (1, 2, 3, ...);
the last one also ``Nats-Batch-Commit: 1``, and the server stores the batch at that commit,
whole, or refuses it whole. As the last message is only known when the block ends, each message
is admitted as it is produced (counted, its deadline running, as on every backend) and held
until the next one comes (then sent), and the one held at the end is sent as the commit; a
batch that ends without one fails it with the others. The first message is sent as a request,
so that a stream that takes no batches, or a server with too many open ones (which is waited
out), says so at once; the others are written without an answer, in order, on one of the
producer's connections; the commit's PubAck
(``{"seq": S, "batch": id, "count": N}``) acks the N messages at stream sequences S-N+1 ... S.
A commit whose answer was lost fails the batch possibly stored.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, Final, cast

import anyio

from producerkit._record import with_headers
from producerkit.backends.base import AtomicParts, AtomicSide, AtomicWriter, AtomicWrites
from producerkit.backends.nats.errors import AnswerLost
from producerkit.backends.nats.pubacks import atomic_committed, atomic_refusal
from producerkit.errors import AtomicBatchError, ProducerkitError
from producerkit.jetstream import Expect

if TYPE_CHECKING:
    from producerkit._record import Message, Record
    from producerkit.backends.nats.jetstream import JetStreamConnection

__all__ = ["MAX_MESSAGES", "MAX_OPEN", "JetStreamAtomicWrites"]

#: Messages in one batch (the server's default limit; it refuses more with code 10199).
MAX_MESSAGES: Final = 1000
#: Batches open at once on one stream (the server's default limit, 10210 beyond it).
MAX_OPEN: Final = 50
#: Seconds between attempts at opening a batch while the server has too many open.
_RETRY_OPEN: Final = 0.1
_TOO_MANY_OPEN: Final = 10210
#: Seconds a batch's opening waits for its answer before it is taken for lost and sent again
#: under a new batch id (doubled at each loss, up to ``_OPENING_ANSWER_MAX``): a stream answers
#: in milliseconds, or "no responders" at once during an election, but a request a server
#: routed to a peer that died before its route closed is never answered.
_OPENING_ANSWER: Final = 2.0
_OPENING_ANSWER_MAX: Final = 8.0
_COMMIT: Final = ("Nats-Batch-Commit", b"1")

logger = logging.getLogger("producerkit.nats")


class JetStreamAtomicWrites(AtomicWrites):
    """A producer's JetStream atomic batches: at most ``MAX_OPEN`` open at once (the others
    wait for room)."""

    prepare_refusal = (
        "a transaction left open; a JetStream atomic batch commits when its block ends"
    )

    def __init__(self, parts: AtomicParts) -> None:
        self.parts = parts
        self.room = anyio.Semaphore(MAX_OPEN)

    def writer(self, side: AtomicSide) -> AtomicWriter:
        return _BatchWriter(self, side)


class _BatchWriter(AtomicWriter):
    def __init__(self, writes: JetStreamAtomicWrites, side: AtomicSide) -> None:
        self._writes = writes
        self._side = side
        self._timeout = writes.parts.timeout
        self.id = uuid.uuid4().hex
        self.name = f"atomic batch {self.id}"
        self._batch_id = self.id.encode()
        self._connection = 0  # chosen at open(), once the producer's connections are there
        self._held: Record | None = None
        self._sequence = 0

    def check(self, count: int, expect: object) -> None:
        if count >= MAX_MESSAGES:
            raise AtomicBatchError(
                f"an atomic batch takes at most {MAX_MESSAGES} messages (the server's limit): "
                f"message {count + 1} was refused before it was sent",
                kind="refused",
            )
        if not isinstance(expect, Expect):
            return
        if expect.last_msg_id is not None:
            raise AtomicBatchError(
                "a batch cannot expect a last msg id (Nats-Expected-Last-Msg-Id; the server "
                "refuses it with code 10177): refused before sending",
                kind="refused",
            )
        if expect.last_sequence is not None and count > 0:
            raise AtomicBatchError(
                "only a batch's first message may expect the stream's last sequence (the server "
                "refuses it on the others with code 10164): refused before sending",
                kind="refused",
            )

    async def open(self) -> None:
        await self._writes.room.acquire()  # at most MAX_OPEN at once: the others wait here
        self._connection = int(self.id[:8], 16) % len(self._writes.parts.connections())

    async def close(self) -> None:
        self._writes.room.release()

    async def add(self, messages: list[Message]) -> None:
        for message in messages:
            self._sequence += 1
            batch = (
                ("Nats-Batch-Id", self._batch_id),
                ("Nats-Batch-Sequence", b"%d" % self._sequence),
            )
            record = await self._side.admit(
                message._replace(headers=(*(message.headers or ()), *batch)), self._connection
            )
            held, self._held = self._held, record
            if held is not None:
                await self._send(held, self._sequence - 1)

    def _link(self) -> JetStreamConnection:
        return cast("JetStreamConnection", self._writes.parts.connections()[self._connection])

    async def _send(self, record: Record, sequence: int) -> None:
        """Write one admitted message (the first as a request). One that cannot be sent fails
        the batch."""
        try:
            if sequence > 1:
                await self._link().send_batch_message(record, reply=False, timeout=self._timeout)
            else:
                await self._request(record, commit=False)
        except (ProducerkitError, TimeoutError) as exc:
            if isinstance(exc, AtomicBatchError):
                raise
            raise AtomicBatchError(
                f"{self.name}: message {sequence} could not be sent ({type(exc).__name__}: {exc})",
                kind="message_failed",
            ) from exc

    async def _request(self, record: Record, *, commit: bool) -> tuple[bytes, Any]:
        """The answer to a request; an opening the server refuses for having too many batches
        open is sent again until it is taken (or the timeout), and one whose answer is lost
        (its connection was lost, or no answer came within ``_OPENING_ANSWER``, doubled at
        each such loss up to ``_OPENING_ANSWER_MAX``) is sent again as the opening of a batch
        with a new id (the server drops a batch it got the opening of and nothing more, after
        its batch timeout). A commit waits for its answer until the timeout."""
        answer_within = None if commit else _OPENING_ANSWER
        with anyio.fail_after(self._timeout):
            while True:
                try:
                    answer = await self._link().send_batch_message(
                        record, reply=True, timeout=self._timeout, answer_within=answer_within
                    )
                except AnswerLost as lost:
                    if commit or answer_within is None:
                        raise
                    record = self._renamed(record)
                    logger.debug("%s; opened again as %s", lost, self.name)
                    answer_within = min(answer_within * 2, _OPENING_ANSWER_MAX)
                    continue
                assert answer is not None
                data, headers = answer
                if commit or not data:
                    return answer
                error = atomic_refusal(data, headers, self.id)
                if error.code != _TOO_MANY_OPEN:
                    raise error
                await anyio.sleep(_RETRY_OPEN)

    def _renamed(self, opening: Record) -> Record:
        """``opening`` (the batch's only message sent so far) under a new batch id, which the
        message held after it carries too."""
        old = self._batch_id
        self.id = uuid.uuid4().hex
        self.name = f"atomic batch {self.id}"
        self._batch_id = self.id.encode()

        def renamed(headers: Any) -> Any:
            return tuple(
                (name, self._batch_id if name == "Nats-Batch-Id" and value == old else value)
                for name, value in headers or ()
            )

        if self._held is not None:
            self._held = with_headers(self._held, renamed(self._held.headers))
        return with_headers(opening, renamed(opening.headers))

    async def commit(self, prepare: bool) -> None:
        held = self._held
        assert held is not None
        record = with_headers(held, (*(held.headers or ()), _COMMIT))
        try:
            data, headers = await self._request(record, commit=True)
        except (ProducerkitError, TimeoutError) as exc:
            if isinstance(exc, AtomicBatchError):
                raise
            raise AtomicBatchError(
                f"{self.name}: the commit's answer was lost ({type(exc).__name__}: {exc}); "
                "it may have been stored",
                possibly_stored=True,
                kind="commit_unanswered",
            ) from exc
        stored = atomic_committed(data, headers, self.id, self._sequence)
        if isinstance(stored, AtomicBatchError):
            raise stored
        records = self._side.records
        self._writes.parts.reports.acked_run(records, stored - len(records) + 1)
