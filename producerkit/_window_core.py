"""The window's core: the ledger of records in flight and the leaf functions that settle them.

:class:`PyWindowCore` admits (the Python twin of ``_speedups.WindowCore``; :data:`WindowCore` is
the one this installation runs), ``pop_run`` and ``tell_run`` settle a run of records in C where
it was built, and :func:`delivery_of` is the Delivery a record settles with. The window
(``producerkit._window``) is written on them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import attrs

from producerkit._fast import speedups
from producerkit._record import Message, Record, Slot, new_record
from producerkit._types import Delivery


class PyWindowCore:
    """The window's ledger and :meth:`admit`: the Python twin of ``_speedups.WindowCore`` (same
    constructor, fields and ``admit``)."""

    __slots__ = (
        "_seqs",
        "_watch",
        "handed",
        "limit",
        "peak_in_flight",
        "pending",
        "taken",
        "timeout",
        "untrack",
        "watching",
    )

    def __init__(
        self,
        limit: int,
        timeout: float,
        watch: Callable[[Record], object],
        untrack: bool = False,
    ) -> None:
        self.limit = limit
        self.timeout = timeout
        self.untrack = untrack  # the C twin stops the GC tracking records: see _fast.untracked
        self.pending: dict[int, Record] = {}
        self.peak_in_flight = 0
        #: Messages handed over by other threads, and those of them admitted (see reserve()).
        self.handed = 0
        self.taken = 0
        self._watch = watch  # called with the first record into an empty window unless watching
        #: The window's deadline timer is armed (the window sets and clears it): while it is,
        #: a record into an empty window needs no watch() call.
        self.watching = False
        self._seqs = itertools.count(1)

    def admit(
        self,
        message: Message,
        partition: int | None,
        connection: int,
        slot: Slot,
        context: Any = None,
    ) -> Record | None:
        """Put ``message`` in flight as a record routed to ``partition`` on ``connection``
        (carrying ``slot`` and ``context``): in ``pending``, counted in the peak, its deadline
        watched if the window was empty. From here on it must end acked or failed. None (and
        nothing done) if the window is full."""
        pending = self.pending
        in_flight = len(pending)
        if in_flight + self.handed - self.taken >= self.limit:
            return None
        seq = next(self._seqs)
        record = new_record(
            seq, message, partition, time.monotonic() + self.timeout, connection, slot, context
        )
        pending[seq] = record
        if in_flight >= self.peak_in_flight:
            self.peak_in_flight = in_flight + 1
        if not in_flight and not self.watching:
            self._watch(record)
        return record


#: The core this installation runs: the C twin where it was built.
WindowCore: Any = speedups.WindowCore if speedups is not None else PyWindowCore


def py_pop_run(pending: dict[int, Record], records: list[Record]) -> tuple[int, list[int] | None]:
    """Remove each record from ``pending`` and count those that were there; the positions, in
    ``records``, of removed records with a slot (None if none): the Python twin of
    ``_speedups.pop_run``."""
    pop = pending.pop
    count = 0
    waiting: list[int] | None = None
    for position, record in enumerate(records):
        if pop(record.seq, None) is not None:
            count += 1
            if record.slot is not None:
                if waiting is None:
                    waiting = []
                waiting.append(position)
    return count, waiting


def py_tell_run(
    pending: dict[int, Record],
    records: list[Record],
    first_offset: int | None,
    stored_at: int | None,
    make_delivery: Callable[..., Delivery],
    on_delivery: Callable[[Delivery, Any], object],
    report: Callable[[Exception], object],
) -> int:
    """pop_run's settling with ``on_delivery``: the Python twin of ``_speedups.tell_run`` (see
    its docstring). Returns how many records were still pending."""
    pop = pending.pop
    count = 0
    offset = first_offset
    for record in records:
        if pop(record.seq, None) is not None:
            count += 1
            stamp = stored_at if stored_at is not None else record.timestamp
            delivery = make_delivery(
                record.topic, record.partition, offset, False,
                None if stamp is None else stamp / 1000,
            )  # fmt: skip
            try:
                on_delivery(delivery, record.context)
            except Exception as exc:
                report(exc)
            slot = record.slot
            if slot is not None and not slot.done():
                slot.set_result(delivery)
        if offset is not None:
            offset += 1
    return count


#: ``pop_run(pending, records) -> (count, waiting)``: see InFlightWindow.acked_run.
pop_run: Callable[[dict[int, Record], list[Record]], tuple[int, list[int] | None]] = (
    py_pop_run if speedups is None else speedups.pop_run
)
#: ``tell_run(...) -> count``: see :func:`py_tell_run`.
tell_run: Callable[..., int] = py_tell_run if speedups is None else speedups.tell_run
#: ``new_delivery(topic, partition, offset, duplicate, timestamp)``: a Delivery, made in C
#: where it was built (a Delivery's fields are plain slots; its __init__ checks nothing).
new_delivery: Any = (
    Delivery
    if speedups is None
    else speedups.SlotsMaker(Delivery, tuple(field.name for field in attrs.fields(Delivery)))
)


def delivery_of(
    record: Record, offset: int | None, duplicate: bool = False, stored_at: int | None = None
) -> Delivery:
    """The Delivery of a record stored at ``offset``: its timestamp is the broker's
    LogAppendTime (``stored_at``, epoch ms) where it gave one, else the CreateTime the producer
    fixed for the record, else None."""
    stamp = stored_at if stored_at is not None else record.timestamp
    return new_delivery(  # type: ignore[no-any-return]
        record.topic,
        record.partition,
        offset,
        duplicate,
        None if stamp is None else stamp / 1000,
    )
