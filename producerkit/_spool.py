"""The spool: every message that ends failed, appended to a file, ready to be sent again.

``Producer(spool=PATH)`` appends each failure the producer reports (``on_error``, ``flush()``:
a nonblocking message that was not delivered, one still unsent at ``close()``, one purged) to
PATH, one JSON object per line:

========================  ==================================================================
``topic``                 str
``partition``             int, or null (unpartitioned, or routed by key again on replay)
``key``, ``value``        the bytes, base64; null for none (a null value is a tombstone)
``headers``               ``[[name, base64 or null], ...]`` in order, or null
``msg_id``                str or null
``timestamp``             the CreateTime in epoch seconds the producer fixed, or null
``error``                 ``"ErrorType: what happened"``
``possibly_stored``       true if the broker may have stored it (see Failure)
========================  ==================================================================

Each line is written whole and flushed as the failure is reported, and the file is synced to
disk by ``flush()`` and ``close()``. ``producerkit replay PATH --url URL`` sends a spool again
(:func:`read_spool` reads one). A blocking produce's failure is raised to its caller instead,
and is not spooled.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import attrs

from producerkit._types import Failure, HeaderPairs
from producerkit.errors import ConfigurationError

__all__ = ["FailureReports", "Spool", "SpooledMessage", "read_spool", "spool_line"]


@attrs.frozen(slots=True)
class SpooledMessage:
    """One line of a spool: a message to send again, and why it failed."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int | None = None
    headers: HeaderPairs | None = None
    msg_id: str | None = None
    timestamp: float | None = None
    error: str = ""
    possibly_stored: bool = True

    def produce_kwargs(self) -> dict[str, Any]:
        """Keywords for ``produce(message.value, **message.produce_kwargs())``."""
        kwargs: dict[str, Any] = {"key": self.key, "topic": self.topic, "msg_id": self.msg_id}
        if self.headers is not None:
            kwargs["headers"] = list(self.headers)
        if self.partition is not None:
            kwargs["partition"] = self.partition
        if self.timestamp is not None:
            kwargs["timestamp"] = self.timestamp
        return kwargs


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: object, where: str) -> bytes | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"{where} must be base64 text or null")
    return base64.b64decode(text, validate=True)


def spool_line(
    *,
    topic: str,
    value: bytes | None,
    key: bytes | None,
    partition: int | None,
    headers: HeaderPairs | None,
    msg_id: str | None,
    timestamp: float | None,
    error: str,
    possibly_stored: bool,
) -> bytes:
    """One spool line (with its newline) for a message."""
    document = {
        "topic": topic,
        "partition": partition,
        "key": _b64(key),
        "value": _b64(value),
        "headers": None if headers is None else [[name, _b64(data)] for name, data in headers],
        "msg_id": msg_id,
        "timestamp": timestamp,
        "error": error,
        "possibly_stored": possibly_stored,
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def line_of(message: SpooledMessage, exception: BaseException | None = None) -> bytes:
    """``message``'s spool line; with ``exception``, the error it names is that one."""
    fields = attrs.asdict(message, recurse=False)
    if exception is not None:
        fields["error"] = f"{type(exception).__name__}: {exception}"
    return spool_line(**fields)


def failure_line(failure: Failure) -> bytes:
    message = SpooledMessage(
        topic=failure.topic,
        value=failure.value,
        key=failure.key,
        partition=failure.partition,
        headers=failure.header_pairs,
        msg_id=failure.msg_id,
        timestamp=failure.timestamp,
        possibly_stored=failure.possibly_stored,
    )
    return line_of(message, failure.exception)


class Spool:
    """Appends failures to one file (see the module docstring); safe from any thread."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._file: IO[bytes] = open(self.path, "ab")  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise ConfigurationError(f"spool {str(self.path)!r} cannot be opened: {exc}") from exc
        self._lock = threading.Lock()
        self.count = 0

    def add(self, failure: Failure) -> None:
        """Append ``failure``'s message, whole, and flush it to the operating system."""
        line = failure_line(failure)
        with self._lock:
            self._file.write(line)
            self._file.flush()
            self.count += 1

    def sync(self) -> None:
        """Make what was appended durable (fsync)."""
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())

    def close(self) -> None:
        self.sync()
        with self._lock:
            self._file.close()


class FailureReports:
    """Where a producer's failures go, in order: its spool (opened by :meth:`open`), then its
    ``on_error``."""

    def __init__(self, spool: str | None, on_error: Callable[[Failure], object] | None) -> None:
        self._path = spool
        self._on_error = on_error
        self.spool: Spool | None = None

    def open(self) -> None:
        if self._path is not None and self.spool is None:
            self.spool = Spool(self._path)

    def report(self, failure: Failure) -> None:
        if self.spool is not None:
            self.spool.add(failure)
        if self._on_error is not None:
            self._on_error(failure)

    def sync(self) -> None:
        if self.spool is not None:
            self.spool.sync()

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()


def read_spool(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes, SpooledMessage]]:
    """Each message of a spool as ``(line number from 1, the line, the message)``; a line that
    is not a spool line raises ConfigurationError naming it."""
    with open(path, "rb") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            yield number, line, parse_line(line, f"{path}:{number}")


def parse_line(line: bytes, where: str) -> SpooledMessage:
    try:
        document = json.loads(line)
        headers = document.get("headers")
        return SpooledMessage(
            topic=document["topic"],
            value=_unb64(document.get("value"), "value"),
            key=_unb64(document.get("key"), "key"),
            partition=document.get("partition"),
            headers=None
            if headers is None
            else tuple((name, _unb64(data, f"header {name!r}")) for name, data in headers),
            msg_id=document.get("msg_id"),
            timestamp=document.get("timestamp"),
            error=document.get("error", ""),
            possibly_stored=bool(document.get("possibly_stored", True)),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"{where}: not a spool line ({exc})") from exc
