"""``null://``: acknowledges every message at once.

It measures producerkit's own overhead (validation, partitioning, window, accounting) with no I/O,
the way Tansu's null storage engine measures a broker's protocol path. Nothing is
stored, so a Delivery from null:// has no offset (None), as from core NATS.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from producerkit._record import Record
from producerkit.backends.base import BackendSpec, Connection


class NullConnection(Connection):
    """Acks every record inside ``send()``, with no offset (nothing is stored)."""

    def setup(self) -> None:
        self._partitions: int | None = self.options.get("partitions")
        self._acked = self.reports.acked

    async def connect(self) -> None:
        pass

    async def prepare_topic(self, topic: str) -> int | None:
        return self._partitions

    def send(self, record: Record) -> None:
        self._acked(record, None)  # nothing is stored, so there is no offset

    def send_many(
        self, records: list[Record], failed: Callable[[Record, Exception], object]
    ) -> list[tuple[Record, Awaitable[None]]]:
        self.reports.acked_run(records, None)
        return []

    async def close(self) -> None:
        pass


NULL = BackendSpec(
    connection=NullConnection,
    options={"partitions": int},
    holds_records=False,
    tombstone_refusal="null:// stores nothing, so there is nothing for a tombstone to delete",
    acks_with_offset=False,
    partitioned=False,
    stores_records=False,
)
