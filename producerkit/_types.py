"""Value types shared by the producer and its backends."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

import attrs

Headers = tuple[tuple[str, bytes], ...]


@attrs.frozen(slots=True)
class Delivery:
    """Where the broker stored a message.

    ``offset`` is the Kafka offset, the JetStream stream sequence, the position in a
    ``memory://`` topic, or None for core NATS (which acknowledges a flush, not a message) and
    ``null://`` (which stores nothing). ``partition`` is None where the topic is not partitioned.
    """

    topic: str
    partition: int | None
    offset: int | None


@attrs.frozen(slots=True)
class Failure:
    """A message that was not delivered, with everything needed to send it again."""

    value: bytes
    key: bytes | None
    topic: str
    headers: Mapping[str, bytes] | None
    partition: int | None
    msg_id: str | None
    exception: BaseException

    def retry_kwargs(self) -> dict[str, Any]:
        """Keywords for ``produce(failure.value, **failure.retry_kwargs())`` to resend it."""
        return {
            "key": self.key,
            "topic": self.topic,
            "headers": self.headers,
            "msg_id": self.msg_id,
        }


@attrs.frozen(slots=True)
class ConnectionStats:
    """Per-connection counters: how traffic spreads over ``connections=N``."""

    index: int
    produced: int
    acked: int
    failed: int
    in_flight: int


@attrs.frozen(slots=True)
class Stats:
    """A snapshot of a producer's counters.

    ``produced == acked + failed + in_flight`` holds in every snapshot.
    """

    produced: int
    acked: int
    failed: int
    in_flight: int
    #: The most messages that were in flight at once.
    peak_in_flight: int
    window_waits: int
    window_wait_seconds: float = 0.0
    connections: tuple[ConnectionStats, ...] = ()

    @property
    def max_in_flight(self) -> int:
        """Deprecated: :attr:`peak_in_flight`."""
        warnings.warn(
            "Stats.max_in_flight is deprecated: use Stats.peak_in_flight",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.peak_in_flight


@attrs.frozen(slots=True)
class Outcome:
    """Messages that settled together: all acked (``error`` is None) or all failed with ``error``.

    What ``Producer(on_outcome=...)`` is called with: one per Kafka batch acked, per JetStream
    PubAck or core NATS message, and per failed message. Built only when a hook is set.
    """

    #: Each message's number: the n-th message the producer admitted is number n.
    numbers: tuple[int, ...]
    #: ``time.monotonic()`` when each message was produced, in the same order.
    produced_at: tuple[float, ...]
    #: ``time.monotonic()`` when they settled.
    settled_at: float
    topic: str
    partition: int | None
    #: Which of the producer's connections carried them.
    connection: int
    error: BaseException | None = None

    @property
    def acked(self) -> bool:
        return self.error is None


Record: TypeAlias = tuple[
    int,  # SEQ
    bytes,  # VALUE
    bytes | None,  # KEY
    str,  # TOPIC
    int | None,  # PARTITION
    Headers | None,  # HEADERS
    str | None,  # MSG_ID
    float,  # DEADLINE
    int,  # CONNECTION
    "asyncio.Future[Delivery] | None",  # FUTURE
]
"""A message in flight: what the producer hands to a backend, read as ``record[TOPIC]`` etc.

A plain tuple, not a class: one is built per message on the hot path, and a tuple literal costs
less than half of any class instance (or tuple subclass). And once a nonblocking record (no
future) has survived one garbage collection, CPython stops tracking it, so the thousands a
batching backend holds in flight cost the collector nothing.
"""

# The fields of a Record, by position.
SEQ: Final = 0
VALUE: Final = 1
KEY: Final = 2
TOPIC: Final = 3
PARTITION: Final = 4
HEADERS: Final = 5
MSG_ID: Final = 6
DEADLINE: Final = 7
CONNECTION: Final = 8
FUTURE: Final = 9


def failure_of(record: Record, exception: BaseException) -> Failure:
    """The public Failure report for a record that failed with ``exception``."""
    headers = record[HEADERS]
    return Failure(
        record[VALUE],
        record[KEY],
        record[TOPIC],
        dict(headers) if headers is not None else None,
        record[PARTITION],
        record[MSG_ID],
        exception,
    )
