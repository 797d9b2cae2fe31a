"""What core NATS and JetStream connections share: the nats-py client, connecting, subjects,
headers, the publish path, refusals and reconnect logging."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from nats.aio.client import Client

from producerkit import _security
from producerkit._record import Record
from producerkit._types import HeaderPairs
from producerkit.backends import _clients
from producerkit.backends.base import Connection
from producerkit.backends.nats import _natspy_compat
from producerkit.backends.nats.errors import is_refusal, translate
from producerkit.errors import AuthorizationError, BrokerUnavailable

T = TypeVar("T")

logger = logging.getLogger("producerkit.nats")

_PERMISSION_DENIED = re.compile(r'(?i)permissions violation for publish to "([^"]+)"')
#: Seconds between log lines about one connection's errors (the rest are counted).
_ERROR_LOG_INTERVAL = 5.0


async def until_set(work: Awaitable[T], event: asyncio.Event) -> asyncio.Future[T]:
    """Run ``work`` until it ends or ``event`` is set, whichever comes first; its future,
    cancelled (and ended) if the event came first."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((task, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait((task,))
    return task


class NatsClientConnection(Connection):
    """One nats-py client. Subclasses say what a publish is and how it is acknowledged."""

    def setup(self) -> None:
        _clients.check_client("nats-py")
        self._partitions: int | None = self.options.get("partitions")
        self._closing = False
        self._connected = False
        self._reconnects = 0
        self._errors = 0  # connection errors not yet logged (one per failed reconnect attempt)
        self._last_error_log = 0.0
        self._down_since = 0.0
        self._connect_errors: list[Exception] = []
        self._refused = asyncio.Event()
        self._servers_require_tls = False  # what their INFO said, where TLS is asked for
        self._nc = Client()
        # The last headers object and its header_lines: the trace context's pairs are one tuple
        # per span, so a traced run makes its lines once.
        self._block_headers: HeaderPairs | None = None
        self._block_lines = header_lines(None)
        self._direct_writer: _natspy_compat.DirectWriter | None = None
        self._settings: dict[str, Any] = {
            "servers": [f"nats://{host}:{port}" for host, port in self.url.servers],
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
            **security_settings(
                self.options,
                # nats-py upgrades to TLS only when the server requires it: with TLS asked for,
                # credentials go out only if every server said so (read before connecting).
                secure=lambda: self._servers_require_tls,
            ),
        }
        if "pending_size" in self.options:
            self._settings["pending_size"] = self.options["pending_size"]

    async def connect(self) -> None:
        client = self._nc
        try:
            if _security.tls_enabled(self.options):
                self._servers_require_tls = await _servers_require_tls(
                    self.url.servers, min(self.timeout, 5.0)
                )
            await self._connect_client(client, self._settings)
            self.client_path, self.client_path_reason = _natspy_compat.choose_path(client)
        except BaseException as exc:
            await close_client(client)
            if isinstance(exc, Exception):
                raise translate(exc) from exc
            raise
        client.options["max_reconnect_attempts"] = -1
        if self.client_path == _clients.FAST:
            self._direct_writer = _natspy_compat.DirectWriter(client)
        self._connected = True
        self.max_message_size = client.max_payload

    def subject(self, record: Record) -> str:
        if self._partitions is None:
            return record.topic
        return f"{record.topic}.{record.partition}"

    async def prepare_topic(self, topic: str) -> int | None:
        return self._partitions

    def nats_headers(self, record: Record) -> dict[str, str] | None:
        headers = None
        if record.headers:
            headers = {name: data.decode("utf-8") for name, data in record.headers}
        if record.msg_id is not None:
            headers = headers or {}
            headers["Nats-Msg-Id"] = record.msg_id
        return headers

    def publish(self, record: Record, reply: str = "") -> Awaitable[None] | None:
        """Hand the record to the connection's outgoing buffer.

        On the fast path, while connected, the PUB/HPUB command goes straight into nats-py's
        write buffer (``_natspy_compat.DirectWriter``: no coroutine and no flusher wake-up per
        message). Reconnecting, or on the public path, it is ``publish()`` itself, with nats-py's
        reconnect buffering rules. Either way what it raises fails this record.
        """
        client = self._nc
        writer = self._direct_writer
        # Never None here: the NATS specs refuse tombstones at produce().
        value: bytes = record.value  # type: ignore[assignment]
        if writer is None or not client.is_connected:
            return client.publish(self.subject(record), value, reply, self.nats_headers(record))
        if record.headers is None and record.msg_id is None:
            command = f"PUB {self.subject(record)} {reply} {len(value)}\r\n".encode()
        else:
            block = self.header_block(record)
            assert block is not None
            command = (
                f"HPUB {self.subject(record)} {reply} {len(block)} "
                f"{len(block) + len(value)}\r\n".encode()
                + block
            )
        return writer.write(command, value)

    def header_block(self, record: Record) -> bytes | None:
        """The record's NATS/1.0 header block (its headers and msg id), or None if it has
        neither."""
        if record.headers is None and record.msg_id is None:
            return None
        headers = record.headers
        if headers is not self._block_headers:
            self._block_headers, self._block_lines = headers, header_lines(headers)
        return self._block_lines + msg_id_line(record.msg_id)

    async def _connect_client(self, client: Client, settings: dict[str, Any]) -> None:
        """``client.connect()``, but a refusal (credentials, TLS) reported to ``_on_error`` ends
        it at once: nats-py would otherwise retry it, and after a failed TLS handshake it can
        wait forever for the socket to close."""
        connecting = await until_set(client.connect(**settings), self._refused)
        failure = None if connecting.cancelled() else connecting.exception()
        if not connecting.cancelled() and failure is None:
            return
        errors = self._connect_errors
        refusal = next((error for error in reversed(errors) if is_refusal(error)), None)
        # "No servers available" only says nats-py gave up; the last error says why.
        raise (
            refusal
            or (errors[-1] if errors else None)
            or failure
            or BrokerUnavailable("the NATS connection attempt ended without a reason")
        )

    def refused(self, subject: str, error: AuthorizationError) -> None:
        """The server refused one publish to ``subject`` (``-ERR 'Permissions Violation'``)."""
        raise NotImplementedError

    async def _on_error(self, exc: Exception) -> None:
        if not self._connected:
            self._connect_errors.append(exc)
            if is_refusal(exc):
                self._refused.set()
            return
        denied = _PERMISSION_DENIED.search(str(exc))
        if denied is not None:
            self.refused(
                denied[1],
                AuthorizationError(f"the server refused a publish: {_security.redact(str(exc))}"),
            )
            return
        # nats-py reports every failed reconnect attempt (4 a second): log counts, not lines.
        if self._closing:
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
        await close_client(self._nc)


async def _servers_require_tls(servers: Sequence[tuple[str, int]], timeout: float) -> bool:
    """Whether every server that answers says ``tls_required`` in the INFO a NATS server sends
    first on every connection (read here, not from nats-py's internals). False if none
    answers, so that no credential goes out unencrypted."""
    said: list[bool] = []
    for host, port in servers:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host.strip("[]"), port), timeout
            )
        except (OSError, TimeoutError):
            continue
        try:
            line = await asyncio.wait_for(reader.readline(), timeout)
        except (OSError, TimeoutError):
            line = b""
        finally:
            writer.transport.abort()
        if not line.startswith(b"INFO "):
            said.append(False)
            continue
        try:
            said.append(json.loads(line[5:]).get("tls_required") is True)
        except ValueError:
            said.append(False)
    return bool(said) and all(said)


def header_lines(headers: HeaderPairs | None) -> bytes:
    """The start of a NATS/1.0 header block with these header pairs (names and values checked
    by check_headers): the status line and one line per pair."""
    lines = [b"NATS/1.0\r\n"]
    for name, data in headers or ():
        lines.append(b"%s: %s\r\n" % (name.encode(), data))
    return b"".join(lines)


def msg_id_line(msg_id: str | None) -> bytes:
    """The end of a NATS/1.0 header block: the message id's line, if any, and the blank line."""
    if msg_id is None:
        return b"\r\n"
    return b"Nats-Msg-Id: %s\r\n\r\n" % msg_id.encode()


async def close_client(client: Client) -> None:
    try:
        await asyncio.wait_for(client.close(), 5)
    except Exception:
        logger.debug("error closing a NATS connection", exc_info=True)


def security_settings(
    options: Mapping[str, Any], secure: Callable[[], bool] | None = None
) -> dict[str, Any]:
    """nats-py ``connect()`` keywords (``tls``, ``user``/``password``, ``token``,
    ``user_credentials``) for these options.

    Passwords and tokens are passed as callables, so nats-py's own option dict never holds them,
    and, when TLS was asked for, ``secure()`` is checked first: nats-py upgrades to TLS only if
    the server requires it, and must not send a password in clear text to a server that does
    not. The callable raises ``nats.errors.SecureConnWantedError`` then.
    """
    settings: dict[str, Any] = {}
    context = _security.ssl_context(options)
    if context is not None:
        settings["tls"] = context
    guard = secure if context is not None else None

    def deferred(value: object) -> Callable[[], str]:
        def reveal() -> str:
            if guard is not None and not guard():
                import nats.errors

                raise nats.errors.SecureConnWantedError
            return _security.reveal(value)

        return reveal

    if "username" in options:
        settings["user"] = deferred(options["username"])
        settings["password"] = deferred(options["password"])
    if "token" in options:
        settings["token"] = deferred(options["token"])
    if "creds_file" in options:
        settings["user_credentials"] = os.path.expanduser(options["creds_file"])
    return settings
