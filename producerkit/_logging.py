"""producerkit's loggers, and the filter that rate-limits the client libraries' repeated lines.

producerkit logs through ``logging`` only, never ``print`` (the CLI and the bench print their own
output), one logger per area, so each can be set on its own:

=========================  =============================================================
``producerkit.producer``   the producer and its window: failures as counts, hook errors
``producerkit.kafka``      the Kafka backend
``producerkit.nats``       the NATS and JetStream backends: reconnects, with counts
``producerkit.clients``    which path (fast or public API) a client library takes, once
``producerkit.spark``      the Spark sink
``producerkit.otel``       the OpenTelemetry metrics
=========================  =============================================================

The client libraries log on their own loggers: aiokafka logs ``Unable connect to ...`` at ERROR
on every failed connection attempt (ten a second while a broker is down), nats-py an error per
failed read. :func:`route_client_logs` puts a :class:`RepeatFilter` on their loggers, so each
kind of line appears at most once per interval, followed by how many were held back, as
producerkit's own failure and reconnect lines do. A filter only drops or annotates records: it
configures no handler and prints nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from producerkit._types import Failure

__all__ = ["FailureLog", "RepeatFilter", "route_client_logs"]

#: The client libraries' loggers, by the names their modules log under (aiokafka's client logs
#: on ``aiokafka`` itself). A filter on a logger sees only what is logged on that logger, not what
#: its children propagate, so each one gets the filter.
CLIENT_LOGGERS: Final = (
    "aiokafka",
    "aiokafka.cluster",
    "aiokafka.conn",
    "aiokafka.producer.message_accumulator",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
    "nats",
    "nats.aio.client",
)
_CLIENT_PREFIXES: Final = ("aiokafka.", "nats.")

#: Seconds between two lines of one kind.
DEFAULT_INTERVAL: Final = 5.0
#: Kinds of lines remembered at most; beyond, those quiet for an interval are forgotten.
_MAX_KINDS: Final = 256


class RepeatFilter(logging.Filter):
    """Lets through one record of each kind per ``interval`` seconds (WARNING and above; lower
    levels pass untouched), and appends to it how many of that kind it held back since the last.

    A kind is the logger, the level, the message's format string (``'Unable connect to "%s:%s":
    %s'``, whatever the host) and the exception's class. Safe to share between threads.
    """

    def __init__(self, interval: float = DEFAULT_INTERVAL) -> None:
        super().__init__()
        self.interval = interval
        # kind -> [monotonic time of the last line let through, lines held back since]
        self._kinds: dict[tuple[object, ...], list[float]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        exc_type = record.exc_info[0] if record.exc_info else None
        kind = (record.name, record.levelno, str(record.msg), exc_type)
        now = time.monotonic()
        with self._lock:
            state = self._kinds.get(kind)
            if state is not None and now - state[0] < self.interval:
                state[1] += 1
                return False
            held = int(state[1]) if state is not None else 0
            since = now - state[0] if state is not None else 0.0
            if state is None and len(self._kinds) >= _MAX_KINDS:
                self._forget(now)
            self._kinds[kind] = [now, 0]
        if held:
            # Format once here (the record's own arguments), so the count cannot upset them.
            seconds = f"{since:.1f}" if since < 10 else f"{since:.0f}"
            record.msg = f"{record.getMessage()} ({held} more like this in {seconds}s)"
            record.args = None
        return True

    def _forget(self, now: float) -> None:
        for kind, (last, _) in list(self._kinds.items()):
            if now - last >= self.interval:
                del self._kinds[kind]


_installed: RepeatFilter | None = None
_declined = False
_install_lock = threading.Lock()


def route_client_logs(enabled: bool = True, *, interval: float = DEFAULT_INTERVAL) -> None:
    """Rate-limit the client libraries' log lines (aiokafka, nats-py): each kind of line at most
    once per ``interval`` seconds, with the count of those held back.

    A producer adds the filter when it starts (with the default interval); call this yourself
    to choose another interval, or with ``enabled=False`` to remove the filter and keep
    producers from adding it again. The filter only drops and annotates records: where they go
    is still your logging configuration's choice.
    """
    global _declined
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < 0:
        raise ValueError(f"interval must be a number of seconds, not {interval!r}")
    with _install_lock:
        _remove()
        _declined = not enabled
        if enabled:
            _install(interval)


def install_default() -> None:
    """What ``Producer.start()`` calls: the filter with the default interval, unless it is
    already there or the application turned it off with ``route_client_logs(False)``."""
    if _installed is None and not _declined:
        with _install_lock:
            if _installed is None and not _declined:
                _install(DEFAULT_INTERVAL)


def _install(interval: float) -> None:
    global _installed
    _installed = RepeatFilter(interval)
    for name in _client_logger_names():
        logging.getLogger(name).addFilter(_installed)


def _remove() -> None:
    global _installed
    if _installed is None:
        return
    for name in _client_logger_names():
        logging.getLogger(name).removeFilter(_installed)
    _installed = None


def _client_logger_names() -> list[str]:
    """The known client loggers, and any other logger of theirs that exists by now."""
    existing = [
        name
        for name in list(logging.Logger.manager.loggerDict)
        if name.startswith(_CLIENT_PREFIXES)
    ]
    return sorted({*CLIENT_LOGGERS, *existing})


class FailureLog:
    """Logs failures on ``logger`` as counts, at most one line per second, never one line per
    message."""

    INTERVAL: Final = 1.0

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._counts: dict[str, int] = {}
        self._last = 0.0

    def add(self, failure: Failure) -> None:
        name = type(failure.exception).__name__
        self._counts[name] = self._counts.get(name, 0) + 1
        now = time.monotonic()
        if now - self._last >= self.INTERVAL:
            self._last = now
            self.flush(example=failure)

    def flush(self, example: Failure | None = None) -> None:
        if not self._counts:
            return
        counts = ", ".join(f"{count} {name}" for name, count in sorted(self._counts.items()))
        detail = f" (latest: {example.exception})" if example is not None else ""
        self._logger.warning("messages failed: %s%s", counts, detail)
        self._counts.clear()
