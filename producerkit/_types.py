"""Value types shared by the producer and its backends."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from operator import itemgetter

try:  # the C descriptor namedtuple fields use: as fast as a slot, unlike property(itemgetter)
    from collections import _tuplegetter  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - other Pythons
    _tuplegetter = None
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


def _field(index: int) -> Any:
    if _tuplegetter is not None:
        return _tuplegetter(index, None)
    return property(itemgetter(index))


class Record(tuple):  # type: ignore[type-arg]
    """A message in flight: what the producer hands to a backend.

    A tuple with named fields rather than a slots class: one is built per message on the hot path
    and ``tuple.__new__`` is about twice as fast as an ``__init__`` assigning ten slots. Build one
    with ``tuple.__new__(Record, fields)``. Backends read the fields and report
    ``acked(record, offset)``.
    """

    __slots__ = ()

    seq: int = _field(0)
    value: bytes = _field(1)
    key: bytes | None = _field(2)
    topic: str = _field(3)
    partition: int | None = _field(4)
    headers: Headers | None = _field(5)
    msg_id: str | None = _field(6)
    deadline: float = _field(7)
    connection: int = _field(8)
    future: asyncio.Future[Delivery] | None = _field(9)

    def failure(self, exception: BaseException) -> Failure:
        headers = dict(self.headers) if self.headers is not None else None
        return Failure(
            self.value, self.key, self.topic, headers, self.partition, self.msg_id, exception
        )

    def __repr__(self) -> str:
        return f"<Record #{self.seq} topic={self.topic!r} partition={self.partition}>"
