"""Value types shared by the producer and its backends."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from producerkit._record import Record

#: A message's headers as (name, value) pairs, in order, a name possibly repeated. On Kafka and
#: memory:// a value may also be None (a null header value): see HeaderPairs.
Headers = tuple[tuple[str, bytes], ...]
#: Headers as produce() accepts and a Failure reports them, None values included.
HeaderPairs = tuple[tuple[str, bytes | None], ...]

logger = logging.getLogger("producerkit.producer")


@attrs.frozen(slots=True)
class Delivery:
    """Where the broker stored a message.

    ``offset`` is the Kafka offset, the JetStream stream sequence, the position in a
    ``memory://`` topic, or None for core NATS (which acknowledges a flush, not a message) and
    ``null://`` (which stores nothing). ``partition`` is None where the topic is not partitioned.
    ``duplicate`` is true when JetStream recognised the message's ``msg_id`` as one it already
    stored (and did not store it again): ``offset`` is then the original's sequence.
    ``timestamp`` (epoch seconds, millisecond precision) is the Kafka CreateTime the record was
    stored with (``produce(timestamp=...)``, else the produce time), and the record's time on
    ``memory://``; None where the broker stores no time of ours (NATS, ``null://``).
    """

    topic: str
    partition: int | None
    offset: int | None
    duplicate: bool = False
    timestamp: float | None = None


@attrs.frozen(slots=True)
class Failure:
    """A message that was not delivered, with everything needed to send it again.

    ``value`` is None for a tombstone. ``headers`` maps each header name to its last value (a
    name given twice keeps only its last); ``header_pairs`` keeps every pair, in order, as the
    message carried them. ``partition`` is the partition the message was routed to (None where
    topics are not partitioned), ``timestamp`` its CreateTime in epoch seconds where the
    producer fixed one (``produce(timestamp=...)``, or a message whose outcome is awaited on
    Kafka and ``memory://``), else None.

    ``possibly_stored`` says whether the broker may have stored the message anyway: False when
    it was never written to a connection (and never will be: a failed message is not written
    after its failure), or when the broker refused it; True when it was written and its answer
    was lost (a timeout, a reset connection). Replay the ones with False as they are; those
    with True only where a duplicate does no harm, or with a ``msg_id`` (JetStream drops
    duplicates of it).
    """

    value: bytes | None
    key: bytes | None
    topic: str
    headers: Mapping[str, bytes | None] | None
    partition: int | None
    msg_id: str | None
    exception: BaseException
    header_pairs: HeaderPairs | None = None
    timestamp: float | None = None
    possibly_stored: bool = True

    def retry_kwargs(self, *, drop_expectations: bool = False) -> dict[str, Any]:
        """Keywords for ``produce(failure.value, **failure.retry_kwargs())`` to resend it.

        The message goes again to the same topic and partition (the one it was routed to: the
        same as its key would choose, unless the topic gained partitions since), with the same
        key, msg_id, CreateTime (where fixed) and every header pair, repeated names included.
        JetStream's ``Nats-Expected-*`` headers are among them: a message that failed after it
        may have been stored (a timeout, a lost connection) and that expected a last (subject)
        sequence is then refused rather than stored twice.

        A conflict is never resent blindly. For a failure with
        :class:`~producerkit.ExpectationFailed` (the stream was not as the message expected, so
        the same message would be refused again) this raises ExpectationFailed, chained to the
        failure's, unless ``drop_expectations=True`` asks for keywords without the
        ``Nats-Expected-*`` headers: a write whatever the stream holds now.
        """
        from producerkit.errors import ExpectationFailed
        from producerkit.jetstream import EXPECTED_HEADERS

        headers: Any = self.header_pairs
        if headers is None:  # a Failure built by hand: its mapping
            headers = self.headers
        if drop_expectations:
            if headers is not None:
                items = headers.items() if isinstance(headers, Mapping) else headers
                kept = [(name, v) for name, v in items if name not in EXPECTED_HEADERS]
                headers = (dict(kept) if isinstance(headers, Mapping) else kept) or None
        elif isinstance(self.exception, ExpectationFailed):
            raise ExpectationFailed(
                f"not resent: {self.exception} (read the stream again and decide; "
                "retry_kwargs(drop_expectations=True) resends it without its expectations)",
                code=self.exception.code,
            ) from self.exception
        if isinstance(headers, tuple):
            headers = list(headers)
        kwargs: dict[str, Any] = {
            "key": self.key,
            "topic": self.topic,
            "headers": headers,
            "msg_id": self.msg_id,
        }
        if self.partition is not None:
            kwargs["partition"] = self.partition
        if self.timestamp is not None:
            kwargs["timestamp"] = self.timestamp
        return kwargs


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
    #: The most bytes in flight at once (with ``max_in_flight_bytes``; None without it).
    peak_bytes_in_flight: int | None = None
    #: Produces that waited for the rate limit (``max_rate``/``max_bytes_rate``), and how long.
    rate_waits: int = 0
    rate_wait_seconds: float = 0.0
    #: The bytes in flight now (with ``max_in_flight_bytes``; None without it).
    bytes_in_flight: int | None = None


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
    #: For failed messages: whether the broker may have stored them (see Failure); None if acked.
    possibly_stored: bool | None = None

    @property
    def acked(self) -> bool:
        return self.error is None


DeliveryCallback = Callable[["Delivery | Failure", Any], object]


def failure_of(record: Record, exception: BaseException, possibly_stored: bool = True) -> Failure:
    """The public Failure report for a record that failed with ``exception``."""
    headers = record.headers
    timestamp = record.timestamp
    return Failure(
        record.value,
        record.key,
        record.topic,
        dict(headers) if headers is not None else None,
        record.partition,
        record.msg_id,
        exception,
        headers,
        timestamp / 1000 if timestamp is not None else None,
        possibly_stored,
    )
