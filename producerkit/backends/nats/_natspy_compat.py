"""Every access to nats-py's internals, in one module, behind one probe.

A NATS or JetStream connection takes one of two paths through nats-py, chosen by
:func:`choose_path` once nats-py has connected:

- **fast**: PUB/HPUB commands are appended to nats-py's write buffer directly and its flusher is
  woken once per event-loop iteration (:class:`DirectWriter`: no coroutine per message); core
  NATS bursts are confirmed by a PING written after the buffer; JetStream PubAcks are handed to
  the backend without a queue hop (:class:`_DirectDelivery`) and read off the socket's bytes in
  front of nats-py's parser (:class:`_PubAckReader`).
- **public**: ``Client.publish()`` per message, ``Client.flush()`` to confirm a core NATS burst,
  and PubAcks through the subscription's callback.

The probe checks each internal the fast path uses on the connected client; if one is missing or
not as expected, or ``PRODUCERKIT_CLIENT_PATH=public`` is set, the public path is used (see
``_clients``). Nothing outside this module reads a private name of nats-py.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from producerkit.backends import _clients

try:  # the parser the PubAck reader stands in front of; a release may move it
    from nats.protocol.parser import AWAITING_CONTROL_LINE, Parser

    _MISSING: str | None = None
except ImportError as exc:  # pragma: no cover - depends on the installed nats-py
    _MISSING = f"{exc.name or 'a module'} cannot be imported ({exc})"

logger = logging.getLogger("producerkit.nats")

#: The client internals the fast path uses, and what each must be.
_CLIENT_INTERNALS: tuple[tuple[str, Callable[[Any], bool]], ...] = (
    ("_pending", lambda value: isinstance(value, list)),
    ("_pending_data_size", lambda value: type(value) is int),
    ("_max_pending_size", lambda value: type(value) is int),
    ("_flush_queue", lambda value: isinstance(value, asyncio.Queue)),
    ("_flush_pending", inspect.iscoroutinefunction),
    ("_send_ping", inspect.iscoroutinefunction),
    ("_ps", lambda value: type(value) is Parser),
    ("stats", lambda value: isinstance(value, dict) and "out_msgs" in value),
)


def choose_path(client: Client) -> tuple[str, str]:
    """``(FAST or PUBLIC, why)`` for a connected client."""
    version = _clients.check_client("nats-py")
    if _clients.forced_path() == _clients.PUBLIC:
        problem: str | None = "not probed"
    else:
        problem = _MISSING or _probe(client)
    return _clients.resolve_path("nats-py", version, problem)


def _probe(client: Client) -> str | None:
    for name, check in _CLIENT_INTERNALS:
        if not check(getattr(client, name, None)):
            return f"Client.{name} is missing or not as expected"
    parser = client._ps
    if not isinstance(getattr(parser, "buf", None), bytearray) or not hasattr(parser, "state"):
        return "Parser.buf or Parser.state is missing or not as expected"
    return None


async def confirm_written(client: Client, timeout: float) -> None:
    """The public path's proof that the server has read everything published so far: ``flush()``
    writes the buffer out (nats-py writes a flush's PING ahead of publishes still in its buffer),
    then ``rtt()``'s PONG follows them. Not ``flush()`` twice: once nats-py's read loop has ended
    (the server gone), ``flush()`` returns without any PONG, while ``rtt()`` always waits for one
    and raises when none comes."""
    seconds = max(1, math.ceil(timeout))  # nats-py takes whole seconds
    await client.flush(seconds)
    await client.rtt(seconds)


class DirectWriter:
    """The fast path's writes into one connected client's outgoing buffer."""

    __slots__ = ("_client", "_loop", "_stats", "_wake_scheduled")

    def __init__(self, client: Client) -> None:
        self._client = client
        self._stats = client.stats
        self._loop = asyncio.get_running_loop()
        self._wake_scheduled = False

    def write(self, command: bytes, value: bytes) -> Awaitable[None] | None:
        """Append a PUB/HPUB ``command`` (with its header block) and the payload ``value``.
        Returns the awaitable that flushes a buffer grown past ``pending_size``, else None."""
        client = self._client
        pending = client._pending
        pending.append(command)
        pending.append(value)
        pending.append(b"\r\n")
        client._pending_data_size += len(command) + len(value) + 2
        stats = self._stats
        stats["out_msgs"] += 1
        stats["out_bytes"] += len(value)
        if 0 < client._max_pending_size < client._pending_data_size:
            flushed: Awaitable[None] = client._flush_pending(force_flush=True)
            return flushed
        if not self._wake_scheduled:
            self._wake_scheduled = True
            self._loop.call_soon(self._wake_flusher)
        return None

    def write_many(self, data: bytes, messages: int, payload_bytes: int) -> Awaitable[None] | None:
        """Append ``data``: ``messages`` whole PUB/HPUB commands with their payloads (of
        ``payload_bytes`` together), as :meth:`write` would each."""
        client = self._client
        client._pending.append(data)
        client._pending_data_size += len(data)
        stats = self._stats
        stats["out_msgs"] += messages
        stats["out_bytes"] += payload_bytes
        if 0 < client._max_pending_size < client._pending_data_size:
            flushed: Awaitable[None] = client._flush_pending(force_flush=True)
            return flushed
        if not self._wake_scheduled:
            self._wake_scheduled = True
            self._loop.call_soon(self._wake_flusher)
        return None

    def _wake_flusher(self) -> None:
        self._wake_scheduled = False
        client = self._client
        queue = client._flush_queue
        if client._pending_data_size and queue is not None and queue.empty():
            queue.put_nowait(self._loop.create_future())

    async def ping_after_buffer(self, pong: asyncio.Future[bool]) -> None:
        """Write out the buffer, then a PING whose PONG resolves ``pong``: the server answers in
        order, so that PONG proves it read everything written before. Unlike ``flush()``, the
        PING cannot overtake buffered publishes, and ``pong`` is never cancelled by nats-py."""
        await self._client._flush_pending(force_flush=True)
        await self._client._send_ping(pong)


def deliver_pubacks_directly(
    client: Client,
    subscription: Any,
    inbox: str,
    handle: Callable[[Msg], None],
    settle: Callable[[list[tuple[bytes, bytes]]], None],
) -> bool:
    """On the fast path, let PubAcks on ``subscription`` (``<inbox>.*``) skip nats-py's dispatch:
    ``handle`` gets each one nats-py parses, ``settle`` each run read by the PubAck reader.
    Returns whether both were installed (else the subscription's callback gets them)."""
    if not isinstance(getattr(subscription, "_pending_queue", None), asyncio.Queue):
        return False
    sid = getattr(subscription, "_id", None)
    parser = getattr(client, "_ps", None)
    if type(parser) is not Parser or not isinstance(sid, int):
        return False
    subscription._pending_queue = _DirectDelivery(handle)
    client._ps = _PubAckReader(parser, client, sid, inbox, settle)  # type: ignore[assignment]
    return True


class _DirectDelivery:
    """Stands in for the PubAck subscription's ``asyncio.Queue``: nats-py's reader hands each
    PubAck straight to the backend, sparing a queue hop, a task switch and a coroutine per ack.
    The subscription's own task waits on :meth:`get`
    forever and is cancelled with it. The subscription has ``pending_bytes_limit=0``: nothing
    waits here, so nats-py's slow-consumer accounting must not count what passed through.
    """

    def __init__(self, handle: Callable[[Msg], None]) -> None:
        self._handle = handle

    def put_nowait(self, msg: Msg) -> None:
        try:
            self._handle(msg)
        except Exception:  # never into nats-py's read loop: that would drop the connection
            logger.exception("error handling a PubAck")

    async def get(self) -> Msg:
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable")

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        pass

    async def join(self) -> None:
        pass


class _PubAckReader:
    """Stands in for nats-py's protocol parser on a JetStream connection, and reads the PubAcks
    itself: a run of ``MSG <inbox>.<token> <sid> <length>`` frames at the head of what the
    socket gave is settled in one call, with no regex, ``Msg`` or coroutine per ack and no
    bytearray shifted per frame. Anything else (PING, INFO, -ERR, a PubAck with headers, other
    subscriptions) and everything after it in the same read goes to nats-py's parser, in order.
    While that parser holds part of a frame, all input goes to it until it is back between frames.
    """

    # A partial frame kept for the next read is at most a control line and a PubAck.
    _MAX_PARTIAL = 4096

    def __init__(
        self,
        parser: Parser,
        client: Client,
        sid: int,
        inbox: str,
        settle: Callable[[list[tuple[bytes, bytes]]], None],
    ) -> None:
        self._parser = parser
        self._stats = client.stats
        self._head = b"MSG " + inbox.encode() + b"."
        self._token_at = len(inbox) + 1  # in the subject
        self._sid = b"%d" % sid
        self._settle = settle
        self._partial = b""

    def reset(self) -> None:
        self._partial = b""
        self._parser.reset()

    async def parse(self, data: bytes = b"") -> None:
        if self._partial:
            data, self._partial = self._partial + data, b""
        parser = self._parser
        if parser.buf or parser.state != AWAITING_CONTROL_LINE:
            await parser.parse(data)
            return
        taken = self._take_acks(data)
        if taken < len(data) and not self._partial:
            await parser.parse(data[taken:])

    def _take_acks(self, data: bytes) -> int:
        """Settle the PubAck frames at the head of data; return where the rest starts. A partial
        PubAck at the end is kept in ``_partial``."""
        head, sid, token_at, size = self._head, self._sid, self._token_at, len(data)
        acks: list[tuple[bytes, bytes]] = []
        position = payload_bytes = 0
        incomplete = False  # the frame at position is a PubAck still arriving
        while data.startswith(head, position):
            line_end = data.find(b"\r\n", position, position + self._MAX_PARTIAL)
            if line_end < 0:
                incomplete = True
                break
            fields = data[position:line_end].split(b" ")
            if len(fields) != 4 or fields[2] != sid or not fields[3].isdigit():
                break  # a reply subject, another subscription: nats-py's
            start = line_end + 2
            end = start + int(fields[3])
            if end + 2 > size:
                incomplete = True
                break
            acks.append((fields[1][token_at:], data[start:end]))
            payload_bytes += end - start
            position = end + 2
        rest = size - position
        # Kept for the next read: a PubAck cut short, or a read ending in the first bytes of one.
        if (incomplete and rest < self._MAX_PARTIAL) or (
            0 < rest < len(head) and head.startswith(data[position:])
        ):
            self._partial = data[position:]
        if acks:
            stats = self._stats
            stats["in_msgs"] += len(acks)
            stats["in_bytes"] += payload_bytes
            try:
                self._settle(acks)
            except Exception:  # never into nats-py's read loop: that would drop the connection
                logger.exception("error handling PubAcks")
        return position
