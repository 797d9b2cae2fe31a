"""JetStream: acked, stored publishes, pipelined with no future or task per message.

Every publish carries a reply subject ``<inbox>.<n>`` and one wildcard subscription receives all
the PubAcks. The PubAck's stream sequence becomes the Delivery offset. ``msg_id`` sets
``Nats-Msg-Id``, which the server uses to drop duplicates within the stream's duplicate window: a
duplicate's PubAck is reported as ``Delivery.duplicate``. A refusal is failed with its JetStream
error code (``ExpectationFailed`` for a ``Nats-Expected-*`` header that did not hold).

The plain PubAcks that arrive together (one socket read on the fast path, one turn of the event
loop on the public path) are reported together, one ``acked_each`` per subject, so an
``on_outcome`` hook is called once per read rather than once per message.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from collections.abc import Awaitable, Mapping
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg

from producerkit._record import Record
from producerkit.backends import _clients
from producerkit.backends.nats import _natspy_compat
from producerkit.backends.nats.connection import NatsClientConnection
from producerkit.backends.nats.errors import translate
from producerkit.backends.nats.pubacks import (
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

    async def connect(self) -> None:
        await super().connect()
        self._inbox = self._nc.new_inbox()
        self._inbox_prefix_length = len(self._inbox) + 1
        subscription = await self._nc.subscribe(
            self._inbox + ".*", cb=self._on_ack, pending_msgs_limit=-1, pending_bytes_limit=0
        )
        if self.client_path == _clients.FAST:
            _natspy_compat.deliver_pubacks_directly(
                self._nc, subscription, self._inbox, self._handle_ack, self._settle_acks
            )

    async def prepare_topic(self, topic: str) -> int | None:
        if self.options.get("create_stream"):
            await self._ensure_stream(topic)
        return self._partitions

    async def _ensure_stream(self, topic: str) -> None:
        """Find the stream storing ``topic``, or create one. A request lost on the way (a
        blackhole, a reconnect) is asked again, each attempt waiting longer for its answer
        (``_STREAM_WAIT`` doubled up to ``_STREAM_WAIT_MAX``), until the producer's timeout
        has passed: the deadline of the messages waiting for it."""
        deadline = time.monotonic() + self.timeout
        wait, pause = _STREAM_WAIT, _STREAM_PAUSE
        for attempt in itertools.count(1):
            asked = time.monotonic()
            try:
                await self._find_or_add_stream(topic, min(wait, max(deadline - asked, 0.01)))
                return
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

    async def _find_or_add_stream(self, topic: str, wait: float) -> None:
        """One attempt of :meth:`_ensure_stream`, each request waiting ``wait`` seconds for its
        answer. A stream created by an earlier attempt whose answer was lost is found here."""
        js = self._nc.jetstream(timeout=wait)
        probe = topic if self._partitions is None else f"{topic}.0"
        try:
            await js.find_stream_name_by_subject(probe)
            return
        except nats.js.errors.NotFoundError:
            pass
        name = re.sub(r"[^A-Za-z0-9_-]", "_", topic)
        storage = self.options.get("stream_storage", "memory")
        atomic: dict[str, Any] = {"allow_atomic": True} if self.options.get("allow_atomic") else {}
        await js.add_stream(name=name, subjects=[topic, f"{topic}.>"], storage=storage, **atomic)

    def send(self, record: Record) -> Awaitable[None] | None:
        token = self._next_token = self._next_token + 1
        self._awaiting[token] = record
        return self.publish(record, reply=f"{self._inbox}.{token}")

    async def send_batch_message(
        self, record: Record, *, reply: bool, timeout: float
    ) -> tuple[bytes, dict[str, str] | None] | None:
        try:
            if reply:
                answer = await self._nc.request(
                    self.subject(record),
                    record.value or b"",
                    timeout=timeout,
                    headers=self.nats_headers(record),
                )
                return answer.data, answer.headers
            handed_off = self.publish(record)
            if handed_off is not None:
                await handed_off
        except Exception as exc:
            raise translate(exc) from exc
        return None

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
        one the PubAck reader left to it)."""
        record = self._take(msg.subject[self._inbox_prefix_length :])
        if record is not None:
            self._report(record, msg.data, msg.headers)
        self._sweep()

    def _settle_acks(self, acks: list[tuple[bytes, bytes]]) -> None:
        """PubAcks read off one socket read by _PubAckReader, as (token, payload)."""
        awaiting = self._awaiting
        plain: list[tuple[Record, bytes]] = []
        for token, data in acks:
            try:
                record = awaiting.pop(int(token), None)
            except ValueError:
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
        for records, offsets in groups.values():
            try:
                acked_each(records, offsets)
            except Exception:  # one group's trouble must not leave the others unsettled
                logger.exception("error handling PubAcks")

    def _report(self, record: Record, data: bytes, headers: Mapping[str, str] | None) -> None:
        """Report one PubAck: a refusal, a duplicate, or a sequence."""
        try:
            if not is_plain(data):
                error = puback_error(self.subject(record), data, headers)
                if error is not None:  # the server refused it: not stored
                    self.reports.failed(record, error, False)
                    return
            sequence = puback_sequence(data)
            if sequence is None:
                self.reports.failed(record, DeliveryError(f"unreadable PubAck {data[:200]!r}"))
                return
            self.reports.acked(record, sequence, puback_duplicate(data))
        except Exception:  # never into the reader: the other PubAcks must still be settled
            logger.exception("error handling a PubAck")

    def _sweep(self) -> None:
        """Forget records whose deadline passed (the producer failed them) and got no ack."""
        now = time.monotonic()
        if now - self._last_sweep < self.timeout:
            return
        self._last_sweep = now
        expired = [token for token, record in self._awaiting.items() if record.deadline < now]
        for token in expired:
            del self._awaiting[token]

    def refused(self, subject: str, error: AuthorizationError) -> None:
        """The server answers in order, so the k-th refusal for a subject is its k-th oldest
        record still awaiting a PubAck (which will never come)."""
        for token, record in self._awaiting.items():
            if self.subject(record) == subject:
                del self._awaiting[token]
                self.reports.failed(record, error, False)
                return

    async def flush(self) -> None:
        pass  # publishes are written as they are made; PubAcks arrive on their own

    async def close(self) -> None:
        await super().close()
        if self._gathered:  # PubAcks that came in before the close
            self._report_gathered()
        error = BrokerUnavailable("the connection closed before the PubAck")
        awaiting, self._awaiting = self._awaiting, {}
        for record in awaiting.values():
            self.reports.failed(record, error)
