"""The bounded in-flight window: the one place where messages in flight are counted, bounded and
settled.

A producer may have at most ``limit`` messages in flight (and, with a byte bound, at most
``byte_limit`` bytes). When a produce finds the window full it waits until completions have
drained it to ``resume_at`` of the limit (half by default), then resumes: waiting for half rather
than for one free slot turns a stream of tiny wake-ups into a few large bursts, and gives a
saturated link time to recover before it is filled again. Waiters are woken by completions, never
by polling. Each waiter has its own future, so a cancelled caller cannot cancel anybody else's
wait, and nothing is counted for a caller cancelled while it waits.

The window's core admits: ``core.admit(message, partition, connection, slot)`` builds the
message's :class:`~producerkit._record.Record` and puts it in ``pending`` (insertion-ordered by
admission, hence by deadline), or returns None when the window is full. A record stays there
until exactly one of :meth:`InFlightWindow.acked` / :meth:`InFlightWindow.failed` removes it. That
single ledger gives ``produced == acked + failed + in_flight`` at every moment, per-message
deadlines with one timer for the whole window (no task or timer per message), and the list of what
is left at close. The core is the producer's ``Core.WindowCore`` (``producerkit._core``: C where
it was built, else ``producerkit._core_py.WindowCore``), whose ``full()`` is the in-flight bound.

Messages another thread hands to the producer (``producerkit._handoff``) count as in flight from
the moment they are handed: :meth:`InFlightWindow.reserve` takes their room in the calling
thread, and the loop admits them into that room.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from producerkit._core_py import answer_slot
from producerkit._logging import FailureLog
from producerkit._record import Message, Record, Slot
from producerkit._types import (
    ConnectionStats,
    Delivery,
    DeliveryCallback,
    Failure,
    Outcome,
    Stats,
    failure_of,
)
from producerkit.errors import ProduceError, ProduceTimeout, Purged

if TYPE_CHECKING:
    from producerkit._core import Core

logger = logging.getLogger("producerkit.producer")


ErrorCallback = Callable[[Failure], object]
OutcomeCallback = Callable[[Outcome], object]

#: The most Failures kept between two ``flush()`` calls; beyond them only counts are kept (a
#: long outage must not grow memory without bound: each holds its message and its exception).
KEPT_FAILURES = 10_000


class InFlightWindow:
    """The window: its core, waiting for room, settling, deadlines, failures, counters."""

    __slots__ = (
        "_empty_waiters",
        "_failure_log",
        "_loop",
        "_new_delivery",
        "_on_delivery",
        "_on_error",
        "_on_outcome",
        "_per_connection",
        "_pop_run",
        "_purging",
        "_room_waiters",
        "_settle_waiters",
        "_tell_run",
        "_unwritten",
        "_waiting",
        "acked_count",
        "connection_acked",
        "connection_failed",
        "core",
        "failed_count",
        "failures",
        "low_water",
        "on_full",
        "pending",
        "timer",
        "unkept",
        "wait_seconds",
        "waits",
    )

    def __init__(
        self,
        limit: int,
        timeout: float,
        connections: int,
        on_error: ErrorCallback | None,
        on_outcome: OutcomeCallback | None = None,
        *,
        untrack: bool = False,
        resume_at: float = 0.5,
        unwritten: Callable[[list[Record]], set[int]] = lambda records: set(),
        on_delivery: DeliveryCallback | None = None,
        core: Core | None = None,
    ) -> None:
        if core is None:
            from producerkit._core import active

            core = active()
        self.core = core.WindowCore(limit, timeout, self.watch, untrack)
        self._pop_run = core.pop_run
        self._tell_run = core.tell_run
        self._new_delivery = core.new_delivery
        #: ``unwritten(records)``: the seqs of those their connections still hold unwritten
        #: (they are then never written), asked of records failed by their deadline or at close.
        self._unwritten = unwritten
        #: seq -> record in flight, in admission order: the C core's Ledger or the Python
        #: core's dict, used through what both have (in, len, pop, del, values(), iteration).
        self.pending: MutableMapping[int, Record] = self.core.pending
        self.timer: asyncio.TimerHandle | None = None  # watches the oldest deadline
        self.low_water = int(limit * resume_at)
        self.waits = 0
        self.wait_seconds = 0.0
        self.acked_count = 0
        self.failed_count = 0
        # With one connection its count is acked_count: the per-message increment is skipped.
        self._per_connection = connections > 1
        self.connection_acked = [0] * connections
        self.connection_failed = [0] * connections
        self.failures: list[Failure] = []
        #: Failures beyond KEPT_FAILURES since the last take_failures: a count per error type.
        self.unkept: dict[str, int] = {}
        self._purging = False  # purge returns its failures: they are not kept
        self._on_error = on_error
        self._on_outcome = on_outcome
        #: ``on_delivery(Delivery | Failure, record.context)`` for every record settled.
        self._on_delivery = on_delivery
        self._failure_log = FailureLog(logger)
        self._room_waiters: deque[asyncio.Future[None]] = deque()
        self._empty_waiters: list[asyncio.Future[None]] = []
        #: Woken at every settlement (wait_until).
        self._settle_waiters: list[asyncio.Future[None]] = []
        self._waiting = False  # a list has a waiter: one check per settled message
        #: Called when a caller starts waiting for room: what lingers for more messages should
        #: go now, as none will come until acks free room (the producer's connections').
        self.on_full: Callable[[], object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def limit(self) -> int:
        return int(self.core.limit)

    @property
    def timeout(self) -> float:
        return float(self.core.timeout)

    @property
    def in_flight(self) -> int:
        """Messages admitted and not settled, and those handed over and not yet admitted."""
        core = self.core
        return len(self.pending) + int(core.handed) - int(core.taken)

    @property
    def produced(self) -> int:
        """Messages counted so far: each is in flight or was counted acked or failed."""
        return self.acked_count + self.failed_count + self.in_flight

    def acked_on(self, connection: int) -> int:
        return self.connection_acked[connection] if self._per_connection else self.acked_count

    # ------------------------------------------------------------------ admission

    def admit(
        self,
        message: Message,
        partition: int | None,
        connection: int,
        slot: Slot,
        context: Any = None,
        reserved: bool = False,
    ) -> Record | None:
        """The core's admit (see ``_core_py.WindowCore.admit``): the record, or None if full.
        ``reserved``: the message was handed over by another thread and holds room of its own
        (see :meth:`reserve`), which passes to its record."""
        return self.core.admit(message, partition, connection, slot, context, reserved)  # type: ignore[no-any-return]

    def is_full(self, size: int) -> bool:
        """Whether a message of ``size`` bytes must wait for room."""
        return bool(self.core.full())

    def reserve(self) -> bool:
        """In another thread, one at a time (the caller's lock): room for one message handed
        over to the loop, taken now; False if the window is full. The loop then admits it
        into that room with ``admit(..., reserved=True)``, which asks for no room (a window
        of handed-over messages with nothing in flight to settle admits them all), or fails
        it with :meth:`fail_unadmitted`."""
        core = self.core
        if core.full():
            return False
        core.handed += 1
        return True

    async def wait_for_room(self, size: int = 0) -> None:
        """Wait until the window has drained to its resume point; return with room for one
        message of ``size`` bytes."""
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        counted = False
        try:
            # Several waiters wake together; the ones that find it full again wait again.
            while self.is_full(size):
                if not counted:
                    self.waits += 1
                    counted = True
                    if self.on_full is not None:
                        self.on_full()
                        # What it shipped may have settled at once (acks=0 counts a record
                        # acked as it is written), draining the window before anyone waits.
                        continue
                waiter: asyncio.Future[None] = loop.create_future()
                self._room_waiters.append(waiter)
                self._waiting = True
                try:
                    await waiter
                finally:
                    if not waiter.done():
                        waiter.cancel()
        finally:
            if counted:
                self.wait_seconds += time.perf_counter() - started

    def watch(self, record: Record) -> None:
        """Arm the deadline timer for the first record into an empty window."""
        if self.timer is None:
            self._arm_timer(record.deadline)

    # ------------------------------------------------------------------ settlement

    def acked(
        self, record: Record, offset: int | None, duplicate: bool = False, observe: bool = True
    ) -> None:
        """Settle one record as stored at ``offset`` (``duplicate``: see Delivery.duplicate);
        ``observe``: tell ``on_outcome`` of it (acked_each tells it once for them all)."""
        pending = self.pending
        if pending.pop(record.seq, None) is None:
            return  # already failed (timed out) or reported twice
        self.acked_count += 1
        if self._per_connection:
            self.connection_acked[record.connection] += 1
        if self._waiting:
            self._wake(len(pending))
        slot = record.slot
        on_delivery = self._on_delivery
        if on_delivery is not None:  # delivery_of and _tell, inlined: this runs per message
            stamp = record.timestamp
            delivery = self._new_delivery(
                record.topic,
                record.partition,
                offset,
                duplicate,
                None if stamp is None else stamp / 1000,
            )
            try:
                on_delivery(delivery, record.context)
            except Exception as exc:
                self._report_raised(exc)
            if slot is not None and not slot.done():
                slot.set_result(delivery)
        elif slot is not None and not slot.done():
            slot.set_result(self.delivery_of(record, offset, duplicate))
        if observe and self._on_outcome is not None:
            self._observe((record,), None)

    def acked_run(
        self, records: list[Record], first_offset: int | None, stored_at: int | None = None
    ) -> None:
        """Ack records stored at consecutive offsets from ``first_offset`` (one Kafka batch, all
        on one connection): :meth:`acked` for each, with the counting and waking done once.
        ``stored_at``: the broker's LogAppendTime (epoch ms) where the topic keeps one."""
        observed = self._settling(records) if self._on_outcome is not None else None
        if self._on_delivery is not None:
            count = self._tell_run(
                self.pending, records, first_offset, stored_at, self._new_delivery,
                self._on_delivery, self._report_raised, answer_slot,
            )  # fmt: skip
        else:
            count, waiting = self._pop_run(self.pending, records)
            for position in waiting or ():  # blocking produces in this run: each its offset
                record = records[position]
                slot = record.slot
                if slot is not None and not slot.done():
                    offset = None if first_offset is None else first_offset + position
                    slot.set_result(self.delivery_of(record, offset, stored_at=stored_at))
        if count:
            self.acked_count += count
            if self._per_connection:
                self.connection_acked[records[0].connection] += count
            if self._waiting:
                self._wake(len(self.pending))
        if observed:
            self._observe(observed, None)

    def delivery_of(
        self,
        record: Record,
        offset: int | None,
        duplicate: bool = False,
        stored_at: int | None = None,
    ) -> Delivery:
        """The Delivery of a record stored at ``offset``: its timestamp is the broker's
        LogAppendTime (``stored_at``, epoch ms) where it gave one, else the CreateTime the
        producer fixed for the record, else None."""
        stamp = stored_at if stored_at is not None else record.timestamp
        return self._new_delivery(
            record.topic,
            record.partition,
            offset,
            duplicate,
            None if stamp is None else stamp / 1000,
        )

    def _tell(self, result: Delivery | Failure, context: Any) -> None:
        """Tell ``on_delivery`` of one outcome; what it raises is logged, never propagated."""
        try:
            self._on_delivery(result, context)  # type: ignore[misc]
        except Exception as exc:
            self._report_raised(exc)

    @staticmethod
    def _report_raised(exc: Exception) -> None:
        logger.error("on_delivery callback raised", exc_info=exc)

    def acked_each(self, records: list[Record], offsets: list[int | None]) -> None:
        """Ack records that settled together (one read of JetStream PubAcks), each at its own
        offset: :meth:`acked` for each, and one Outcome for them all."""
        observed = self._settling(records) if self._on_outcome is not None else None
        acked = self.acked
        for record, offset in zip(records, offsets, strict=True):
            acked(record, offset, False, False)
        if observed:
            self._observe(observed, None)

    def _settling(self, records: list[Record]) -> list[Record]:
        pending = self.pending
        return [record for record in records if record.seq in pending]

    def _observe(
        self,
        records: list[Record] | tuple[Record, ...],
        error: BaseException | None,
        possibly_stored: bool | None = None,
    ) -> None:
        assert self._on_outcome is not None
        first = records[0]
        timeout = self.core.timeout
        outcome = Outcome(
            tuple(record.seq for record in records),
            tuple(record.deadline - timeout for record in records),
            time.monotonic(),
            first.topic,
            first.partition,
            first.connection,
            error,
            possibly_stored,
        )
        try:
            self._on_outcome(outcome)
        except Exception:
            logger.exception("on_outcome callback raised")

    def failed(self, record: Record, exc: BaseException, possibly_stored: bool = True) -> None:
        """Settle one record as failed with ``exc``; ``possibly_stored``: whether the broker may
        have stored it all the same (see :class:`~producerkit.Failure`)."""
        pending = self.pending
        if pending.pop(record.seq, None) is None:
            return
        self.failed_count += 1
        self.connection_failed[record.connection] += 1
        if self._waiting:
            self._wake(len(pending))
        if self._on_outcome is not None:
            self._observe((record,), exc, possibly_stored)
        failure = None
        if self._on_delivery is not None:
            failure = failure_of(record, exc, possibly_stored)
            self._tell(failure, record.context)
        slot = record.slot
        if slot is not None and not slot.done():
            slot.set_exception(exc)
            return  # the caller awaiting it is told; a blocking produce is not reported twice
        if failure is None:
            failure = failure_of(record, exc, possibly_stored)
        if len(self.failures) < KEPT_FAILURES:
            self.failures.append(failure)
        elif not self._purging:
            name = type(exc).__name__
            self.unkept[name] = self.unkept.get(name, 0) + 1
        self._failure_log.add(failure)
        if self._on_error is not None:
            try:
                self._on_error(failure)
            except Exception:
                logger.exception("on_error callback raised; the failure is still in flush()")

    def fail_unadmitted(
        self, message: Message, slot: Slot, context: Any, exc: BaseException
    ) -> None:
        """A message handed over (counted in flight since :meth:`reserve`) that cannot be
        admitted: it fails, counted and reported like any other failure."""
        record = self.core.admit(message, message.partition, 0, slot, context, True)
        self.failed(record, exc, possibly_stored=False)

    def _wake(self, in_flight: int) -> None:
        """A record settled, ``in_flight`` are left, and somebody waits (``_waiting``)."""
        if self._settle_waiters:
            waiters, self._settle_waiters = self._settle_waiters, []
            self._waiting = bool(self._room_waiters or self._empty_waiters)
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        self._wake_drained(in_flight)

    def _wake_drained(self, in_flight: int) -> None:
        """Wake who waits for room, or for nothing in flight, where the window has drained
        enough for them."""
        if in_flight <= self.low_water:
            self.wake_room_waiters()
            core = self.core
            if in_flight == 0 and self._empty_waiters and core.handed == core.taken:
                waiters, self._empty_waiters = self._empty_waiters, []
                self._waiting = bool(self._settle_waiters)
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    def wake_room_waiters(self) -> None:
        """Wake every produce waiting for room (also used at close, so they can give up)."""
        waiters = self._room_waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        self._waiting = bool(self._empty_waiters or self._settle_waiters)

    async def wait_until(self, done: Callable[[], bool]) -> None:
        """Wait until ``done()``, asking it again at every settlement (never by polling)."""
        loop = asyncio.get_running_loop()
        while not done():
            waiter: asyncio.Future[None] = loop.create_future()
            self._settle_waiters.append(waiter)
            self._waiting = True
            await waiter

    async def wait_empty(self) -> None:
        """Wait until nothing is in flight."""
        while self.in_flight:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._empty_waiters.append(waiter)
            self._waiting = True
            await waiter

    def fail_pending(self, make_error: Callable[[bool], BaseException]) -> None:
        """Fail every record in flight with ``make_error(possibly_stored)``: not stored where
        its connection still holds it unwritten."""
        records = list(self.pending.values())
        unwritten = self._unwritten(records) if records else set()
        for record in records:
            possibly_stored = record.seq not in unwritten
            self.failed(record, make_error(possibly_stored), possibly_stored)

    def purge(self, unsent: list[Record], in_flight: bool) -> list[Failure]:
        """Fail ``unsent`` (records their connections have not written) and, with
        ``in_flight``, every other record still waiting for its ack, with Purged; their
        Failures are returned, and not raised again by the next ``take_failures``."""
        unsent_numbers = {record.seq for record in unsent}
        purging = unsent + (list(self.pending.values()) if in_flight else [])
        reported_before = len(self.failures)
        purged: list[Failure] = []
        self._purging = True
        try:
            for record in purging:
                if record.seq not in self.pending:
                    continue  # settled already, or listed twice
                unsent_one = record.seq in unsent_numbers
                error = Purged(
                    "purged before it was sent"
                    if unsent_one
                    else "purged while waiting for its ack; it may still have been stored"
                )
                self.failed(record, error, not unsent_one)
                purged.append(failure_of(record, error, not unsent_one))
        finally:
            self._purging = False
        del self.failures[reported_before:]
        return purged

    def take_failures(self) -> ProduceError | None:
        """The failures since the last call, as one ProduceError (or None)."""
        self._failure_log.flush()
        if not self.failures:
            return None
        failures, self.failures = self.failures, []
        unkept, self.unkept = self.unkept, {}
        return ProduceError(failures, unkept=unkept)

    def stats(self, connections: int, rate_waits: int, rate_wait_seconds: float) -> Stats:
        """A snapshot of the counters (see :class:`~producerkit.Stats`)."""
        in_flight_by_connection = [0] * connections
        for record in list(self.pending.values()):
            in_flight_by_connection[record.connection] += 1
        in_flight_by_connection[0] += self.core.handed - self.core.taken
        per_connection = tuple(
            ConnectionStats(
                index=index,
                produced=self.acked_on(index)
                + self.connection_failed[index]
                + in_flight_by_connection[index],
                acked=self.acked_on(index),
                failed=self.connection_failed[index],
                in_flight=in_flight_by_connection[index],
            )
            for index in range(connections)
        )
        return Stats(
            produced=self.produced,
            acked=self.acked_count,
            failed=self.failed_count,
            in_flight=self.in_flight,
            peak_in_flight=self.core.peak_in_flight,
            window_waits=self.waits,
            window_wait_seconds=self.wait_seconds,
            connections=per_connection,
            peak_bytes_in_flight=self.byte_counts()[1],
            rate_waits=rate_waits,
            rate_wait_seconds=rate_wait_seconds,
            bytes_in_flight=self.byte_counts()[0],
        )

    def byte_counts(self) -> tuple[int | None, int | None]:
        """The bytes in flight now, and the most there were at once; None where bytes are not
        bounded."""
        return None, None

    # ------------------------------------------------------------------ deadlines

    def _arm_timer(self, deadline: float) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        delay = max(0.0, deadline - time.monotonic())
        self.timer = self._loop.call_later(delay, self._expire)
        self.core.watching = True

    def _expire(self) -> None:
        self.timer = None
        self.core.watching = False
        now = time.monotonic()
        expired: list[Record] = []
        for record in self.pending.values():
            if record.deadline > now:
                break
            expired.append(record)
        timeout = self.core.timeout
        unwritten = self._unwritten(expired) if expired else set()
        for record in expired:
            unsent = record.seq in unwritten
            self.failed(
                record,
                ProduceTimeout(
                    f"not acknowledged within {timeout}s (topic {record.topic!r}); "
                    + ("it was never sent" if unsent else "it may still have been stored")
                ),
                not unsent,
            )
        if self.pending:
            self._arm_timer(next(iter(self.pending.values())).deadline)

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            self.core.watching = False
