"""The bounded in-flight window: the one place where messages in flight are counted and settled.

A producer may have at most ``limit`` messages in flight (and, with a byte bound, at most
``byte_limit`` bytes). When a produce finds the window full it waits until completions have
drained it to ``resume_at`` of the limit (half by default), then resumes: waiting for half rather
than for one free slot turns a stream of tiny wake-ups into a few large bursts, and gives a
saturated link time to recover before it is filled again. Waiters are woken by completions, never
by polling. Each waiter has its own future, so a cancelled caller cannot cancel anybody else's
wait, and nothing is counted for a caller cancelled while it waits.

:meth:`~PyWindowCore.admit` builds each message's record and puts it in ``pending``
(insertion-ordered by admission, hence by deadline), where it stays until exactly one of
:meth:`~InFlightWindow.acked` / :meth:`~InFlightWindow.failed` removes it. That single ledger
gives ``produced == acked + failed + in_flight`` at every moment, per-message deadlines with one
timer for the whole window (no task or timer per message), and the list of what is left at
close. ``admit`` is written twice, here and as ``producerkit._speedups.WindowCore`` (used where
it was built); the differential tests compare them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from producerkit import _fast
from producerkit._fast import pop_run as _pop_run
from producerkit._types import (
    CONNECTION,
    DEADLINE,
    FUTURE,
    HEADERS,
    KEY,
    PARTITION,
    SEQ,
    TIMESTAMP,
    TOPIC,
    VALUE,
    Delivery,
    DeliveryNotice,
    Failure,
    HeaderPairs,
    Outcome,
    Record,
    failure_of,
)
from producerkit.errors import ProduceError, ProduceTimeout

logger = logging.getLogger("producerkit.producer")

ErrorCallback = Callable[[Failure], object]
OutcomeCallback = Callable[[Outcome], object]


class PyWindowCore:
    """What every message reads of the window, and :meth:`admit`. ``producerkit._speedups.
    WindowCore`` is its C twin: the same fields and the same ``admit``."""

    __slots__ = ("_seqs", "limit", "peak_in_flight", "pending", "timeout", "timer", "untrack")

    def __init__(self, limit: int, timeout: float, untrack: bool = False) -> None:
        self.limit = limit
        self.timeout = timeout
        self.untrack = untrack  # the C twin stops the GC tracking records: see _fast.untracked
        self.pending: dict[int, Record] = {}
        self.peak_in_flight = 0
        self.timer: asyncio.TimerHandle | None = None  # watches the oldest deadline
        self._seqs = itertools.count(1)  # record[SEQ]: the n-th record admitted has n

    def admit(
        self,
        value: bytes | None,
        key: bytes | None,
        topic: str,
        partition: int | None,
        headers: Any,
        msg_id: str | None,
        connection: int,
        future: asyncio.Future[Delivery] | DeliveryNotice | None,
        timestamp: int | None = None,
    ) -> Record:
        """Build the message's record and put it in flight: in ``pending``, counted in the
        peak, its deadline watched if the window was empty. From here on it must end acked or
        failed. The caller has made room (``len(pending) < limit``). ``timestamp``: the
        record's CreateTime in epoch milliseconds, or None for the produce time."""
        seq = next(self._seqs)
        record: Record = (
            seq,
            value,
            key,
            topic,
            partition,
            headers,
            msg_id,
            time.monotonic() + self.timeout,
            connection,
            future,
            timestamp,
        )
        pending = self.pending
        in_flight = len(pending)
        pending[seq] = record
        if in_flight >= self.peak_in_flight:
            self.peak_in_flight = in_flight + 1
        if not in_flight and self.timer is None:
            self.watch(record)
        return record

    def watch(self, record: Record) -> None:
        """Arm the deadline timer for the first record into an empty window (the window's)."""
        raise NotImplementedError


#: The core this installation runs: the C twin where it was built.
if TYPE_CHECKING:
    _WindowCore = PyWindowCore
else:
    _WindowCore = _fast.speedups.WindowCore if _fast.speedups is not None else PyWindowCore


class InFlightWindow(_WindowCore):
    """The window: admission (its core), waiting for room, settling, deadlines, failures."""

    __slots__ = (
        "_empty_waiters",
        "_failure_log",
        "_loop",
        "_on_error",
        "_on_outcome",
        "_per_connection",
        "_room_waiters",
        "_waiting",
        "acked_count",
        "connection_acked",
        "connection_failed",
        "failed_count",
        "failures",
        "low_water",
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
    ) -> None:
        super().__init__(limit, timeout, untrack)
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
        self._on_error = on_error
        self._on_outcome = on_outcome
        self._failure_log = _FailureLog()
        self._room_waiters: deque[asyncio.Future[None]] = deque()
        self._empty_waiters: list[asyncio.Future[None]] = []
        self._waiting = False  # either list has a waiter: one check per settled message
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    @property
    def produced(self) -> int:
        """Records admitted so far: each is in ``pending`` or was counted acked or failed."""
        return self.acked_count + self.failed_count + len(self.pending)

    def acked_on(self, connection: int) -> int:
        return self.connection_acked[connection] if self._per_connection else self.acked_count

    # ------------------------------------------------------------------ admission

    def is_full(self, size: int) -> bool:
        """Whether a message of ``size`` bytes must wait for room."""
        return len(self.pending) >= self.limit

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
        """Arm the timer for the first record into an empty window."""
        if self.timer is None:
            self._arm_timer(record[DEADLINE])

    # ------------------------------------------------------------------ settlement

    def acked(self, record: Record, offset: int | None, duplicate: bool = False) -> None:
        """Settle one record as stored at ``offset`` (``duplicate``: see Delivery.duplicate)."""
        pending = self.pending
        if pending.pop(record[SEQ], None) is None:
            return  # already failed (timed out) or reported twice
        self.acked_count += 1
        if self._per_connection:
            self.connection_acked[record[CONNECTION]] += 1
        if self._waiting:
            self._wake(len(pending))
        future = record[FUTURE]
        if future is not None and not future.done():
            future.set_result(delivery_of(record, offset, duplicate))

    def acked_run(
        self, records: list[Record], first_offset: int | None, stored_at: int | None = None
    ) -> None:
        """Ack records stored at consecutive offsets from ``first_offset`` (one Kafka batch, all
        on one connection): :meth:`acked` for each, with the counting and waking done once.
        ``stored_at``: the broker's LogAppendTime (epoch ms) where the topic keeps one."""
        if _pop_run is not None:
            count, waiting = _pop_run(self.pending, records)
            for position in waiting or ():  # blocking produces in this run: each its offset
                record = records[position]
                future = record[FUTURE]
                if not future.done():
                    offset = None if first_offset is None else first_offset + position
                    future.set_result(delivery_of(record, offset, stored_at=stored_at))
        else:
            pop = self.pending.pop
            count = 0
            offset = first_offset
            for record in records:
                if pop(record[SEQ], None) is not None:
                    count += 1
                    future = record[FUTURE]
                    if future is not None and not future.done():
                        future.set_result(delivery_of(record, offset, stored_at=stored_at))
                if offset is not None:
                    offset += 1
        if count:
            self.acked_count += count
            if self._per_connection:
                self.connection_acked[records[0][CONNECTION]] += count
            if self._waiting:
                self._wake(len(self.pending))

    def acked_each(self, records: list[Record], offsets: list[int | None]) -> None:
        """Ack records that settled together (one read of JetStream PubAcks), each at its own
        offset: :meth:`acked` for each."""
        acked = self.acked
        for record, offset in zip(records, offsets, strict=True):
            acked(record, offset)

    @property
    def observed(self) -> bool:
        """Whether an ``on_outcome`` hook watches this window."""
        return self._on_outcome is not None

    def acked_observed(self, record: Record, offset: int | None, duplicate: bool = False) -> None:
        """:meth:`acked`, and ``on_outcome`` told of it (used instead when a hook is set)."""
        if record[SEQ] in self.pending:
            self.acked(record, offset, duplicate)
            self._observe((record,), None)

    def acked_run_observed(
        self, records: list[Record], first_offset: int | None, stored_at: int | None = None
    ) -> None:
        """:meth:`acked_run`, and ``on_outcome`` told of the records it settled."""
        pending = self.pending
        settling = [record for record in records if record[SEQ] in pending]
        self.acked_run(records, first_offset, stored_at)
        if settling:
            self._observe(settling, None)

    def acked_each_observed(self, records: list[Record], offsets: list[int | None]) -> None:
        """:meth:`acked_each`, and ``on_outcome`` told of the records it settled, in one Outcome."""
        pending = self.pending
        settling = [record for record in records if record[SEQ] in pending]
        self.acked_each(records, offsets)
        if settling:
            self._observe(settling, None)

    def _observe(
        self, records: list[Record] | tuple[Record, ...], error: BaseException | None
    ) -> None:
        assert self._on_outcome is not None
        first = records[0]
        timeout = self.timeout
        outcome = Outcome(
            tuple(record[SEQ] for record in records),
            tuple(record[DEADLINE] - timeout for record in records),
            time.monotonic(),
            first[TOPIC],
            first[PARTITION],
            first[CONNECTION],
            error,
        )
        try:
            self._on_outcome(outcome)
        except Exception:
            logger.exception("on_outcome callback raised")

    def failed(self, record: Record, exc: BaseException) -> None:
        pending = self.pending
        if pending.pop(record[SEQ], None) is None:
            return
        self.failed_count += 1
        self.connection_failed[record[CONNECTION]] += 1
        if self._waiting:
            self._wake(len(pending))
        if self._on_outcome is not None:
            self._observe((record,), exc)
        future = record[FUTURE]
        if future is not None and not future.done():
            if not isinstance(future, DeliveryNotice):
                future.set_exception(exc)
                return  # the caller awaiting it is told; a blocking produce is not reported twice
            failure = failure_of(record, exc)
            future.tell_failure(failure)
            if future.waiter is not None:
                return  # a blocking produce: its caller is told, as above
        else:
            failure = failure_of(record, exc)
        self.failures.append(failure)
        self._failure_log.add(failure)
        if self._on_error is not None:
            try:
                self._on_error(failure)
            except Exception:
                logger.exception("on_error callback raised; the failure is still in flush()")

    def _wake(self, in_flight: int) -> None:
        if in_flight <= self.low_water:
            self.wake_room_waiters()
            if in_flight == 0 and self._empty_waiters:
                waiters, self._empty_waiters = self._empty_waiters, []
                self._waiting = False
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
        self._waiting = bool(self._empty_waiters)

    async def wait_empty(self) -> None:
        """Wait until nothing is in flight."""
        while self.pending:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._empty_waiters.append(waiter)
            self._waiting = True
            await waiter

    def fail_pending(self, make_error: Callable[[], BaseException]) -> None:
        for record in list(self.pending.values()):
            self.failed(record, make_error())

    def take_failures(self) -> ProduceError | None:
        """The failures since the last call, as one ProduceError (or None)."""
        self._failure_log.flush()
        if not self.failures:
            return None
        failures, self.failures = self.failures, []
        return ProduceError(failures)

    # ------------------------------------------------------------------ deadlines

    def _arm_timer(self, deadline: float) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        delay = max(0.0, deadline - time.monotonic())
        self.timer = self._loop.call_later(delay, self._expire)

    def _expire(self) -> None:
        self.timer = None
        now = time.monotonic()
        expired: list[Record] = []
        for record in self.pending.values():
            if record[DEADLINE] > now:
                break
            expired.append(record)
        for record in expired:
            self.failed(
                record,
                ProduceTimeout(
                    f"not acknowledged within {self.timeout}s (topic {record[TOPIC]!r}); "
                    "it may still have been stored"
                ),
            )
        if self.pending:
            self._arm_timer(next(iter(self.pending.values()))[DEADLINE])

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


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
    ) -> None:
        super().__init__(
            limit, timeout, connections, on_error, on_outcome, untrack=untrack, resume_at=resume_at
        )
        self.byte_limit = byte_limit
        self.byte_low_water = int(byte_limit * resume_at)
        self.bytes_in_flight = 0
        self.peak_bytes_in_flight = 0

    def is_full(self, size: int) -> bool:
        pending = self.pending
        return len(pending) >= self.limit or (
            bool(pending) and self.bytes_in_flight + size > self.byte_limit
        )

    def admit(self, *fields: Any) -> Record:
        record = super().admit(*fields)
        in_flight = self.bytes_in_flight + record_size(record)
        self.bytes_in_flight = in_flight
        if in_flight > self.peak_bytes_in_flight:
            self.peak_bytes_in_flight = in_flight
        return record

    def acked(self, record: Record, offset: int | None, duplicate: bool = False) -> None:
        if record[SEQ] in self.pending:
            self.bytes_in_flight -= record_size(record)
            super().acked(record, offset, duplicate)

    def acked_run(
        self, records: list[Record], first_offset: int | None, stored_at: int | None = None
    ) -> None:
        pending = self.pending
        self.bytes_in_flight -= sum(record_size(r) for r in records if r[SEQ] in pending)
        super().acked_run(records, first_offset, stored_at)

    def failed(self, record: Record, exc: BaseException) -> None:
        if record[SEQ] in self.pending:
            self.bytes_in_flight -= record_size(record)
            super().failed(record, exc)

    def _wake(self, in_flight: int) -> None:
        if self.bytes_in_flight <= self.byte_low_water:
            super()._wake(in_flight)


def delivery_of(
    record: Record, offset: int | None, duplicate: bool = False, stored_at: int | None = None
) -> Delivery:
    """The Delivery of a record stored at ``offset``: its timestamp is the broker's
    LogAppendTime (``stored_at``, epoch ms) where it gave one, else the CreateTime the producer
    fixed for the record, else None."""
    stamp = stored_at if stored_at is not None else record[TIMESTAMP]
    return Delivery(
        record[TOPIC],
        record[PARTITION],
        offset,
        duplicate,
        None if stamp is None else stamp / 1000,
    )


def message_size(value: bytes | None, key: bytes | None, headers: HeaderPairs | None) -> int:
    """The bytes of a message that count against ``max_in_flight_bytes`` (a tombstone's None
    value and a None header value count nothing)."""
    size = 0 if value is None else len(value)
    if key is not None:
        size += len(key)
    if headers:
        size += sum(len(name) + len(data or b"") for name, data in headers)
    return size


def record_size(record: Record) -> int:
    return message_size(record[VALUE], record[KEY], record[HEADERS])


class _FailureLog:
    """Logs failures as counts, at most one line per second, never one line per message."""

    INTERVAL: Final = 1.0

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._last = 0.0

    def add(self, failure: Failure) -> None:
        name = type(failure.exception).__name__
        self._counts[name] = self._counts.get(name, 0) + 1
        now = time.monotonic()
        if now - self._last >= self.INTERVAL:
            self._last = now
            self.flush(example=failure)

    def flush(self, example: Failure | None = None) -> None:
        if not self._counts:
            return
        counts = ", ".join(f"{count} {name}" for name, count in sorted(self._counts.items()))
        detail = f" (latest: {example.exception})" if example is not None else ""
        logger.warning("messages failed: %s%s", counts, detail)
        self._counts.clear()
