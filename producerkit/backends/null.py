"""``null://``: acknowledges every message at once.

It measures producerkit's own overhead (validation, partitioning, window, accounting) with no I/O,
the way Tansu's null storage engine measures a broker's protocol path (seed 004). Nothing is
stored, so a Delivery from null:// has no offset (None), as from core NATS.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from producerkit._types import Record
from producerkit.backends.base import Backend


class NullBackend(Backend):
    OPTIONS: ClassVar[Mapping[str, type]] = {"partitions": int}
    HOLDS_RECORDS: ClassVar[bool] = False  # acked inside send()

    async def connect(self) -> None:
        self._partitions: int | None = self.options.get("partitions")
        self._acked = self.sink.acked

    async def prepare_topic(self, topic: str) -> int | None:
        return self._partitions

    def send(self, record: Record) -> None:
        self._acked(record, None)  # nothing is stored, so there is no offset

    async def close(self) -> None:
        pass
