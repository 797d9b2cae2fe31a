"""``memory://[NAME]``: keeps every record in memory, in order, readable by tests and users.

All connections of a producer (and all producers given the same ``memory://NAME``) share one
:class:`MemoryStore`; ``producer.backend.store.records`` lists what was published. An unnamed
``memory://`` gets a store of its own. Options: ``partitions`` (default 1), ``max_message_size``.

``Producer.atomic_batch()`` works here as on Kafka (one batch open at a time), so code that uses
atomic batches is testable without a broker: a batch's records take their offsets as they are
added, wait beside the store, and are appended to ``store.records`` together,
in order, when the batch commits; an aborted batch's never appear (its offsets stay unused, as an
aborted Kafka transaction's do). ``atomic_batch(prepare=True)`` is refused (nothing else could
end the transaction).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
import weakref
from typing import TYPE_CHECKING

import attrs

from producerkit._record import Record
from producerkit._types import HeaderPairs
from producerkit.backends.base import (
    AtomicParts,
    AtomicSide,
    AtomicWriter,
    AtomicWrites,
    BackendSpec,
    Connection,
)

if TYPE_CHECKING:
    from producerkit._record import Message


@attrs.frozen(slots=True)
class StoredRecord:
    """A record as stored: ``value`` None is a tombstone; ``timestamp`` is the CreateTime the
    producer fixed (``produce(timestamp=...)``, or a blocking produce's time) in epoch seconds,
    to the millisecond, else None. It is left out of comparisons: the same messages stored twice
    compare equal whenever they were produced."""

    topic: str
    partition: int | None
    offset: int
    key: bytes | None
    value: bytes | None
    headers: HeaderPairs | None
    msg_id: str | None
    timestamp: float | None = attrs.field(default=None, eq=False)


class MemoryStore:
    """The records of one named memory broker, with an offset sequence per (topic, partition)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.records: list[StoredRecord] = []
        self._next_offsets: dict[tuple[str, int | None], int] = {}

    def append(self, record: Record) -> int:
        """Store ``record`` at the next offset of its (topic, partition); that offset."""
        stored = self.reserve(record)
        self.records.append(stored)
        return stored.offset

    def reserve(self, record: Record) -> StoredRecord:
        """``record`` as it will be stored, at the next offset of its (topic, partition), which
        it takes now; it is not in :attr:`records` until :meth:`extend` puts it there (an atomic
        batch's records, at its commit)."""
        slot = (record.topic, record.partition)
        offset = self._next_offsets.get(slot, 0)
        self._next_offsets[slot] = offset + 1
        return StoredRecord(
            record.topic,
            record.partition,
            offset,
            record.key,
            record.value,
            record.headers,
            record.msg_id,
            record.timestamp / 1000 if record.timestamp is not None else None,
        )

    def extend(self, stored: list[StoredRecord]) -> None:
        """Append reserved records together (a committed atomic batch's)."""
        self.records.extend(stored)

    def topic(self, topic: str) -> list[StoredRecord]:
        return [record for record in self.records if record.topic == topic]

    def clear(self) -> None:
        self.records.clear()
        self._next_offsets.clear()


_stores: weakref.WeakValueDictionary[str, MemoryStore] = weakref.WeakValueDictionary()
_stores_lock = threading.Lock()


def get_store(name: str) -> MemoryStore:
    """The store behind ``memory://NAME`` (created on first use, dropped when nobody holds it)."""
    with _stores_lock:
        store = _stores.get(name)
        if store is None:
            store = _stores[name] = MemoryStore(name)
        return store


class MemoryConnection(Connection):
    """Appends each record to the named store and acks it at once with its offset there."""

    def setup(self) -> None:
        self.store = get_store(self.url.name)
        self._partitions: int = self.options.get("partitions", 1)
        self.max_message_size = self.options.get("max_message_size", 1024 * 1024)

    async def connect(self) -> None:
        pass

    @property
    def records(self) -> list[StoredRecord]:
        return self.store.records

    async def prepare_topic(self, topic: str) -> int | None:
        return self._partitions

    def send(self, record: Record) -> None:
        self.reports.acked(record, self.store.append(record))

    async def close(self) -> None:
        pass


class _MemoryAtomicWrites(AtomicWrites):
    """A producer's atomic batches on memory://: one open at a time, as Kafka's transactions."""

    prepare_refusal = "memory:// has no other process to end a transaction left open"

    def __init__(self, parts: AtomicParts) -> None:
        self.parts = parts
        self.lock = asyncio.Lock()

    def writer(self, side: AtomicSide) -> AtomicWriter:
        return _MemoryBatchWriter(self, side)


class _MemoryBatchWriter(AtomicWriter):
    """Reserves each record's offset as it is added; appends them together at the commit."""

    def __init__(self, writes: _MemoryAtomicWrites, side: AtomicSide) -> None:
        self._writes = writes
        self._side = side
        self.id = uuid.uuid4().hex
        self.name = f"atomic batch {self.id}"
        self._reserved: list[StoredRecord] = []

    async def open(self) -> None:
        await self._writes.lock.acquire()

    async def close(self) -> None:
        self._writes.lock.release()

    async def add(self, messages: list[Message]) -> None:
        connection = self._writes.parts.connections()[0]
        assert isinstance(connection, MemoryConnection)
        for message in messages:
            record = await self._side.admit(message, 0)
            self._reserved.append(connection.store.reserve(record))

    async def commit(self, prepare: bool) -> None:
        connection = self._writes.parts.connections()[0]
        assert isinstance(connection, MemoryConnection)
        connection.store.extend(self._reserved)
        offsets: list[int | None] = [stored.offset for stored in self._reserved]
        self._writes.parts.reports.acked_each(self._side.records, offsets)


MEMORY = BackendSpec(
    connection=MemoryConnection,
    options={"partitions": int, "max_message_size": int},
    stores_timestamps=True,
    atomic_writes=_MemoryAtomicWrites,
)
