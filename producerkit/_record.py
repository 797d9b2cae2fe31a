"""A message on its way: validated (:class:`Message`), then in flight (:class:`Record`).

Both are named tuples: Python reads their fields by name, the C speedups by position (the
positions are checked against each C extension's at import, see ``producerkit._fast``). Where the C
speedups run, records are ``_speedups.Record``, this Record's C twin (the same fields, by name
and by position, from a free list of its own: one is built per message). A record that holds
only bytes, str, numbers and None is not tracked by the garbage collector, so the thousands a
batching backend holds in flight cost the collector nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from producerkit._types import Headers

if TYPE_CHECKING:
    from producerkit._types import Delivery

#: What a record carries to tell a caller waiting for it its outcome: the blocking caller's future
#: (an asyncio one, or a concurrent one for a caller in another thread), or None.
Slot: TypeAlias = "asyncio.Future[Delivery] | concurrent.futures.Future[Delivery] | None"


class Message(NamedTuple):
    """A message as ``MessageRules.message`` validated it: bytes, a topic, headers as pairs.

    ``value`` is None for a tombstone (only on a backend that stores one); ``partition`` is the
    one the caller asked for, or None; ``timestamp`` the CreateTime in epoch milliseconds the
    producer fixed (``produce(timestamp=...)``, or the produce time where its outcome is
    reported), or None.
    """

    value: bytes | None
    key: bytes | None
    topic: str
    partition: int | None
    headers: Headers | None
    msg_id: str | None
    timestamp: int | None


class Record(NamedTuple):
    """A message in flight: admitted into the window, handed to a connection, waiting for its
    one outcome. ``partition`` is where it was routed (None on an unpartitioned topic),
    ``deadline`` the ``time.monotonic()`` by which it must be acked, ``connection`` the index of
    the connection carrying it, ``seq`` its number (the n-th record admitted has n), ``slot``
    what tells a waiting caller its outcome, ``context`` what ``on_delivery`` is told with it."""

    seq: int
    value: bytes | None
    key: bytes | None
    topic: str
    partition: int | None
    headers: Headers | None
    msg_id: str | None
    deadline: float
    connection: int
    slot: Slot
    timestamp: int | None
    context: Any = None


_new = tuple.__new__


def new_record(
    seq: int,
    message: Message,
    partition: int | None,
    deadline: float,
    connection: int,
    slot: Slot,
    context: Any = None,
) -> Record:
    """The record of ``message`` (the Python twin of what the C admission builds)."""
    return _new(
        Record,
        (
            seq,
            message[0],
            message[1],
            message[2],
            partition,
            message[4],
            message[5],
            deadline,
            connection,
            slot,
            message[6],
            context,
        ),
    )


def with_headers(record: Record, headers: Headers | None) -> Record:
    """``record`` with other ``headers`` (either core's Record: both are tuples)."""
    return _new(type(record), (*record[:5], headers, *record[6:]))


def new_message(
    value: bytes | None,
    key: bytes | None,
    topic: str,
    partition: int | None,
    headers: Headers | None,
    msg_id: str | None,
    timestamp: int | None,
) -> Message:
    """A Message without the generated constructor's Python call (it is built per message)."""
    return _new(Message, (value, key, topic, partition, headers, msg_id, timestamp))
