"""JetStream: acked, stored publishes, pipelined with no future or task per message.

Every publish carries a reply subject ``<inbox>.<n>`` and one wildcard subscription receives all
the PubAcks. The PubAck's stream sequence becomes the Delivery offset. ``msg_id`` sets
``Nats-Msg-Id``, which the server uses to drop duplicates within the stream's duplicate window: a
duplicate's PubAck is reported as ``Delivery.duplicate``. A refusal is failed with its JetStream
error code (``ExpectationFailed`` for a ``Nats-Expected-*`` header that did not hold).

The plain PubAcks that arrive together (one socket read on the fast path, one turn of the event
loop on the public path) are reported together, one ``acked_each`` per subject, so an
``on_outcome`` hook is called once per read rather than once per message.

A topic whose stream allows fast batches (``allow_batched``, nats-server 2.14+; asked when the
topic's first message is produced, and set on the streams ``create_stream`` makes) goes through
a :class:`~producerkit.backends.nats.fast_ingest.Lane` instead, on the fast client path unless
``fast_ingest=False``: its records are written in fast batches, acked a batch at a time; the
replies to them come on the same subscription (``<inbox>.<id>.<flow>.fail.<n>.<op>.$FI``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from producerkit._record import Record
from producerkit.backends import _clients
from producerkit.backends.nats import _natspy_compat
from producerkit.backends.nats.connection import (
    _ERROR_LOG_INTERVAL,
    NatsClientConnection,
    until_set,
)
from producerkit.backends.nats.errors import DUPLICATE_IN_PROCESS, AnswerLost, translate
from producerkit.backends.nats.fast_ingest import APPEND, START, Chunk, Lane, fast_reply
from producerkit.backends.nats.pubacks import (
    batch_puback,
    is_plain,
    puback_duplicate,
    puback_error,
    puback_sequence,
)
from producerkit.errors import (
    AuthorizationError,
    BrokerUnavailable,
    DeliveryError,
    ProduceTimeout,
)

logger = logging.getLogger("producerkit.nats")

#: Seconds the first stream lookup (or creation) waits for its answer; each attempt lost on the
#: way waits twice as long as the one before, up to ``_STREAM_WAIT_MAX``.
_STREAM_WAIT = 0.5
_STREAM_WAIT_MAX = 4.0
#: Pause before asking again after an attempt that failed at once (doubled, same cap).
_STREAM_PAUSE = 0.1
#: Seconds the stream info that tells whether a topic takes fast batches waits for its answer.
_LANE_WAIT = 2.0
#: A stream that answers "no responders" (503) after it stored messages has no leader (an
#: election): its messages are published again after this pause, doubled while the 503s go on,
#: up to ``_ELECTION_PAUSE_MAX``, within each message's deadline.
_ELECTION_PAUSE = 0.05
_ELECTION_PAUSE_MAX = 1.0
#: A message whose copy published before is still being stored (``DUPLICATE_IN_PROCESS``) is
#: published again after this pause (doubled at each such answer, up to ``_ELECTION_PAUSE_MAX``),
#: within its deadline: the stream then answers with the stored copy's sequence.
_IN_PROCESS_PAUSE = 0.1
#: Seconds between two looks for PubAcks a leader change lost (``_check_lost_acks``).
_ACK_CHECK = 1.0
#: The first nats-server with fast batches.
_FAST_INGEST_SERVER = (2, 14)


class JetStreamConnection(NatsClientConnection):
    """Pipelined publishes, PubAcks matched by reply subject on one subscription."""

    def setup(self) -> None:
        super().setup()
        self._inbox = ""  # set once connected
        self._inbox_prefix_length = 0
        self._awaiting: dict[int, Record] = {}  # reply token -> the record awaiting its PubAck
        self._next_token = 0
        self._gathered: list[tuple[Record, bytes]] = []  # the public path's PubAcks of one read
        self._last_sweep = time.monotonic()
        # Fast ingest: each topic's lane (topics of one stream share it), and every unsettled
        # chunk of those lanes by id, where the replies find it.
        self._lanes: dict[str, Lane] = {}
        self._stream_lanes: dict[str, Lane] = {}
        self.chunks: dict[bytes, Chunk] = {}
        self._drain_scheduled = False
        self._spawned: set[asyncio.Future[None]] = set()
        # Leader elections: the topics whose stream was found or stored a message (a 503 for
        # them is an election, not a missing stream), the records waiting one out by seq, the
        # timer that publishes them again and its pause.
        self._stream_topics: set[str] = set()
        self._electing: dict[int, Record] = {}
        self._election_timer: asyncio.TimerHandle | None = None
        # Records published again after an attempt that may have stored them (its PubAck lost
        # with a connection or a leader), by seq: a later attempt's refusal, or every later
        # attempt answered "no responders", does not say they were not stored. And those whose
        # earlier copy the stream is still storing, waiting to be published again.
        self._maybe_stored: set[int] = set()
        # By seq: the record, the timer that publishes it again (None once it did), its pause.
        self._in_process: dict[int, tuple[Record, asyncio.TimerHandle | None, float]] = {}
        self._election_pause = _ELECTION_PAUSE
        self._last_election_log = 0.0
        # Lost PubAcks (a leader that died or stepped down with messages in hand): each
        # topic's last acked record's seq, the last token given at the previous check, its timer.
        self._acked_seq: dict[str, int] = {}
        self._ack_mark = 0
        self._ack_timer: asyncio.TimerHandle | None = None
        # Set when the connection is lost: a request written before then lost its answer.
        self._connection_lost = asyncio.Event()

    async def connect(self) -> None:
        await super().connect()
        self._inbox = self._nc.new_inbox()
        self._inbox_prefix_length = len(self._inbox) + 1
        subscription = await self._nc.subscribe(
            self._inbox + ".>", cb=self._on_ack, pending_msgs_limit=-1, pending_bytes_limit=0
        )
        if self.client_path == _clients.FAST:
            _natspy_compat.deliver_pubacks_directly(
                self._nc, subscription, self._inbox, self._handle_ack, self._settle_acks
            )
        self._ack_timer = asyncio.get_running_loop().call_later(_ACK_CHECK, self._check_lost_acks)

    async def prepare_topic(self, topic: str) -> int | None:
        stream = None
        if self.options.get("create_stream"):
            stream = await self._ensure_stream(topic)
            self._stream_topics.add(topic)
        if self._fast_ingest_possible():
            why_not = await self._learn_lane(topic, stream)
        else:
            why_not = self._why_no_fast_ingest()
        mode = "fast ingest" if why_not is None else f"per message: {why_not}"
        # once per producer and topic (its other connections decide alike), and on a change
        if self.index == 0 and self.topic_modes.get(topic) != mode:
            logger.info("JetStream topic %r is written with %s", topic, mode)
        self.topic_modes[topic] = mode
        return self._partitions

    def _why_no_fast_ingest(self) -> str:
        if not self.options.get("fast_ingest", True):
            return "fast_ingest=False"
        if self.client_path != _clients.FAST:
            return f"nats-py's public path ({self.client_path_reason})"
        version = self._nc.connected_server_version
        return f"nats-server {version} has no fast batches (2.14+ has)"

    @property
    def fast_ingest_topics(self) -> dict[str, str]:
        """The topics this connection writes in fast batches, with their streams' names."""
        return {topic: lane.stream for topic, lane in self._lanes.items() if lane.fast}

    @property
    def fast_ingest_acked(self) -> int:
        """Messages acked through fast batches on this connection so far."""
        return sum(lane.acked_count for lane in self._stream_lanes.values())

    def _fast_ingest_possible(self) -> bool:
        """Fast ingest is on (``fast_ingest``, default true), on the fast client path, with a
        server that has it."""
        if not self.options.get("fast_ingest", True) or self.client_path != _clients.FAST:
            return False
        return self._server_has_fast_ingest()

    def _server_has_fast_ingest(self) -> bool:
        version = self._nc.connected_server_version
        try:
            return (version.major, version.minor) >= _FAST_INGEST_SERVER
        except (TypeError, ValueError):  # an unparsable version
            return False

    async def _learn_lane(self, topic: str, stream: str | None) -> str | None:
        """Give ``topic`` a fast-ingest lane if its stream allows fast batches (and, for a
        partitioned topic, stores every partition's subject); else say why not. Any trouble
        asking leaves the topic on the per-message path."""
        probe = topic if self._partitions is None else f"{topic}.0"
        try:
            js = self._nc.jetstream(timeout=min(self.timeout, _LANE_WAIT))
            if stream is None:
                stream = await js.find_stream_name_by_subject(probe)
            info = await js.stream_info(stream)
        except Exception as exc:
            return f"its stream could not be asked ({translate(exc)})"
        config = info.config
        if not getattr(config, "allow_batched", False):
            return (
                f"stream {stream!r} does not allow fast batches (allow_batched; a stream "
                "create_stream=True creates on nats-server 2.14+ does)"
            )
        if self._partitions is not None and not _covers_partitions(config.subjects or (), topic):
            return f"stream {stream!r} does not store every partition's subject ({topic}.>)"
        lane = self._stream_lanes.get(stream)
        if lane is None:
            anchor = info.state.last_seq if info.state is not None else None
            max_size = config.max_msg_size if (config.max_msg_size or 0) > 0 else None
            lane = Lane(self, stream, anchor, max_size)
            self._stream_lanes[stream] = lane
        self._lanes[topic] = lane
        return None

    async def _ensure_stream(self, topic: str) -> str:
        """Find the stream storing ``topic``, or create one. A request lost on the way (a
        blackhole, a reconnect) is asked again, each attempt waiting longer for its answer
        (``_STREAM_WAIT`` doubled up to ``_STREAM_WAIT_MAX``), until the producer's timeout
        has passed: the deadline of the messages waiting for it."""
        deadline = time.monotonic() + self.timeout
        wait, pause = _STREAM_WAIT, _STREAM_PAUSE
        for attempt in itertools.count(1):
            asked = time.monotonic()
            try:
                return await self._find_or_add_stream(topic, min(wait, max(deadline - asked, 0.01)))
            except Exception as exc:
                error = translate(exc)
                left = deadline - time.monotonic()
                if not isinstance(error, ProduceTimeout | BrokerUnavailable) or left <= 0:
                    raise error from exc
                logger.info(
                    "JetStream stream lookup for %r, attempt %d: %s; asking again",
                    topic,
                    attempt,
                    error,
                )
            if time.monotonic() - asked < wait:  # failed at once (not connected): pause
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, _STREAM_WAIT_MAX)
            wait = min(wait * 2, _STREAM_WAIT_MAX)
        raise AssertionError("unreachable")

    async def _find_or_add_stream(self, topic: str, wait: float) -> str:
        """One attempt of :meth:`_ensure_stream`, each request waiting ``wait`` seconds for its
        answer: the stream's name. A stream created by an earlier attempt whose answer was lost
        is found here. A stream it creates allows fast batches where the server has them."""
        js = self._nc.jetstream(timeout=wait)
        probe = topic if self._partitions is None else f"{topic}.0"
        try:
            return str(await js.find_stream_name_by_subject(probe))
        except nats.js.errors.NotFoundError:
            pass
        name = re.sub(r"[^A-Za-z0-9_-]", "_", topic)
        storage = self.options.get("stream_storage", "memory")
        allow: dict[str, Any] = {"allow_atomic": True} if self.options.get("allow_atomic") else {}
        if self._server_has_fast_ingest():
            allow["allow_batched"] = True
        replicas = self.options.get("stream_replicas", 1)
        await js.add_stream(
            name=name,
            subjects=[topic, f"{topic}.>"],
            storage=storage,
            num_replicas=replicas,
            **allow,
        )
        return name

    def send(self, record: Record) -> Awaitable[None] | None:
        if self._lanes:
            lane = self._lanes.get(record.topic)
            if lane is not None:
                lane.queue.append(record)
                if not self._drain_scheduled:
                    self._drain_scheduled = True
                    asyncio.get_running_loop().call_soon(self._drain_lanes)
                return None
        token = self._next_token = self._next_token + 1
        self._awaiting[token] = record
        return self.publish(record, reply=f"{self._inbox}.{token}")

    # ------------------------------------------------------------------ fast ingest lanes

    def _drain_lanes(self) -> None:
        """The end of the loop turn that handed records to lanes: each writes what it may."""
        self._drain_scheduled = False
        for lane in self._stream_lanes.values():
            if lane.queue:
                try:
                    lane.drain()
                except Exception as exc:  # never lose records silently: fail what it holds
                    logger.exception("fast ingest lane %r failed", lane.stream)
                    lane.close(translate(exc), translate(exc))

    def writable(self) -> bool:
        return self._direct_writer is not None and self._nc.is_connected

    def write_run(self, records: list[Record], prefix: bytes, first: int, last_op: int) -> None:
        writer = self._direct_writer
        last = first + len(records) - 1
        if writer is None:  # not on the fast client path: lanes are not made there
            raise BrokerUnavailable("fast ingest needs the fast client path")
        partitions = self._partitions
        parts: list[bytes] = []
        payload = 0
        for number, record in enumerate(records, first):
            op = START if number == 1 else last_op if number == last else APPEND
            value: bytes = record.value  # type: ignore[assignment]
            subject = record.topic if partitions is None else f"{record.topic}.{record.partition}"
            block = self.header_block(record)
            if block is None:
                line = b"PUB %s %s%d.%d.$FI %d\r\n" % (
                    subject.encode(),
                    prefix,
                    number,
                    op,
                    len(value),
                )
            else:
                line = b"HPUB %s %s%d.%d.$FI %d %d\r\n%s" % (
                    subject.encode(),
                    prefix,
                    number,
                    op,
                    len(block),
                    len(block) + len(value),
                    block,
                )
            parts += (line, value, b"\r\n")
            payload += len(value)
        self._spawn(writer.write_many(b"".join(parts), len(records), payload))

    def write_control(self, subject: str, reply: str) -> None:
        writer = self._direct_writer
        if writer is not None:
            self._spawn(writer.write(f"PUB {subject} {reply} 0\r\n".encode(), b""))

    def send_one(self, record: Record, possibly_stored: bool = False) -> None:
        """Publish ``record``, its PubAck awaited by token; if that fails, it fails,
        ``possibly_stored`` as an earlier attempt may have left it."""
        token = self._next_token = self._next_token + 1
        self._awaiting[token] = record
        try:
            self._spawn(self.publish(record, reply=f"{self._inbox}.{token}"))
        except Exception as exc:
            del self._awaiting[token]
            self.reports.failed(record, translate(exc), possibly_stored)

    def fast_reply_prefix(self) -> str:
        return f"{self._inbox}."

    def _spawn(self, handed_off: Awaitable[None] | None) -> None:
        """Run the awaitable a write returned (a flush of a full buffer) on its own."""
        if handed_off is None:
            return
        future = asyncio.ensure_future(handed_off)
        self._spawned.add(future)
        future.add_done_callback(self._spawn_done)

    def _spawn_done(self, future: asyncio.Future[None]) -> None:
        self._spawned.discard(future)
        if not future.cancelled() and future.exception() is not None:
            logger.debug("flushing fast ingest writes: %s", future.exception())

    def _fast_reply(self, token: bytes, data: bytes, headers: Mapping[str, str] | None) -> None:
        """A reply to a fast batch's message (or one that is not ours: ignored)."""
        parsed = fast_reply(token)
        if parsed is None:
            return
        key, number, op = parsed
        chunk = self.chunks.get(key)
        if chunk is None:
            return  # a chunk already settled (the answers to messages after its end)
        try:
            chunk.lane.on_reply(chunk, number, op, data, headers)
        except Exception:  # never into the reader: the other replies must still be handled
            logger.exception("error handling a fast batch reply")

    async def send_batch_message(
        self, record: Record, *, reply: bool, timeout: float, answer_within: float | None = None
    ) -> tuple[bytes, dict[str, str] | None] | None:
        """Write an atomic batch's message; with ``reply``, its answer (see
        :meth:`_request_through_election`: ``answer_within`` seconds, else :class:`AnswerLost`)."""
        lane = self._lanes.get(record.topic) if self._lanes else None
        if lane is not None:  # after what was produced before it, as on the per-message path
            await lane.written(timeout)
        try:
            if reply:
                answer = await self._request_through_election(record, timeout, answer_within)
                committed = None if lane is None else batch_puback(answer.data)
                if lane is not None and committed is not None:  # the batch's last sequence
                    lane.anchor = max(lane.anchor or 0, committed[0])
                return answer.data, answer.headers
            handed_off = self.publish(record)
            if handed_off is not None:
                await handed_off
        except Exception as exc:
            raise translate(exc) from exc
        return None

    async def _request_through_election(
        self, record: Record, timeout: float, answer_within: float | None = None
    ) -> Msg:
        """An atomic batch's request (its first message, its commit): one answered "no
        responders" was received by nobody, so for a topic whose stream exists it is a leader
        election, and the request is made again after a pause, within ``timeout``. Fails at
        once with :class:`AnswerLost` (it may or may not have reached the stream) where it was
        written on a connection lost before its answer came (its server died), and where
        ``answer_within`` seconds pass without an answer (a server may route it to a peer that
        died before its route closed)."""
        deadline = time.monotonic() + timeout
        pause = _ELECTION_PAUSE
        while True:
            try:
                return await self._answer_unless_lost(record, deadline, answer_within)
            except nats.errors.NoRespondersError:
                if time.monotonic() + pause >= deadline or not await self._stream_exists(record):
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, _ELECTION_PAUSE_MAX)

    async def _answer_unless_lost(
        self, record: Record, deadline: float, answer_within: float | None
    ) -> Msg:
        left = max(deadline - time.monotonic(), 0.001)
        wait = left if answer_within is None else min(answer_within, left)
        request = self._nc.request(
            self.subject(record),
            record.value or b"",
            timeout=wait,
            headers=self.nats_headers(record),
        )
        try:
            if not self._nc.is_connected:
                return await request  # held by nats-py until it reconnects, and written then
            answer = await until_set(request, self._connection_lost)
            if answer.cancelled():
                raise AnswerLost(
                    f"the connection to the NATS server was lost before the answer to a "
                    f"request on {self.subject(record)!r} came: it may or may not have reached "
                    "the stream"
                )
            return answer.result()
        except nats.errors.TimeoutError as exc:
            if wait < left:
                raise AnswerLost(
                    f"no answer to a request on {self.subject(record)!r} within {wait:.1f}s: "
                    "it may or may not have reached the stream"
                ) from exc
            raise

    async def _stream_exists(self, record: Record) -> bool:
        """Whether a stream stores ``record``'s topic: one seen here, or one the server names
        (asked once per topic; a server that does not answer is taken for one in an election)."""
        if record.topic in self._stream_topics or record.topic in self._lanes:
            return True
        try:
            js = self._nc.jetstream(timeout=min(self.timeout, _LANE_WAIT))
            await js.find_stream_name_by_subject(self.subject(record))
        except nats.js.errors.NotFoundError:
            return False
        except Exception as exc:
            logger.debug("stream lookup for %r during a 503: %s", record.topic, translate(exc))
        self._stream_topics.add(record.topic)
        return True

    async def _on_ack(self, msg: Msg) -> None:
        """The public path: nats-py's subscription callback, once per PubAck. Its task calls it
        for every PubAck queued by one read before it waits again, so the plain ones are
        gathered and reported together once it has (the loop's next turn)."""
        record = self._take(msg.subject[self._inbox_prefix_length :])
        if record is None:
            return
        data = msg.data
        if msg.headers or not is_plain(data):
            self._report(record, data, msg.headers)
            return
        if not self._gathered:
            asyncio.get_running_loop().call_soon(self._report_gathered)
        self._gathered.append((record, data))

    def _report_gathered(self) -> None:
        gathered, self._gathered = self._gathered, []
        self._report_plain(gathered)
        self._sweep()

    def _handle_ack(self, msg: Msg) -> None:
        """A PubAck that came through nats-py's parser on the fast path (one with headers, or
        one the PubAck reader left to it), or a reply to a fast batch."""
        token = msg.subject[self._inbox_prefix_length :]
        if "." in token:
            self._fast_reply(token.encode(), msg.data, msg.headers)
            return
        record = self._take(token)
        if record is not None:
            self._report(record, msg.data, msg.headers)
        self._sweep()

    def _settle_acks(self, acks: list[tuple[bytes, bytes]]) -> None:
        """PubAcks (and fast batch replies) read off one socket read by _PubAckReader, as
        (token, payload), handled in the order they came."""
        awaiting = self._awaiting
        plain: list[tuple[Record, bytes]] = []
        for token, data in acks:
            try:
                record = awaiting.pop(int(token), None)
            except ValueError:
                if plain:  # first the PubAcks before it: they may move a lane's anchor
                    self._report_plain(plain)
                    plain = []
                self._fast_reply(token, data, None)
                continue
            if record is None:
                continue  # already timed out and forgotten
            if is_plain(data):
                plain.append((record, data))
            else:
                self._report(record, data, None)
        self._report_plain(plain)
        self._sweep()

    def _take(self, token: str | bytes) -> Record | None:
        """The record awaiting the PubAck with reply ``token``, no longer awaiting; None if
        there is none (it timed out and was forgotten, or the token is not one of ours)."""
        try:
            return self._awaiting.pop(int(token), None)
        except ValueError:
            return None

    def _report_plain(self, plain: list[tuple[Record, bytes]]) -> None:
        """Report PubAcks that arrived together, plain ones (see ``is_plain``), through one
        ``acked_each`` per subject: an ``on_outcome`` hook sees one Outcome for each, and an
        Outcome names one topic and partition."""
        groups: dict[tuple[str, int | None], tuple[list[Record], list[int | None]]] = {}
        topic: str | None = None
        partition: int | None = None
        records: list[Record] = []
        offsets: list[int | None] = []
        for record, data in plain:
            sequence = puback_sequence(data)
            if sequence is None:
                self._report(record, data, None)
                continue
            if record.topic != topic or record.partition != partition:
                topic, partition = record.topic, record.partition
                records, offsets = groups.setdefault((topic, partition), ([], []))
            records.append(record)
            offsets.append(sequence)
        acked_each = self.reports.acked_each
        if groups:
            self._election_pause = _ELECTION_PAUSE
            self._stream_topics.update(topic for topic, _ in groups)
            for (topic, _), (records, _) in groups.items():
                self._acked_seq[topic] = records[-1].seq
        for records, offsets in groups.values():
            try:
                acked_each(records, offsets)
            except Exception:  # one group's trouble must not leave the others unsettled
                logger.exception("error handling PubAcks")
        if self._lanes:
            for (topic, _), (_, offsets) in groups.items():
                lane = self._lanes.get(topic)
                if lane is not None:
                    lane.anchor = max(offset for offset in offsets if offset is not None)

    def _report(self, record: Record, data: bytes, headers: Mapping[str, str] | None) -> None:
        """Report one PubAck: a refusal, a duplicate, or a sequence."""
        try:
            if not is_plain(data):
                error = puback_error(self.subject(record), data, headers)
                if error is not None:  # the server refused this copy: this one is not stored
                    if getattr(error, "code", None) == DUPLICATE_IN_PROCESS:
                        self._wait_for_copy_in_process(record)
                    elif not (_no_responders(data, headers) and self.wait_out_election(record)):
                        self.reports.failed(record, error, record.seq in self._maybe_stored)
                    return
            sequence = puback_sequence(data)
            if sequence is None:
                self.reports.failed(record, DeliveryError(f"unreadable PubAck {data[:200]!r}"))
                return
            duplicate = puback_duplicate(data)
            if self._in_process:
                self._in_process.pop(record.seq, None)
            self._stream_topics.add(record.topic)
            self.reports.acked(record, sequence, duplicate)
            self._acked_seq[record.topic] = record.seq
            if self._lanes and not duplicate:
                lane = self._lanes.get(record.topic)
                if lane is not None:
                    lane.anchor = sequence
        except Exception:  # never into the reader: the other PubAcks must still be settled
            logger.exception("error handling a PubAck")

    def wait_out_election(self, record: Record) -> bool:
        """A "no responders" PubAck for ``record``: nothing received it, so nothing stored it.
        For a topic whose stream exists (found, created, or it stored a message here) that is a
        leader election: publish it again after a pause, within its deadline (False: the stream
        is missing, fail it). A record whose deadline comes first fails here, not stored."""
        if record.topic not in self._stream_topics and record.topic not in self._lanes:
            return False
        now = time.monotonic()
        if now + self._election_pause >= record.deadline:
            maybe_stored = record.seq in self._maybe_stored
            self.reports.failed(
                record,
                DeliveryError(
                    f"the JetStream stream storing {self.subject(record)!r} had no leader "
                    f"until the message's deadline (503 no responders to every attempt"
                    + (
                        " after one whose PubAck was lost, which may have stored it"
                        if maybe_stored
                        else ""
                    )
                    + f": a leader election that did not end within timeout={self.timeout:g}s)"
                ),
                maybe_stored,
            )
            return True
        if not self._electing and now - self._last_election_log >= _ERROR_LOG_INTERVAL:
            self._last_election_log = now
            logger.warning(
                "JetStream stream storing %r has no leader (an election): publishing again "
                "within each message's deadline",
                self.subject(record),
            )
        if not self._electing and self._stream_lanes:
            # The fast batches the old leader held are lost with it: ping them now rather
            # than wait for their deadlines (the answer settles or forgets each).
            asyncio.get_running_loop().call_soon(self._ping_lanes)
        self._electing[record.seq] = record
        if self._election_timer is None:
            self._election_timer = asyncio.get_running_loop().call_later(
                self._election_pause, self._publish_again
            )
        return True

    def _check_lost_acks(self) -> None:
        """Every ``_ACK_CHECK`` seconds: a message with a msg_id, published before the last
        check, whose PubAck has not come while a later message of its topic was acked, lost
        its PubAck (a stream answers in order: its leader died or stepped down holding it).
        It is published again; the stream drops a duplicate of one it stored."""
        self._ack_timer = asyncio.get_running_loop().call_later(_ACK_CHECK, self._check_lost_acks)
        mark, self._ack_mark = self._ack_mark, self._next_token
        acked = self._acked_seq
        if not acked:
            return
        again = [
            (token, record)
            for token, record in self._awaiting.items()
            if token <= mark
            and record.msg_id is not None
            and record.seq < acked.get(record.topic, 0)
        ]
        for token, record in again:
            del self._awaiting[token]
            self._send_again(record, possibly_stored=True)

    def _ping_lanes(self) -> None:
        for lane in self._stream_lanes.values():
            try:
                lane.reconnected()
            except Exception:
                logger.exception("fast ingest lane %r during an election", lane.stream)

    def _publish_again(self) -> None:
        """Publish again the records that waited out the pause, those still pending."""
        self._election_timer = None
        self._election_pause = min(self._election_pause * 2, _ELECTION_PAUSE_MAX)
        held, self._electing = self._electing, {}
        pending = self.reports.pending
        for seq, record in held.items():
            if pending.get(seq) is record:
                self._send_again(record, possibly_stored=seq in self._maybe_stored)

    def _wait_for_copy_in_process(self, record: Record) -> None:
        """A "duplicate message id is in process" answer (``DUPLICATE_IN_PROCESS``) for
        ``record``: a copy published before (whose PubAck a reconnect or a leader change lost)
        is being stored by the stream now. It is published again after a pause, within its
        deadline, until the stream answers with that copy's sequence (a duplicate) or stores
        this one; a record whose deadline comes first fails here, possibly stored."""
        earlier = self._in_process.pop(record.seq, None)
        pause = _IN_PROCESS_PAUSE if earlier is None else min(earlier[2] * 2, _ELECTION_PAUSE_MAX)
        if time.monotonic() + pause >= record.deadline:
            self.reports.failed(
                record,
                DeliveryError(
                    f"JetStream was still storing a copy of the message (msg_id "
                    f"{record.msg_id!r}, published again after its PubAck was lost) at its "
                    f"deadline (error code {DUPLICATE_IN_PROCESS}: duplicate message id is in "
                    "process); that copy may be stored"
                ),
                True,
            )
            return
        self._maybe_stored.add(record.seq)
        timer = asyncio.get_running_loop().call_later(
            pause, self._publish_in_process_again, record.seq
        )
        self._in_process[record.seq] = (record, timer, pause)

    def _publish_in_process_again(self, seq: int) -> None:
        record, _, pause = self._in_process.pop(seq)
        if self.reports.pending.get(seq) is record:
            self._in_process[seq] = (record, None, pause)  # its next 10158 waits longer
            self._send_again(record, possibly_stored=True)

    def _send_again(self, record: Record, *, possibly_stored: bool) -> None:
        """Publish ``record`` once more; if that fails, it fails, ``possibly_stored`` as an
        earlier attempt may have left it (if so, a later refusal says so too)."""
        if possibly_stored:
            self._maybe_stored.add(record.seq)
        self.send_one(record, possibly_stored)

    def _sweep(self) -> None:
        """Forget records whose deadline passed (the producer failed them) and got no ack."""
        now = time.monotonic()
        if now - self._last_sweep < self.timeout:
            return
        self._last_sweep = now
        expired = [token for token, record in self._awaiting.items() if record.deadline < now]
        for token in expired:
            del self._awaiting[token]
        pending = self.reports.pending
        settled = [
            seq
            for seq, (record, timer, _) in self._in_process.items()
            if timer is None and pending.get(seq) is not record
        ]
        for seq in settled:
            del self._in_process[seq]
        if self._maybe_stored:  # keep only the unsettled
            self._maybe_stored.intersection_update(self.reports.pending.keys())
        for lane in self._stream_lanes.values():
            lane.sweep()

    def refused(self, subject: str, error: AuthorizationError) -> None:
        """The server answers in order, so the k-th refusal for a subject is its k-th oldest
        record still awaiting a PubAck (which will never come), or in a fast batch."""
        for token, record in self._awaiting.items():
            if self.subject(record) == subject:
                del self._awaiting[token]
                self.reports.failed(record, error, False)
                return
        for lane in self._stream_lanes.values():
            if lane.refused(subject, error):
                return

    def unwritten(self, records: list[Record]) -> set[int]:
        # A record waiting out an election: every attempt was answered "no responders" (unless
        # an earlier one's PubAck was lost: that one may have stored it).
        electing = {
            record.seq
            for record in records
            if record.seq in self._electing and record.seq not in self._maybe_stored
        }
        if not self._stream_lanes:
            return electing
        numbers = {record.seq for record in records}
        held: set[int] = electing
        for lane in self._stream_lanes.values():
            if lane.queue:
                held |= lane.unwritten(numbers)
        return held

    def flush(self) -> None:
        # Publishes are written as they are made, a lane's at the end of the loop turn that
        # handed them over (now, here: it commits its chunk); PubAcks arrive on their own.
        if self._drain_scheduled:
            self._drain_lanes()

    async def _on_disconnected(self) -> None:
        lost, self._connection_lost = self._connection_lost, asyncio.Event()
        lost.set()
        await super()._on_disconnected()

    async def _on_reconnected(self) -> None:
        await super()._on_reconnected()
        # The PubAcks of what the lost server received are lost with it. A message with a
        # msg_id is published again (the stream drops a duplicate of it within its duplicate
        # window); one without waits for its PubAck until its deadline (possibly stored).
        again = [(token, record) for token, record in self._awaiting.items() if record.msg_id]
        for token, record in again:
            del self._awaiting[token]
            self._send_again(record, possibly_stored=True)
        for lane in self._stream_lanes.values():
            try:
                lane.reconnected()
            except Exception:
                logger.exception("fast ingest lane %r after a reconnect", lane.stream)

    async def close(self) -> None:
        for timer in (self._election_timer, self._ack_timer):
            if timer is not None:
                timer.cancel()
        in_process, self._in_process = self._in_process, {}
        for record, timer, _ in in_process.values():
            if timer is None:  # published again: awaiting its PubAck as the others are
                continue
            timer.cancel()
            self.reports.failed(
                record, BrokerUnavailable("closed while a copy was being stored"), True
            )
        await super().close()
        if self._gathered:  # PubAcks that came in before the close
            self._report_gathered()
        error = BrokerUnavailable("the connection closed before the PubAck")
        awaiting, self._awaiting = self._awaiting, {}
        for record in awaiting.values():
            self.reports.failed(record, error)
        electing, self._electing = self._electing, {}
        for record in electing.values():  # every attempt was answered "no responders" (but one?)
            maybe_stored = record.seq in self._maybe_stored
            self.reports.failed(
                record, BrokerUnavailable("closed during a leader election"), maybe_stored
            )
        unwritten = BrokerUnavailable("the connection closed before the message was written")
        for lane in self._stream_lanes.values():
            lane.close(error, unwritten)
        for future in list(self._spawned):
            future.cancel()


def _no_responders(data: bytes, headers: Mapping[str, str] | None) -> bool:
    """The empty reply with status 503 that a publish nobody received gets."""
    return not data and (headers or {}).get("Status") == "503"


def _covers_partitions(patterns: Iterable[str], topic: str) -> bool:
    """Whether one of a stream's subject patterns matches every partition subject
    ``<topic>.<n>`` (so that one lane may carry them all)."""
    wanted = topic.split(".")
    for pattern in patterns:
        tokens = pattern.split(".")
        for position, token in enumerate(tokens):
            if token == ">":
                if position <= len(wanted):
                    return True
                break
            if position > len(wanted) or (position == len(wanted) and token != "*"):
                break
            if position < len(wanted) and token not in ("*", wanted[position]):
                break
        else:
            if len(tokens) == len(wanted) + 1:
                return True
    return False
