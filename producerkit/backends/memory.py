"""``memory://[NAME]``: keeps every record in memory, in order, readable by tests and users.

All connections of a producer (and all producers given the same ``memory://NAME``) share one
:class:`MemoryStore`; ``producer.backend.store.records`` lists what was published. An unnamed
``memory://`` gets a store of its own. Options: ``partitions`` (default 1), ``max_message_size``.

``Producer.atomic_batch()`` works here as on Kafka (a transaction through a connection of its
own), so code that uses atomic batches is testable without a broker: a batch's records take their
offsets as they are sent, wait beside the store, and are appended to ``store.records`` together,
in order, when the batch commits; an aborted batch's never appear (its offsets stay unused, as an
aborted Kafka transaction's do). ``atomic_batch(prepare=True)`` is refused (nothing else could
end the transaction).
"""

from __future__ import annotations

import threading
import weakref

import attrs

from producerkit._record import Record
from producerkit._types import HeaderPairs
from producerkit.backends.base import TRANSACTIONAL_OPTION, BackendSpec, Connection
from producerkit.errors import AtomicBatchError


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
    """Appends each record to the named store and acks it at once with its offset there; the
    transactional connection of atomic batches (``_transactional_id``) keeps an open
    transaction's records aside (acked with their reserved offsets) until it ends."""

    def setup(self) -> None:
        self.store = get_store(self.url.name)
        self._partitions: int = self.options.get("partitions", 1)
        self.max_message_size = self.options.get("max_message_size", 1024 * 1024)
        self._transactional = self.options.get(TRANSACTIONAL_OPTION) is not None
        #: The open transaction's records, reserved in the store; None: none is open.
        self._transaction: list[StoredRecord] | None = None

    async def connect(self) -> None:
        pass

    @property
    def records(self) -> list[StoredRecord]:
        return self.store.records

    async def prepare_topic(self, topic: str) -> int | None:
        return self._partitions

    def send(self, record: Record) -> None:
        if self._transaction is None:
            if self._transactional:
                raise AtomicBatchError("no transaction is open", kind="aborted")
            self.reports.acked(record, self.store.append(record))
            return
        stored = self.store.reserve(record)
        self._transaction.append(stored)
        self.reports.acked(record, stored.offset)

    async def begin_transaction(self) -> None:
        self._transaction = []

    async def add_to_transaction(self, topic: str, partitions: list[int]) -> None:
        if self._transaction is None:
            raise AtomicBatchError("no transaction is open", kind="aborted")

    async def end_transaction(self, *, commit: bool) -> None:
        records, self._transaction = self._transaction or [], None
        if commit:
            self.store.extend(records)

    async def close(self) -> None:
        self._transaction = None  # an open transaction's records are never stored


MEMORY = BackendSpec(
    connection=MemoryConnection,
    options={"partitions": int, "max_message_size": int},
    stores_timestamps=True,
    atomic_batch_refusal=None,
    atomic_batch_is_transaction=True,
    prepare_refusal="memory:// has no other process to end a transaction left open",
)
