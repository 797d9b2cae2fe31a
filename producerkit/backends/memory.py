"""``memory://[NAME]``: keeps every record in memory, in order, readable by tests and users.

All connections of a producer (and all producers given the same ``memory://NAME``) share one
:class:`MemoryStore`; ``producer.backend.store.records`` lists what was published. An unnamed
``memory://`` gets a store of its own. Options: ``partitions`` (default 1), ``max_message_size``.
"""

from __future__ import annotations

import threading
import weakref

import attrs

from producerkit._record import Record
from producerkit._types import HeaderPairs
from producerkit.backends.base import BackendSpec, Connection


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
        slot = (record.topic, record.partition)
        offset = self._next_offsets.get(slot, 0)
        self._next_offsets[slot] = offset + 1
        self.records.append(
            StoredRecord(
                record.topic,
                record.partition,
                offset,
                record.key,
                record.value,
                record.headers,
                record.msg_id,
                record.timestamp / 1000 if record.timestamp is not None else None,
            )
        )
        return offset

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


MEMORY = BackendSpec(
    connection=MemoryConnection,
    options={"partitions": int, "max_message_size": int},
    stores_timestamps=True,
)
