"""``nats://`` (core NATS) and ``jetstream://`` (acked, stored) on nats-py.

JetStream: every publish carries a reply subject ``<inbox>.<n>`` and one wildcard subscription
receives all the PubAcks, so publishes are pipelined with no future or task per message.
The PubAck's stream sequence becomes the Delivery offset. ``msg_id`` sets ``Nats-Msg-Id``, which
the server uses to drop duplicates within the stream's duplicate window.

Core NATS has no acks. Its "ack" is the server's PONG to a PING sent after the message: the server
answers in order, so a PONG proves it received everything published before the PING (not that any
subscriber got it). One flush acknowledges a whole burst of messages.

Options: ``partitions=N`` maps partition p to subject ``{topic}.{p}`` (Memphis-style partitions);
``create_stream`` (JetStream) creates a stream for a topic that has none, with ``stream_storage``
``memory`` or ``file``; ``pending_size`` is nats-py's outgoing buffer (bytes kept while
reconnecting).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Mapping
from typing import Any, ClassVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from producerkit import _security
from producerkit._types import DEADLINE, HEADERS, MSG_ID, PARTITION, TOPIC, VALUE, Headers, Record
from producerkit.backends import _clients, _natspy_compat
from producerkit.backends.base import Backend, DeliverySink
from producerkit.errors import (
    AuthenticationError,
    AuthorizationError,
    BrokerUnavailable,
    ConfigurationError,
    DeliveryError,
    MessageError,
    MessageTooLarge,
    ProducerError,
    ProduceTimeout,
    TLSError,
)

logger = logging.getLogger("producerkit")

_BAD_SUBJECT = re.compile(r"[\s*>]|^\.|\.$|\.\.")
_BAD_HEADER_NAME = re.compile(r"[\s:]")
_PERMISSION_DENIED = re.compile(r'(?i)permissions violation for publish to "([^"]+)"')
#: Seconds between log lines about one connection's errors (the rest are counted).
_ERROR_LOG_INTERVAL = 5.0


class _NatsConnection(Backend):
    """What core NATS and JetStream share: connecting, subjects, headers, reconnect logging."""

    OPTIONS: ClassVar[Mapping[str, type]] = {
        "partitions": int,
        "pending_size": int,
        "name": str,
        **_security.OPTIONS,
    }

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        # Security options are checked apart, so that no message can print a password.
        others, security = _security.check_options("nats", options)
        checked = super().check_options(others)
        checked.update(security)
        if checked.get("partitions", 1) < 1:
            raise ConfigurationError(f"partitions must be at least 1, got {checked['partitions']}")
        if checked.get("stream_storage", "memory") not in ("memory", "file"):
            raise ConfigurationError("stream_storage must be 'memory' or 'file'")
        return checked

    @classmethod
    def check_topic(cls, topic: str) -> None:
        if _BAD_SUBJECT.search(topic):
            raise MessageError(
                f"invalid NATS subject {topic!r}: no spaces, no wildcards (* >), no empty tokens"
            )

    @classmethod
    def check_headers(cls, headers: Headers) -> None:
        for name, data in headers:
            if _BAD_HEADER_NAME.search(name):
                raise MessageError(f"invalid NATS header name {name!r}: no spaces or colons")
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise MessageError(
                    f"NATS header {name!r} must be UTF-8 text; NATS headers cannot carry binary"
                ) from None
            if "\r" in text or "\n" in text:
                raise MessageError(f"NATS header {name!r} must not contain line breaks")

    async def connect(self) -> None:
        _clients.check_client("nats-py")
        self._partitions: int | None = self.options.get("partitions")
        self._closing = False
        self._connected = False
        self._reconnects = 0
        self._errors = 0  # connection errors not yet logged (one per failed reconnect attempt)
        self._last_error_log = 0.0
        self._down_since = 0.0
        servers = [f"nats://{host}:{port}" for host, port in self.url.servers]
        settings: dict[str, Any] = {
            "servers": servers,
            "name": self.options.get("name", "producerkit"),
            "connect_timeout": min(self.timeout, 5.0),
            "allow_reconnect": True,
            # Fail the first connect fast (one pass over the servers); reconnect forever after.
            "max_reconnect_attempts": 1,
            "reconnect_time_wait": 0.25,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
            # Topics are validated once each (check_topic); nats-py would run a regex per publish.
            "skip_subject_validation": True,
        }
        if "pending_size" in self.options:
            settings["pending_size"] = self.options["pending_size"]
        client = Client()
        settings.update(
            _security.nats_settings(
                self.options,
                # nats-py upgrades to TLS only when the server requires it: with TLS asked for,
                # credentials go out only if it did.
                secure=lambda: _natspy_compat.server_requires_tls(client),
            )
        )
        self._connect_errors: list[Exception] = []
        self._refused = asyncio.Event()
        self._denials: dict[str, deque[AuthorizationError]] = {}
        try:
            await self._connect_client(client, settings)
        except BaseException as exc:
            await _close_client(client)
            if isinstance(exc, Exception):
                raise _translate(exc) from exc
            raise
        client.options["max_reconnect_attempts"] = -1
        self._nc = client
        try:
            self.client_path, self.client_path_reason = _natspy_compat.choose_path(client)
        except BaseException:
            await _close_client(client)
            raise
        self._direct_writer = (
            _natspy_compat.DirectWriter(client) if self.client_path == _clients.FAST else None
        )
        self._connected = True
        self.max_message_size = client.max_payload

    def subject(self, record: Record) -> str:
        if self._partitions is None:
            return record[TOPIC]
        return f"{record[TOPIC]}.{record[PARTITION]}"

    async def prepare_topic(self, topic: str) -> int | None:
        return self._partitions

    def nats_headers(self, record: Record) -> dict[str, str] | None:
        headers = None
        if record[HEADERS]:
            headers = {name: data.decode("utf-8") for name, data in record[HEADERS]}
        if record[MSG_ID] is not None:
            headers = headers or {}
            headers["Nats-Msg-Id"] = record[MSG_ID]
        return headers

    def _publish(self, record: Record, reply: str = "") -> Awaitable[None] | None:
        """Hand the record to the connection's outgoing buffer.

        On the fast path, while connected, the PUB/HPUB command goes straight into nats-py's
        write buffer (``_natspy_compat.DirectWriter``: no coroutine and no flusher wake-up per
        message). Reconnecting, or on the public path, it is ``publish()`` itself, with nats-py's
        reconnect buffering rules. Either way what it raises is translated through
        :meth:`translate_error`.
        """
        client = self._nc
        writer = self._direct_writer
        if writer is None or not client.is_connected:
            return client.publish(
                self.subject(record), record[VALUE], reply, self.nats_headers(record)
            )
        value = record[VALUE]
        if record[HEADERS] is None and record[MSG_ID] is None:
            command = f"PUB {self.subject(record)} {reply} {len(value)}\r\n".encode()
        else:
            block = _header_block(record)
            command = (
                f"HPUB {self.subject(record)} {reply} {len(block)} "
                f"{len(block) + len(value)}\r\n".encode()
                + block
            )
        return writer.write(command, value)

    @classmethod
    def translate_error(cls, exc: BaseException) -> ProducerError:
        return _translate(exc)

    async def _connect_client(self, client: Client, settings: dict[str, Any]) -> None:
        """``client.connect()``, but a refusal (credentials, TLS) reported to ``_on_error`` ends
        it at once: nats-py would otherwise retry it, and after a failed TLS handshake it can
        wait forever for the socket to close."""
        connecting = asyncio.ensure_future(client.connect(**settings))
        refused = asyncio.ensure_future(self._refused.wait())
        try:
            await asyncio.wait((connecting, refused), return_when=asyncio.FIRST_COMPLETED)
        finally:
            refused.cancel()
            if not connecting.done():
                connecting.cancel()
                await asyncio.wait((connecting,))
        failure = None if connecting.cancelled() else connecting.exception()
        if not connecting.cancelled() and failure is None:
            return
        errors = self._connect_errors
        refusal = next((error for error in reversed(errors) if _is_refusal(error)), None)
        # "No servers available" only says nats-py gave up; the last error says why.
        raise (
            refusal
            or (errors[-1] if errors else None)
            or failure
            or BrokerUnavailable("the NATS connection attempt ended without a reason")
        )

    def _denied(self, subject: str, error: AuthorizationError) -> None:
        """The server refused one publish to ``subject`` (``-ERR 'Permissions Violation'``):
        fail the oldest record to that subject not yet reported.

        The server answers in order, so the k-th refusal for a subject is its k-th oldest
        unreported record. JetStream: that record waits in ``_awaiting`` for a PubAck that will
        never come. Core NATS: it is in a burst whose PONG is still to come (the -ERR precedes
        it); a sink wrapper turns that burst's ack into this failure. Nothing is added to the
        hot path: the wrapper exists only while refusals wait for their records."""
        awaiting: dict[int, Record] | None = getattr(self, "_awaiting", None)
        if awaiting is not None:
            for token, record in awaiting.items():
                if self.subject(record) == subject:
                    del awaiting[token]
                    self.sink.failed(record, error)
                    return
            return
        self._denials.setdefault(subject, deque()).append(error)
        if not isinstance(self.sink, _DenyingSink):
            self.sink = _DenyingSink(self, self.sink)

    async def _on_error(self, exc: Exception) -> None:
        if not self._connected:
            self._connect_errors.append(exc)
            if _is_refusal(exc):
                self._refused.set()
            return
        denied = _PERMISSION_DENIED.search(str(exc))
        if denied is not None:
            self._denied(
                denied[1],
                AuthorizationError(f"the server refused a publish: {_security.redact(str(exc))}"),
            )
            return
        # nats-py reports every failed reconnect attempt (4 a second): log counts, not lines.
        if not self._connected or self._closing:
            return
        self._errors += 1
        now = time.monotonic()
        if now - self._last_error_log >= _ERROR_LOG_INTERVAL:
            logger.warning(
                "NATS connection %d: %s (%d error(s) since the last report)",
                self.index,
                exc,
                self._errors,
            )
            self._errors = 0
            self._last_error_log = now

    async def _on_disconnected(self) -> None:
        if self._connected and not self._closing:
            self._down_since = time.monotonic()
            logger.warning("NATS connection %d lost; reconnecting", self.index)

    async def _on_reconnected(self) -> None:
        self._reconnects += 1
        logger.warning(
            "NATS connection %d reconnected after %.1fs and %d more error(s) "
            "(%d reconnects so far)",
            self.index,
            time.monotonic() - self._down_since,
            self._errors,
            self._reconnects,
        )
        self._errors = 0

    async def close(self) -> None:
        self._closing = True
        client = getattr(self, "_nc", None)
        if client is not None:
            await _close_client(client)


class NatsBackend(_NatsConnection):
    """Core NATS: fire-and-forget publishes, acknowledged a burst at a time by PING/PONG.

    nats-py's ``flush()`` is not used: it writes its PING straight to the socket, possibly ahead
    of publishes still in its buffer, and a timed-out flush leaves a cancelled future in its PONG
    queue that breaks the next PONG. Instead each burst writes the buffer out first, then sends
    its own PING with a future that is never cancelled; PONGs arrive in order, each acking the
    burst before it. Bursts are pipelined (no waiting for one PONG before the next PING); a burst
    whose PONG never comes (connection lost) is failed by its deadline.
    """

    async def connect(self) -> None:
        await super().connect()
        self._unflushed: list[Record] = []
        self._confirming: set[asyncio.Task[None]] = set()
        self._confirm_scheduled = False

    def send(self, record: Record) -> Awaitable[None] | None:
        self._unflushed.append(record)
        if not self._confirm_scheduled:
            self._confirm_scheduled = True
            asyncio.get_running_loop().call_soon(self._confirm_burst)
        return self._publish(record)

    def _confirm_burst(self) -> None:
        self._confirm_scheduled = False
        if not self._unflushed:
            return
        burst, self._unflushed = self._unflushed, []
        task = asyncio.ensure_future(self._ping_after(burst))
        self._confirming.add(task)
        task.add_done_callback(self._confirming.discard)

    async def _ping_after(self, burst: list[Record]) -> None:
        pong: asyncio.Future[Any]
        try:
            if self._direct_writer is not None:
                pong = asyncio.get_running_loop().create_future()
                await self._direct_writer.ping_after_buffer(pong)
            else:
                pong = asyncio.ensure_future(_natspy_compat.confirm_written(self._nc, self.timeout))
        except Exception as exc:
            error = _translate(exc)
            for record in burst:
                self.sink.failed(record, error)
            return
        pong.add_done_callback(lambda done: self._burst_confirmed(done, burst))

    def _burst_confirmed(self, pong: asyncio.Future[Any], burst: list[Record]) -> None:
        if pong.cancelled() or pong.exception() is not None:
            return  # left to the records' deadlines
        acked = self.sink.acked
        for record in burst:
            acked(record, None)

    async def flush(self) -> None:
        self._confirm_burst()


class JetStreamBackend(_NatsConnection):
    """JetStream: pipelined publishes, PubAcks matched by reply subject on one subscription."""

    OPTIONS: ClassVar[Mapping[str, type]] = {
        **_NatsConnection.OPTIONS,
        "create_stream": bool,
        "stream_storage": str,
    }

    async def connect(self) -> None:
        await super().connect()
        self._js = self._nc.jetstream()
        self._inbox = self._nc.new_inbox()
        self._inbox_prefix_length = len(self._inbox) + 1
        self._awaiting: dict[int, Record] = {}
        self._next_token = 0
        self._last_sweep = time.monotonic()
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
        probe = topic if self._partitions is None else f"{topic}.0"
        try:
            await self._js.find_stream_name_by_subject(probe)
            return
        except nats.js.errors.NotFoundError:
            pass
        except Exception as exc:
            raise _translate(exc) from exc
        name = re.sub(r"[^A-Za-z0-9_-]", "_", topic)
        storage = self.options.get("stream_storage", "memory")
        try:
            await self._js.add_stream(name=name, subjects=[topic, f"{topic}.>"], storage=storage)
        except Exception as exc:
            raise _translate(exc) from exc

    def send(self, record: Record) -> Awaitable[None] | None:
        token = self._next_token = self._next_token + 1
        self._awaiting[token] = record
        return self._publish(record, reply=f"{self._inbox}.{token}")

    async def _on_ack(self, msg: Msg) -> None:
        self._handle_ack(msg)  # the public path: nats-py's subscription callback

    def _handle_ack(self, msg: Msg) -> None:
        """A PubAck that came through nats-py's parser (see _PubAckReader for the others)."""
        self._settle(msg.subject[self._inbox_prefix_length :], msg.data, msg.headers)
        self._sweep()

    def _settle_acks(self, acks: list[tuple[bytes, bytes]]) -> None:
        """PubAcks read by _PubAckReader, as (token, payload), in the order they came."""
        settle = self._settle
        for token, data in acks:
            try:
                settle(token, data, None)
            except Exception:  # one ack's trouble must not leave the others unsettled
                logger.exception("error handling a PubAck")
        self._sweep()

    def _settle(self, token: str | bytes, data: bytes, headers: Mapping[str, str] | None) -> None:
        try:
            record = self._awaiting.pop(int(token), None)
        except ValueError:
            return
        if record is None:
            return  # already timed out and forgotten
        if not data or b'"error"' in data:
            error = _puback_error(self.subject(record), data, headers)
            if error is not None:
                self.sink.failed(record, error)
                return
        sequence = _puback_sequence(data)
        if sequence is None:
            self.sink.failed(record, DeliveryError(f"unreadable PubAck {data[:200]!r}"))
            return
        self.sink.acked(record, sequence)

    def _sweep(self) -> None:
        """Forget records whose deadline passed (the producer failed them) and got no ack."""
        now = time.monotonic()
        if now - self._last_sweep < self.timeout:
            return
        self._last_sweep = now
        expired = [token for token, record in self._awaiting.items() if record[DEADLINE] < now]
        for token in expired:
            del self._awaiting[token]

    async def flush(self) -> None:
        pass  # publishes are written as they are made; PubAcks arrive on their own

    async def close(self) -> None:
        await super().close()
        for record in list(getattr(self, "_awaiting", {}).values()):
            self.sink.failed(record, BrokerUnavailable("the connection closed before the PubAck"))
        if hasattr(self, "_awaiting"):
            self._awaiting.clear()


def _header_block(record: Record) -> bytes:
    """The NATS/1.0 header block of a record (names and values checked by check_headers)."""
    lines = [b"NATS/1.0\r\n"]
    for name, data in record[HEADERS] or ():
        lines.append(b"%s: %s\r\n" % (name.encode(), data))
    if record[MSG_ID] is not None:
        lines.append(b"Nats-Msg-Id: %s\r\n" % record[MSG_ID].encode())
    lines.append(b"\r\n")
    return b"".join(lines)


_PUBACK_SEQUENCE = re.compile(rb'"seq":\s*(\d+)')


def _puback_sequence(data: bytes) -> int | None:
    """The stream sequence of a PubAck (``{"stream":"s","seq":12}``) by one regex search rather
    than a JSON parse per message (a third of the ack path's cost before)."""
    match = _PUBACK_SEQUENCE.search(data)
    if match is not None:
        return int(match[1])
    try:
        return int(json.loads(data)["seq"])
    except (ValueError, KeyError, TypeError):
        return None


def _puback_error(
    subject: str, data: bytes, headers: Mapping[str, str] | None
) -> ProducerError | None:
    """The failure a PubAck reports (an empty one, with its status, or one with an error), or
    None for a PubAck that only looked like one (a stream named "error")."""
    if not data:
        status = (headers or {}).get("Status", "")
        if status == "503":
            return DeliveryError(
                f"no JetStream stream stores subject {subject!r} (503 no responders); create "
                "one or pass create_stream=True"
            )
        return DeliveryError(f"empty PubAck (status {status or 'none'})")
    try:
        error = json.loads(data).get("error")
        if error is None:
            return None
        code, description = error.get("err_code") or error.get("code"), error.get("description")
    except (ValueError, TypeError, AttributeError):
        return DeliveryError(f"JetStream rejected the message: {data[:200]!r}")
    text = f"JetStream rejected the message: {description} (code {code})"
    if "permission" in str(description).lower():
        return AuthorizationError(text)
    if "too large" in str(description).lower() or "maximum" in str(description).lower():
        return MessageTooLarge(text)
    return DeliveryError(text)


class _DenyingSink:
    """Core NATS, after the server refused publishes: acks of the refused records become
    failures; once every refusal has found its record the backend's own sink is restored."""

    def __init__(self, backend: _NatsConnection, sink: DeliverySink) -> None:
        self._backend = backend
        self._sink = sink

    def acked(self, record: Record, offset: int | None) -> None:
        denials = self._backend._denials
        waiting = denials.get(self._backend.subject(record))
        if waiting:
            error = waiting.popleft()
            if not waiting:
                del denials[self._backend.subject(record)]
                if not denials:
                    self._backend.sink = self._sink
            self._sink.failed(record, error)
            return
        self._sink.acked(record, offset)

    def acked_run(self, records: list[Record], first_offset: int | None) -> None:
        for index, record in enumerate(records):
            self.acked(record, None if first_offset is None else first_offset + index)

    def failed(self, record: Record, exc: BaseException) -> None:
        self._sink.failed(record, exc)

    def topic_changed(self, topic: str) -> None:
        self._sink.topic_changed(topic)

    def batch_sent(self, topic: str, partition: int) -> None:
        self._sink.batch_sent(topic, partition)


def _is_refusal(exc: BaseException) -> bool:
    """Credentials or TLS refused: retrying the same server cannot help."""
    return isinstance(_translate(exc), AuthenticationError | TLSError)


async def _close_client(client: Client) -> None:
    try:
        await asyncio.wait_for(client.close(), 5)
    except Exception:
        logger.debug("error closing a NATS connection", exc_info=True)


def _translate(exc: BaseException) -> ProducerError:
    """nats-py's exceptions -> producerkit's, at this backend's edge; the original is kept as
    the new error's ``__cause__``."""
    if isinstance(exc, ProducerError):
        return exc
    error = _producerkit_error(exc)
    error.__cause__ = exc
    return error


def _producerkit_error(exc: BaseException) -> ProducerError:
    text = _security.redact(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, nats.errors.AuthorizationError):
        return AuthenticationError(text)
    if isinstance(exc, nats.errors.Error) and type(exc) is nats.errors.Error:
        # nats-py reports the server's -ERR lines as plain Error("nats: '<text>'").
        lowered = str(exc).lower()
        if "authorization violation" in lowered or "authentication" in lowered:
            return AuthenticationError(f"the server refused the credentials: {text}")
        if "permissions violation" in lowered:
            return AuthorizationError(text)
        if "ssl context" in lowered or "secure connection" in lowered or "tls" in lowered:
            return TLSError(text)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TLSError(
            f"{text}: the broker's certificate is not trusted (tls_ca_file names the CA that "
            "signed it; without TLS options the system CAs are used)"
        )
    if isinstance(
        exc,
        ssl.SSLError
        | nats.errors.SecureConnRequiredError
        | nats.errors.SecureConnWantedError
        | nats.errors.SecureConnFailedError,
    ):
        return TLSError(text)
    if isinstance(exc, nats.errors.MaxPayloadError):
        return MessageTooLarge(text)
    if isinstance(exc, nats.errors.TimeoutError | asyncio.TimeoutError):
        return ProduceTimeout(text)
    if isinstance(
        exc,
        nats.errors.NoServersError
        | nats.errors.ConnectionClosedError
        | nats.errors.ConnectionDrainingError
        | nats.errors.OutboundBufferLimitError
        | nats.errors.StaleConnectionError
        | nats.errors.UnexpectedEOF
        | ConnectionError
        | OSError,
    ):
        return BrokerUnavailable(text)
    if isinstance(exc, nats.js.errors.APIError):
        return DeliveryError(text)
    return DeliveryError(text)
