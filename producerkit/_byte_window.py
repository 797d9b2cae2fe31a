"""The in-flight window with a bound in bytes too (``max_in_flight_bytes``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from producerkit._message import message_size
from producerkit._record import Message, Record, Slot
from producerkit._types import DeliveryCallback
from producerkit._window import ErrorCallback, InFlightWindow, OutcomeCallback

if TYPE_CHECKING:
    from producerkit._core import Core


class ByteBoundedWindow(InFlightWindow):
    """The window with a bound in bytes too (``max_in_flight_bytes``): a message's bytes (value,
    key and headers) count from its admission to its settlement. A message waits while either
    bound is reached, and waiters resume when both have drained to their resume points. One
    message larger than the whole bound goes alone, into an empty window."""

    __slots__ = ("byte_limit", "byte_low_water", "bytes_in_flight", "peak_bytes_in_flight")

    def __init__(
        self,
        limit: int,
        timeout: float,
        connections: int,
        on_error: ErrorCallback | None,
        on_outcome: OutcomeCallback | None = None,
        *,
        byte_limit: int,
        untrack: bool = False,
        resume_at: float = 0.5,
        unwritten: Callable[[list[Record]], set[int]] = lambda records: set(),
        on_delivery: DeliveryCallback | None = None,
        core: Core | None = None,
    ) -> None:
        super().__init__(
            limit,
            timeout,
            connections,
            on_error,
            on_outcome,
            untrack=untrack,
            resume_at=resume_at,
            unwritten=unwritten,
            on_delivery=on_delivery,
            core=core,
        )
        self.byte_limit = byte_limit
        self.byte_low_water = int(byte_limit * resume_at)
        self.bytes_in_flight = 0
        self.peak_bytes_in_flight = 0

    def is_full(self, size: int) -> bool:
        return super().is_full(size) or self._over_bytes(size)

    def _over_bytes(self, size: int) -> bool:
        """The byte bound: whether ``size`` more bytes would pass it (a message larger than
        the whole bound goes alone, into an empty window)."""
        return bool(self.pending) and self.bytes_in_flight + size > self.byte_limit

    def admit(
        self,
        message: Message,
        partition: int | None,
        connection: int,
        slot: Slot,
        context: Any = None,
        reserved: bool = False,
    ) -> Record | None:
        size = message_size(message.value, message.key, message.headers)
        if self._over_bytes(size):
            return None
        record = super().admit(message, partition, connection, slot, context, reserved)
        if record is not None:
            in_flight = self.bytes_in_flight + size
            self.bytes_in_flight = in_flight
            if in_flight > self.peak_bytes_in_flight:
                self.peak_bytes_in_flight = in_flight
        return record

    def acked(
        self, record: Record, offset: int | None, duplicate: bool = False, observe: bool = True
    ) -> None:
        if record.seq in self.pending:
            self.bytes_in_flight -= record_size(record)
            super().acked(record, offset, duplicate, observe)

    def acked_run(
        self, records: list[Record], first_offset: int | None, stored_at: int | None = None
    ) -> None:
        pending = self.pending
        self.bytes_in_flight -= sum(record_size(r) for r in records if r.seq in pending)
        super().acked_run(records, first_offset, stored_at)

    def failed(self, record: Record, exc: BaseException, possibly_stored: bool = True) -> None:
        if record.seq in self.pending:
            self.bytes_in_flight -= record_size(record)
            super().failed(record, exc, possibly_stored)

    def fail_unadmitted(
        self, message: Message, slot: Slot, context: Any, exc: BaseException
    ) -> None:
        self.bytes_in_flight += message_size(message.value, message.key, message.headers)
        super().fail_unadmitted(message, slot, context, exc)

    def _wake_drained(self, in_flight: int) -> None:
        if self.bytes_in_flight <= self.byte_low_water:
            super()._wake_drained(in_flight)

    def byte_counts(self) -> tuple[int | None, int | None]:
        return self.bytes_in_flight, self.peak_bytes_in_flight


def record_size(record: Record) -> int:
    return message_size(record.value, record.key, record.headers)
