"""JetStream fast ingest (ADR-50 fast batches, nats-server 2.14+): many messages, one ack.

A stream whose configuration has ``allow_batched`` takes *fast batches*: every message carries
the batch in its reply subject, ``<inbox>.<id>.<flow>.fail.<n>.<op>.$FI`` (op 0 starts the
batch, 1 appends, 2 appends and commits, 3 commits without storing, 4 pings), and the server
stores each as it comes. It does not answer each one: it sends a flow-control ack every
``flow`` messages (``{"type":"ack","seq":n,"msgs":flow}``: the batch's messages up to n are
stored, and the ack interval from now on, which the server may lower when other fast publishers
share the stream), and one PubAck when the batch is committed (``{"seq":S,"count":N}``: its first
N messages are stored, the N-th at stream sequence S). In the ``fail`` gap mode used here a lost
message, or one the stream refuses, ends the batch: the server commits what it stored before
(a gap or error notice, then that PubAck) and stores nothing more of it.

A :class:`Lane` carries one connection's records for one stream, in order. It cuts them into
*chunks*, one fast batch each, of at most :data:`ACK_INTERVAL` messages:

- a lane's first chunk writes its first message and waits for the server's first reply, which
  says the ack interval it grants, before writing more (ADR-50: the server may be busy with
  other fast publishers); later chunks start at the interval last granted (the server answers a
  chunk's first message only once it has stored the chunk before, so waiting would leave it
  idle while the client writes). A chunk writes while fewer than ``flow * OUTSTANDING``
  messages are past its last flow-control ack;
- its last message commits it: the one written when the lane has nothing more to write at once
  (the end of a burst) or the chunk is full; records produced later start the next chunk;
- its PubAck settles it. Flow-control acks carry no stream sequence, so a record counts acked
  only at its chunk's PubAck, with its sequence: the N stored messages ending at S are at
  S-N+1 ... S where the stream had no other writer meanwhile, which the lane checks against the
  last sequence it knew before the chunk (``anchor``: the stream's last sequence when the lane
  was made, then each of its own stored messages' as their PubAcks come). Where another writer
  interleaved, the chunk's last message has S and the others no offset (None).

Some records go through the per-message path instead, one PubAck each, in the lane's order
(the chunk before them is committed first): those with a ``msg_id`` (the server drops a
duplicate in a fast batch without saying which message it was, and counts it in the batch),
with ``Nats-Expected-*`` headers (a failed expectation would end the batch), larger than the
stream's ``max_msg_size`` (refused, it would end the batch), and a burst of fewer than
:data:`MIN_CHUNK` records.

Failures: a message the stream refuses fails with the server's error (not stored); the
messages after it in its chunk, which the server dropped unjudged, are sent again each on its
own if nothing of the lane was written after them, else fail (not stored) rather than be stored
out of order. A chunk the server forgot (a restart; ``10208 batch publish ID unknown``) fails
its unsettled messages at once, possibly stored. A lost connection: the lane writes nothing
while disconnected, then pings each unsettled chunk, whose answer settles it (the batch ends at
the gap the lost bytes left) or says it was forgotten; a server that does not answer is pinged
every :data:`PING_AFTER` seconds while the lane waits, and what is unanswered fails at its
deadline (possibly stored where it was written; not stored where the lane still held it).
A committed chunk whose PubAck does not come is pinged too: a new stream leader holds the
batch as replicated, without a commit the old leader received, and answers the ping with a
flow-control ack covering every message (the lane commits again) or a gap (the batch ends
there, and its PubAck says what was stored); a ping no leader heard (503) is sent again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from collections.abc import Mapping
from typing import Final, Protocol

from producerkit._record import Record
from producerkit.backends.base import Reports
from producerkit.backends.nats.pubacks import batch_puback, flow_ack, flow_notice, puback_error
from producerkit.errors import DeliveryError, ProducerkitError

logger = logging.getLogger("producerkit.nats")

#: Messages per chunk (each acked by its commit's PubAck), and the ack interval asked of the
#: server for its flow-control acks (it grants at most 500). Measured: docs/jetstream.md.
ACK_INTERVAL: Final = 250
#: Ack intervals a lane may write past the last flow-control ack (ADR-50's recommended 2).
OUTSTANDING: Final = 2
#: The fewest records, ready at once, that start a chunk; fewer go one PubAck each.
MIN_CHUNK: Final = 8
#: Seconds a lane waits for a reply to a chunk before it pings it (at most; a quarter of the
#: producer's timeout where that is shorter).
PING_AFTER: Final = 1.0

START, APPEND, COMMIT, COMMIT_EOB, PING = 0, 1, 2, 3, 4

#: JetStream error codes about the fast batch, not the message (the message was not stored and
#: is sent again on its own): disabled on the stream, bad reply pattern, bad id, too many
#: batches in flight.
BATCH_CODES: Final = frozenset({10205, 10206, 10207, 10211})
DISABLED: Final = 10205
#: The server does not know the batch (it restarted, or abandoned it after 10 s of silence).
UNKNOWN_BATCH: Final = 10208

_EXPECTED = "Nats-Expected-"


def _expects(headers: tuple[tuple[str, bytes], ...]) -> bool:
    """Whether ``headers`` hold an expectation (``Nats-Expected-*``)."""
    return any(name.startswith(_EXPECTED) for name, _ in headers)


def _too_large(record: Record, max_size: int) -> bool:
    """Whether the stream may refuse ``record`` for its size (headers counted generously)."""
    size = len(record.value or b"")
    if record.headers is not None:
        size += 16 + sum(len(name) + len(value) + 4 for name, value in record.headers)
    return size > max_size


class LaneHost(Protocol):
    """What a lane needs of its JetStream connection."""

    reports: Reports
    timeout: float
    #: Every unsettled chunk of the connection's lanes, by its id (how replies find theirs).
    chunks: dict[bytes, Chunk]

    def writable(self) -> bool:
        """Whether the lane may write now (connected, on the fast client path)."""
        ...

    def subject(self, record: Record) -> str: ...

    def write_run(self, records: list[Record], prefix: bytes, first: int, last_op: int) -> None:
        """Write ``records`` into a fast batch: record i with reply subject
        ``<prefix><first + i>.<op>.$FI``, op START for message 1, ``last_op`` for the last
        record, APPEND for the others."""

    def write_control(self, subject: str, reply: str) -> None:
        """Write an empty message (a ping, an end of batch) on ``subject``."""

    def send_one(self, record: Record) -> None:
        """Write ``record`` on the per-message PubAck path."""

    def wait_out_election(self, record: Record) -> bool:
        """``record`` was answered "no responders" (not stored): where its stream exists, the
        host publishes it again after the election (or fails it at its deadline) and says
        True; False where it takes the stream for missing."""
        ...

    def fast_reply_prefix(self) -> str:
        """``<inbox>.``: where the replies to fast batches arrive."""
        ...


class Chunk:
    """One fast batch: the records written into it, in batch order, and what the server said."""

    __slots__ = (
        "acked",
        "committed",
        "ended",
        "error",
        "flow",
        "key",
        "lane",
        "last_reply",
        "last_write",
        "prefix",
        "prefix_bytes",
        "records",
        "subject",
    )

    def __init__(self, lane: Lane, key: str, prefix: str, now: float) -> None:
        self.lane = lane
        self.key = key.encode()
        #: The reply subject up to the message's number.
        self.prefix = prefix
        self.prefix_bytes = prefix.encode()
        self.records: list[Record] = []
        #: The highest batch sequence a flow-control ack covered, and the ack interval granted
        #: (0 until the server's first reply: nothing more is written before it).
        self.acked = 0
        self.flow = 0
        #: The commit was written (a COMMIT or COMMIT_EOB message).
        self.committed = False
        #: The server ended the batch (a gap or an error): its PubAck is on the way.
        self.ended = False
        #: ``(n, error)``: message n was refused.
        self.error: tuple[int, ProducerkitError] | None = None
        self.last_reply = now
        #: The lane's write count at this chunk's last write.
        self.last_write = 0
        #: A subject of the chunk's stream (its first message's), for pings.
        self.subject = ""

    @property
    def written(self) -> int:
        return len(self.records)

    def may_write(self) -> bool:
        return not self.ended and len(self.records) < self.acked + self.flow * OUTSTANDING


class Lane:
    """One connection's records for one stream that allows fast batches (module docstring)."""

    def __init__(
        self, host: LaneHost, stream: str, anchor: int | None, max_size: int | None = None
    ) -> None:
        self.host = host
        self.stream = stream
        #: The stream's max_msg_size (None: no limit): a larger message goes on its own, as the
        #: stream refuses it, and a refusal would end a fast batch.
        self.max_size = max_size
        #: Records handed over and not written yet, in order.
        self.queue: deque[Record] = deque()
        #: The chunk being written (None between chunks).
        self.chunk: Chunk | None = None
        #: Unsettled chunks, oldest first.
        self.unsettled: dict[bytes, Chunk] = {}
        #: The stream sequence of the latest message of this lane known stored (module
        #: docstring); None where unknown.
        self.anchor = anchor
        #: False once the stream said it takes no fast batches (it was reconfigured).
        self.fast = True
        #: Records to send on the per-message path, by ``seq`` (sent again after a chunk ended).
        self.single: set[int] = set()
        #: Writes so far (chunk messages and per-message ones alike).
        self.writes = 0
        #: The ack interval the server last granted a chunk of this lane (0: none yet).
        self.granted = 0
        #: Records acked through fast batches, those of them acked with no offset, and chunks made.
        self.acked_count = 0
        self.unknown_offsets = 0
        self.chunk_count = 0
        self._id_base = secrets.token_hex(6)
        self._timer: asyncio.TimerHandle | None = None
        self._emptied: asyncio.Event | None = None

    # ------------------------------------------------------------------ writing

    def drain(self) -> None:
        """Write what may be written now, in order (module docstring)."""
        host = self.host
        if not host.writable():
            return
        while True:
            head = self._head()
            chunk = self.chunk
            if chunk is None:
                if head is None:
                    self._signal_emptied()
                    return
                if self._fits(head) and self._burst():
                    self.chunk = self._open(head)
                    continue
                self.queue.popleft()
                self.single.discard(head.seq)
                self.writes += 1
                host.send_one(head)
                continue
            limit = chunk.acked + chunk.flow * OUTSTANDING
            room = min(max(limit, 1), ACK_INTERVAL) - chunk.written
            if room <= 0 or chunk.ended:
                if head is None:
                    self._signal_emptied()
                self._wait()
                return
            if head is None or not self._fits(head):
                self._end(chunk)  # its next record went away (a deadline): commit it empty
                continue
            run = self._take(room)
            after = self._head()
            last = (
                chunk.written + len(run) >= ACK_INTERVAL or after is None or not self._fits(after)
            )
            self._write(chunk, run, COMMIT if last else APPEND)
            if last:
                self.chunk = None

    def _head(self) -> Record | None:
        """The first queued record still in flight (those settled by their deadline are
        dropped: they must not be written any more)."""
        queue, pending = self.queue, self.host.reports.pending
        while queue:
            record = queue[0]
            if record.seq in pending:
                return record
            queue.popleft()
        return None

    def _take(self, room: int) -> list[Record]:
        """Up to ``room`` records off the queue's head that fit a chunk (at least one)."""
        queue, pending, single = self.queue, self.host.reports.pending, self.single
        run: list[Record] = []
        while queue and len(run) < room:
            record = queue[0]
            if record.seq not in pending:
                queue.popleft()
                continue
            if (
                record.msg_id is not None
                or (single and record.seq in single)
                or (record.headers is not None and _expects(record.headers))
                or (self.max_size is not None and _too_large(record, self.max_size))
            ):
                break
            run.append(queue.popleft())
        return run

    def _fits(self, record: Record) -> bool:
        """Whether a fast batch can carry ``record`` (module docstring)."""
        if record.msg_id is not None or (self.single and record.seq in self.single):
            return False
        if record.headers is not None and _expects(record.headers):
            return False
        if self.max_size is not None and _too_large(record, self.max_size):
            return False
        return self.fast

    def _burst(self) -> bool:
        """Whether at least MIN_CHUNK records that fit a chunk are ready at the queue's head."""
        count = 0
        pending = self.host.reports.pending
        for record in self.queue:
            if record.seq not in pending:
                continue
            if not self._fits(record):
                return False
            count += 1
            if count >= MIN_CHUNK:
                return True
        return False

    def _signal_emptied(self) -> None:
        if self._emptied is not None:
            self._emptied.set()
            self._emptied = None

    async def written(self, timeout: float) -> None:
        """Wait until everything handed to the lane so far is written (at most ``timeout``
        seconds): a message written past the lane (an atomic batch's) then comes after them."""
        self.drain()
        if not self.queue:
            return
        if self._emptied is None:
            self._emptied = asyncio.Event()
        try:
            await asyncio.wait_for(self._emptied.wait(), timeout)
        except TimeoutError:
            logger.debug("lane %r still holds messages after %ss", self.stream, timeout)

    def _open(self, first: Record) -> Chunk:
        """A new chunk. It may write at the ack interval the server granted this lane's last
        chunk (the server answers a chunk's first message only after the chunk before it, so
        waiting would leave it idle while the client writes); the lane's first chunk, with none
        granted yet, waits for its first reply."""
        self.chunk_count += 1
        key = f"{self._id_base}{self.chunk_count:x}"
        now = time.monotonic()
        prefix = f"{self.host.fast_reply_prefix()}{key}.{ACK_INTERVAL}.fail."
        chunk = Chunk(self, key, prefix, now)
        chunk.flow = self.granted
        chunk.subject = self.host.subject(first)
        self.unsettled[chunk.key] = chunk
        self.host.chunks[chunk.key] = chunk
        return chunk

    def _write(self, chunk: Chunk, run: list[Record], last_op: int) -> None:
        """Write ``run`` into ``chunk``: numbered on from its last message, the first message of
        the chunk starting it, the last one of the run ``last_op``."""
        first = chunk.written + 1
        chunk.records.extend(run)
        self.writes += 1
        chunk.last_write = self.writes
        if last_op == COMMIT:
            chunk.committed = True
            self._wait()  # its PubAck is waited for: pinged if it does not come
        self.host.write_run(run, chunk.prefix_bytes, first, last_op)

    def _end(self, chunk: Chunk) -> None:
        """Commit ``chunk`` without storing anything more (an end-of-batch message, numbered
        after its last: where the server lacks a message before it, that is a gap, and the
        batch ends there all the same)."""
        if self.chunk is chunk and not chunk.ended:
            self.chunk = None  # an ended chunk holds the lane until its PubAck settles it
        if chunk.committed and not chunk.ended:
            return
        self._commit_again(chunk)

    def _commit_again(self, chunk: Chunk) -> None:
        """Write an end-of-batch commit after the chunk's last message (ending it, or committing
        it once more where a new stream leader lost its commit)."""
        chunk.committed = True
        self._wait()
        if self.host.writable():
            reply = f"{chunk.prefix}{chunk.written + 1}.{COMMIT_EOB}.$FI"
            self.host.write_control(chunk.subject, reply)

    def _ping(self, chunk: Chunk) -> None:
        """Ask the server for the chunk's latest flow-control ack (or the gap it has)."""
        if chunk.written and self.host.writable():
            self.host.write_control(chunk.subject, f"{chunk.prefix}{chunk.written}.{PING}.$FI")

    def _wait(self) -> None:
        """The lane waits for a reply: ping the chunk if none comes (module docstring)."""
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._ping_after(), self._check)

    def _ping_after(self) -> float:
        return min(PING_AFTER, self.host.timeout / 4)

    def _check(self) -> None:
        """Ping the chunk being written where it waits for a reply that has not come, and each
        committed chunk whose PubAck has not come (a new stream leader holds a batch without the
        commit the old one received: the ping's answer says what it has)."""
        self._timer = None
        self.sweep()
        now = time.monotonic()
        waiting = False
        for chunk in list(self.unsettled.values()):
            if chunk is self.chunk and chunk.may_write():
                continue
            if chunk is not self.chunk and not chunk.committed:
                continue
            waiting = True
            if now - chunk.last_reply >= self._ping_after():
                self._ping(chunk)
                chunk.last_reply = now
        if waiting:
            self._wait()

    # ------------------------------------------------------------------ replies

    def on_reply(
        self,
        chunk: Chunk,
        number: int,
        op: int,
        data: bytes,
        headers: Mapping[str, str] | None,
    ) -> None:
        """A reply from the server to message ``number`` (op ``op``) of ``chunk``."""
        chunk.last_reply = time.monotonic()
        flow = None if headers else flow_ack(data)
        if flow is not None:
            acked, interval = flow
            chunk.acked = max(chunk.acked, acked)
            chunk.flow = self.granted = max(interval, 1)
            if chunk is self.chunk:
                self.drain()
            elif op == PING and chunk.committed and not chunk.ended and acked >= chunk.written:
                # The server holds every message of a committed chunk but no commit (a new
                # leader): commit it again (a commit that did arrive makes this one a no-op).
                self._commit_again(chunk)
            return
        notice = None if headers else flow_notice(data)
        if notice is not None:
            chunk.ended = True
            kind, at = notice
            if kind == "err" and chunk.error is None:
                chunk.error = (at, self._refusal(chunk, at, data, headers))
            return
        stored = None if headers else batch_puback(data)
        if stored is not None:
            sequence, count = stored
            if op == PING and number == 1 and count == 0:
                # The server made a new batch for this ping: it forgot the one the first message
                # started (or never got it), and cannot say whether that message was stored.
                self._forget(chunk, "the server forgot it", possibly_stored=True)
            else:
                self._settle(chunk, sequence, count)
            self.drain()
            return
        no_responders = not data and (headers or {}).get("Status") == "503"
        # Only the first message's own 503 says nothing of the chunk was stored: a ping of a
        # chunk of one message has number 1 too, and its 503 says only that no leader heard it.
        if number == 1 and op == START and no_responders and self._election(chunk):
            self.drain()
            return
        if no_responders and op in (PING, COMMIT_EOB):
            # No leader heard the ping or the commit (an election): not an answer. The chunk is
            # pinged again until the new leader says what it holds, or its records' deadlines.
            chunk.last_reply = time.monotonic() - self._ping_after() / 2
            self._wait()
            return
        self._refused(chunk, number, op, self._refusal(chunk, number, data, headers))
        self.drain()

    def _election(self, chunk: Chunk) -> bool:
        """The chunk's first message had no responders: the stream has no leader (an election)
        and stored nothing of the chunk (its later messages get the same answer). Its records
        wait the election out on the host's per-message path; False where the host takes the
        stream for missing (the first record then fails as a refusal would)."""
        pending = self.host.reports.pending
        records = [record for record in chunk.records if record.seq in pending]
        if not records or not self.host.wait_out_election(records[0]):
            return False
        self._drop(chunk)
        for record in records[1:]:
            self.host.wait_out_election(record)
        return True

    def _refusal(
        self, chunk: Chunk, number: int, data: bytes, headers: Mapping[str, str] | None
    ) -> ProducerkitError:
        subject = chunk.subject
        if 0 < number <= chunk.written:
            subject = self.host.subject(chunk.records[number - 1])
        if not data and (headers or {}).get("Status") == "503":
            # The stream existed (this lane was made from it): its leader is being elected.
            return DeliveryError(
                f"no leader of stream {self.stream!r} answered (503 no responders: a leader "
                "election); the fast batch was cut there"
            )
        error = puback_error(subject, data, headers)
        return error or DeliveryError(f"unreadable fast batch reply {data[:200]!r}")

    def _refused(self, chunk: Chunk, number: int, op: int, error: ProducerkitError) -> None:
        """An error answering message ``number``: not stored."""
        code = getattr(error, "code", None)
        if code == DISABLED:
            self.fast = False
            logger.info("stream %r takes no fast batches any more", self.stream)
        if code == UNKNOWN_BATCH:
            if chunk.ended and op != PING:
                return  # a message written after the server ended the batch: its PubAck comes
            if chunk.committed and op in (PING, COMMIT_EOB):
                # The commit may have been stored just before this (its PubAck follows once it
                # is replicated): the chunk fails only if that PubAck does not come.
                asyncio.get_running_loop().call_later(
                    self._ping_after(), self._forget_unsettled, chunk, str(error)
                )
                return
            self._forget(chunk, str(error), possibly_stored=True)
            return
        if op in (PING, COMMIT_EOB) or not 0 < number <= chunk.written:
            self._forget(chunk, str(error), possibly_stored=True)
            return
        record = chunk.records[number - 1]
        if code not in BATCH_CODES:
            self.host.reports.failed(record, error, False)
        if number == 1:  # the batch did not start: nothing else was written into it
            self._settle(chunk, 0, 0)
            return
        if not chunk.ended:  # the server lacks it: a gap at the next message ends the batch
            chunk.ended = True
            self._end(chunk)

    def _settle(self, chunk: Chunk, sequence: int, count: int) -> None:
        """The chunk's PubAck: its first ``count`` messages are stored, the last at
        ``sequence``; the others were not (module docstring)."""
        self._drop(chunk)
        records = chunk.records
        count = max(0, min(count, len(records)))
        if count:
            anchor = self.anchor
            exact = anchor is not None and sequence - anchor == count
            self.anchor = sequence
            if not exact and count > 1:
                self.unknown_offsets += count - 1
                if self.unknown_offsets == count - 1:
                    logger.info(
                        "fast batches on stream %r interleave with other writers' messages "
                        "(another producer, or another connection of this one): their "
                        "messages are acked with offset=None but each batch's last "
                        "(fast_ingest=False gives every offset)",
                        self.stream,
                    )
            self._acked(records[:count], sequence - count + 1 if exact else None, sequence)
        if chunk.error is not None:
            number, error = chunk.error
            if count < number <= len(records) and getattr(error, "code", None) not in BATCH_CODES:
                self.host.reports.failed(records[number - 1], error, False)
        pending = self.host.reports.pending
        rest = [record for record in records[count:] if record.seq in pending]
        if not rest:
            return
        if self.writes == chunk.last_write:  # nothing written after them: send them again
            self.single.update(record.seq for record in rest)
            self.queue.extendleft(reversed(rest))
            return
        error = DeliveryError(
            f"not stored: the server ended the fast batch on stream {self.stream!r} at an earlier "
            "message, and later messages were already written (sending it again would store it "
            "out of order)"
        )
        for record in rest:
            self.host.reports.failed(record, error, False)

    def _acked(self, records: list[Record], first: int | None, last: int) -> None:
        """Ack ``records`` stored at ``first``, ``first + 1``, ...; or, where ``first`` is
        None, the last at ``last`` and the others at no known sequence."""
        reports = self.host.reports
        self.acked_count += len(records)
        head = records[0]
        same = all(
            record.topic == head.topic and record.partition == head.partition for record in records
        )
        try:
            if same and first is not None:
                reports.acked_run(records, first)
                return
            offsets: list[int | None]
            if first is None:
                offsets = [None] * len(records)
                offsets[-1] = last
            else:
                offsets = list(range(first, first + len(records)))
            groups: dict[tuple[str, int | None], tuple[list[Record], list[int | None]]] = {}
            for record, offset in zip(records, offsets, strict=True):
                group = groups.setdefault((record.topic, record.partition), ([], []))
                group[0].append(record)
                group[1].append(offset)
            for grouped, grouped_offsets in groups.values():
                reports.acked_each(grouped, grouped_offsets)
        except Exception:  # never into the reader: the other replies must still be handled
            logger.exception("error acking a fast batch")

    def _forget(self, chunk: Chunk, why: str, *, possibly_stored: bool) -> None:
        """The server no longer knows ``chunk``: its unsettled records fail."""
        self._drop(chunk)
        error = DeliveryError(
            f"fast batch on stream {self.stream!r} ended without its PubAck ({why})"
            + ("; the message may have been stored" if possibly_stored else ""),
            code=UNKNOWN_BATCH,
        )
        for record in chunk.records:
            self.host.reports.failed(record, error, possibly_stored)

    def _forget_unsettled(self, chunk: Chunk, why: str) -> None:
        if chunk.key in self.unsettled:
            self._forget(chunk, why, possibly_stored=True)

    def _drop(self, chunk: Chunk) -> None:
        self.unsettled.pop(chunk.key, None)
        self.host.chunks.pop(chunk.key, None)
        if self.chunk is chunk:
            self.chunk = None

    # ------------------------------------------------------------------ the connection

    def sweep(self) -> None:
        """Forget the chunks none of whose records is in flight any more (they failed at their
        deadlines), the one being written too if nothing waits for it: their replies no longer
        matter (a PubAck that comes after all leaves the anchor behind: offsets unknown, never
        wrong)."""
        pending = self.host.reports.pending
        for chunk in list(self.unsettled.values()):
            if chunk is self.chunk and self._head() is not None:
                continue
            if not any(record.seq in pending for record in chunk.records):
                self._drop(chunk)

    def reconnected(self) -> None:
        """After a reconnect: bytes written before it may be lost. Each unsettled chunk is
        pinged before anything more is written into it; its answer settles it or lets it go on."""
        for chunk in list(self.unsettled.values()):
            if chunk is self.chunk:
                chunk.flow = 0  # wait for the ping's answer
            self._ping(chunk)
            chunk.last_reply = time.monotonic()
        self.drain()
        if self.chunk is not None:
            self._wait()

    def refused(self, subject: str, error: ProducerkitError) -> bool:
        """The server refused a publish to ``subject`` (permissions): if it was one of this
        lane's chunk messages, the oldest unsettled one, it fails (not stored) and its chunk
        ends at it. Whether one was found."""
        pending = self.host.reports.pending
        for chunk in self.unsettled.values():
            for number, record in enumerate(chunk.records, 1):
                if record.seq in pending and self.host.subject(record) == subject:
                    self._refused(chunk, number, APPEND, error)
                    return True
        return False

    def unwritten(self, numbers: set[int]) -> set[int]:
        """Which of ``numbers`` (record seqs) the lane holds unwritten."""
        return {record.seq for record in self.queue if record.seq in numbers}

    def take_unsent(self) -> list[Record]:
        pending = self.host.reports.pending
        taken = [record for record in self.queue if record.seq in pending]
        self.queue.clear()
        return taken

    def close(self, error: ProducerkitError, unwritten: ProducerkitError) -> None:
        """Fail what the lane still holds with ``unwritten`` (not stored) and every unsettled
        chunk's records with ``error`` (written: possibly stored)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        reports = self.host.reports
        for record in self.take_unsent():
            reports.failed(record, unwritten, False)
        self._signal_emptied()
        for chunk in list(self.unsettled.values()):
            self._drop(chunk)
            for record in chunk.records:
                reports.failed(record, error, True)


def fast_reply(token: bytes) -> tuple[bytes, int, int] | None:
    """``(chunk id, message number, op)`` of a fast batch reply's subject after the inbox
    (``<id>.<flow>.<gap>.<n>.<op>.$FI``); None if it is not one."""
    parts = token.split(b".")
    if len(parts) != 6 or parts[5] != b"$FI":
        return None
    try:
        return parts[0], int(parts[3]), int(parts[4])
    except ValueError:
        return None
