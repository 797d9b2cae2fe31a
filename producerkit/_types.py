"""Value types shared by the producer and its backends."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import attrs

Headers = tuple[tuple[str, bytes], ...]


@attrs.frozen(slots=True)
class Delivery:
    """Where the broker stored a message.

    ``offset`` is the Kafka offset, the JetStream stream sequence, or None for core NATS (which
    acknowledges a flush, not a message). ``partition`` is None where the topic is not partitioned.
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
    max_in_flight: int
    window_waits: int
    window_wait_seconds: float = 0.0
    connections: tuple[ConnectionStats, ...] = ()


class Record:
    """A message in flight: what the producer hands to a backend, and what comes back.

    Plain ``__slots__`` class rather than attrs: one is built per message on the hot path.
    Backends read the message fields and set ``offset`` before acking.
    """

    __slots__ = (
        "connection",
        "deadline",
        "future",
        "headers",
        "key",
        "msg_id",
        "offset",
        "partition",
        "seq",
        "topic",
        "value",
    )

    def __init__(
        self,
        seq: int,
        value: bytes,
        key: bytes | None,
        topic: str,
        partition: int | None,
        headers: Headers | None,
        msg_id: str | None,
        deadline: float,
        connection: int,
        future: asyncio.Future[Delivery] | None,
    ) -> None:
        self.seq = seq
        self.value = value
        self.key = key
        self.topic = topic
        self.partition = partition
        self.headers = headers
        self.msg_id = msg_id
        self.deadline = deadline
        self.connection = connection
        self.future = future
        self.offset: int | None = None

    def failure(self, exception: BaseException) -> Failure:
        headers = dict(self.headers) if self.headers is not None else None
        return Failure(
            self.value, self.key, self.topic, headers, self.partition, self.msg_id, exception
        )
