"""The open-loop driver: message i is due at ``t0 + i / rate``, whatever happened to message i-1.

A closed-loop benchmark sends the next message when the previous one is done, so when the system
stalls it simply stops asking, and the stall is counted once instead of for every message that
should have been sent meanwhile (coordinated omission). Here the schedule is fixed in advance, and
three durations are kept per message:

- *send delay* = send - due: how late the sender got to it (the producer blocked, the window was
  full, the loop was busy);
- *ack latency* = ack - send: what a closed-loop benchmark reports;
- *response time* = ack - due: what a caller with a deadline experiences, queueing included.

Timestamps go into preallocated ``array('q')`` buffers (one store per event, no objects); the
histograms and time series are computed from them after the run. The same driver runs
producerkit and the raw-client peers (:mod:`producerkit.bench.peers`) through the small
:class:`Target` interface, so every figure is measured the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from array import array
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from producerkit._producer import Producer
from producerkit._types import Outcome, Stats

__all__ = [
    "LoopLagProbe",
    "ProducerTarget",
    "ProgressThread",
    "RunTimings",
    "Target",
    "run_open_loop",
    "warm_up",
]

#: When the sender is behind schedule it still yields to the loop this often, so acks and the
#: loop-lag probe are not starved (rate 0 on null:// never awaits otherwise).
_YIELD_EVERY = 256
#: The percentiles the loop-lag summary and the round ratios give.
PERCENTILES = ("p50", "p99", "p99.9")
#: Outcome codes in ``RunTimings.status``.
PENDING, OK, FAILED = 0, 1, 2

AckCallback = Callable[[int, bool], None]


class Target(Protocol):
    """What the open-loop driver sends to: producerkit, or a raw client (peers.py).

    ``send`` hands message ``index`` off and later calls ``on_ack(index, ok)`` exactly once (the
    driver timestamps the call); it may return an awaitable the driver awaits before the next
    send (back-pressure). ``send_wait`` sends and returns only once acked (sync mode).
    """

    name: str
    on_ack: AckCallback

    async def start(self) -> None: ...

    def send(self, index: int, key: bytes | None, value: bytes) -> Awaitable[Any] | None: ...

    async def send_wait(self, index: int, key: bytes | None, value: bytes) -> bool: ...

    async def flush(self) -> None: ...

    async def close(self) -> None: ...


class _Timing:
    """Times each outcome by message index through the producer's ``on_outcome`` hook: one
    subtraction and one call per message of a settled group."""

    __slots__ = ("base", "on_ack")

    def __init__(self) -> None:
        self.base = 0
        self.on_ack: AckCallback = _ignore

    def observe(self, outcome: Outcome) -> None:
        base, on_ack, ok = self.base, self.on_ack, outcome.error is None
        for number in outcome.numbers:
            on_ack(number - base, ok)


class ProducerTarget:
    """producerkit itself: nonblocking produce, acks timed where the backends report them.

    Every message ends in the hook, acked or failed (deadline passed, closed included).
    """

    name = "producerkit"

    def __init__(self, url: str, topic: str, **producer_kwargs: Any) -> None:
        self._timing = _Timing()
        self.producer = Producer(
            url, topic=topic, on_outcome=self._timing.observe, **producer_kwargs
        )
        self.on_ack: AckCallback = _ignore
        self._admitted = 0  # produces so far: the nth is the producer's nth record (its seq)

    async def start(self) -> None:
        await self.producer.start()

    def send(self, index: int, key: bytes | None, value: bytes) -> Awaitable[Any]:
        # One sender produces in index order: the nth message admitted has number n.
        timing = self._timing
        self._admitted += 1
        timing.base = self._admitted - index
        timing.on_ack = self.on_ack
        return self.producer.produce(value, key=key, nonblocking=True)

    async def send_wait(self, index: int, key: bytes | None, value: bytes) -> bool:
        self._timing.on_ack = _ignore  # the driver times blocking produces itself
        self._admitted += 1
        try:
            await self.producer.produce(value, key=key)
        except Exception:
            return False
        return True

    async def flush(self) -> None:
        with contextlib.suppress(Exception):  # every failure was already timed
            await self.producer.flush()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.producer.close()

    @property
    def stats(self) -> Stats:
        return self.producer.stats

    def topic_modes(self) -> dict[str, str]:
        """How the producer writes each topic, where its backend has more than one way
        (JetStream: ``"fast ingest"`` or ``"per message: <why>"``); read while it is open."""
        return dict(self.producer.backend.topic_modes)


def _ignore(index: int, ok: bool) -> None:
    pass


class RunTimings:
    """Per-message nanosecond timestamps (``perf_counter_ns``), relative to nothing: t0 is kept."""

    def __init__(self, capacity: int) -> None:
        self.capacity = 0
        self.due = array("q")
        self.send = array("q")
        self.ack = array("q")
        self.status = bytearray()
        self.grow(max(capacity, 1024))
        self.sent = 0
        self.t0 = 0
        self.interval = 0
        self.end = 0
        self.loop_lag: LoopLagProbe | None = None

    def grow(self, capacity: int) -> None:
        extra = capacity - self.capacity
        if extra <= 0:
            return
        zeros = array("q", bytes(8 * extra))
        self.due.extend(zeros)
        self.send.extend(zeros)
        self.ack.extend(zeros)
        self.status.extend(bytes(extra))
        self.capacity = capacity

    def on_ack(self, index: int, ok: bool) -> None:
        if 0 <= index < self.capacity and not self.status[index]:
            self.ack[index] = time.perf_counter_ns()
            self.status[index] = OK if ok else FAILED


ProgressCallback = Callable[[RunTimings, float], None]


def _planned_count(rate: float, count: int | None, duration: float | None, mode: str) -> int | None:
    """How many messages a run sends: ``count``, else what ``duration`` holds at ``rate`` (None
    for as fast as possible for a duration). ValueError for a run without an end, a negative
    rate or an unknown mode."""
    if mode not in ("sync", "nonblocking"):
        raise ValueError(f"mode must be 'sync' or 'nonblocking', not {mode!r}")
    if count is None and duration is None:
        raise ValueError("give count or duration")
    if rate < 0:
        raise ValueError("rate must be >= 0")
    if count is None:
        assert duration is not None
        return round(rate * duration) if rate > 0 else None
    return count


async def run_open_loop(
    target: Target,
    messages: Sequence[tuple[bytes | None, bytes]],
    *,
    rate: float,
    count: int | None = None,
    duration: float | None = None,
    mode: str = "nonblocking",
    senders: int = 1,
    warmup: int = 0,
    drain_timeout: float = 60.0,
    progress: ProgressCallback | None = None,
    progress_interval: float = 5.0,
    loop_lag_interval: float | None = None,
) -> RunTimings:
    """Send ``messages`` (cycled) to a started ``target`` on the open-loop schedule.

    ``rate`` messages/s (0: as fast as possible); stop after ``count`` messages or once
    ``duration`` seconds of schedule have been sent. ``mode`` ``"nonblocking"``: one sender hands
    each message off when due; ``"sync"``: ``senders`` coroutines each send one message and wait
    for its ack before taking the next due one. ``warmup`` messages are sent and acked first,
    untimed. ``loop_lag_interval`` (seconds): a probe sleeps that long, over and over, and
    ``timings.loop_lag`` gets how late (ns) each of its wake-ups was: the event loop's stalls.
    ``progress(timings, seconds)`` is called every ``progress_interval`` seconds from a thread
    (:class:`ProgressThread`): nothing but the load and the probe runs on the loop.
    """
    count = _planned_count(rate, count, duration, mode)
    timings = RunTimings(count if count is not None else 1 << 16)
    if warmup:
        await warm_up(target, messages, warmup)
    target.on_ack = timings.on_ack
    interval = round(1e9 / rate) if rate > 0 else 0
    deadline_ns = None if count is not None or duration is None else round(duration * 1e9)
    limit = count if count is not None else 1 << 62
    timings.interval = interval
    # What exists now (imports, numpy's included; the target; the timings) is the harness's and
    # the set-up's: frozen out of the collector's sight, a full collection during the run walks
    # only what the run allocates (with numpy's objects in the heap it took 14 ms on the loop).
    # (A process that froze its own heap, as a pre-fork server does, is left as it is.)
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.collect()
        gc.freeze()
    reporter = None
    if progress is not None:
        # Started before the clock: Thread.start() waits until the new thread has run, which on
        # a busy machine can take milliseconds.
        reporter = ProgressThread(timings, progress, progress_interval)
        reporter.start()
    timings.t0 = t0 = time.perf_counter_ns() + 1_000_000  # the first message is due in 1 ms
    probe = LoopLagProbe(loop_lag_interval) if loop_lag_interval else None
    if probe is not None:
        timings.loop_lag = probe
        probe.start()
    try:
        if mode == "sync":
            state = [0]
            await asyncio.gather(
                *(
                    _sync_sender(target, messages, timings, state, limit, deadline_ns)
                    for _ in range(senders)
                )
            )
        else:
            await _nonblocking_sender(target, messages, timings, t0, interval, limit, deadline_ns)
        # Past the drain timeout, the unacknowledged stay PENDING and are reported as such.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(target.flush(), drain_timeout)
    finally:
        timings.end = time.perf_counter_ns()
        if freeze:
            gc.unfreeze()
        if reporter is not None:
            reporter.stop()
        if probe is not None:
            probe.stop()
    return timings


class LoopLagProbe:
    """A task that sleeps ``interval`` seconds over and over and keeps, in ``lags``, how many
    nanoseconds after its due time each wake-up came: what else held the event loop. With each
    lag it keeps, in ``cpu``, the CPU time the loop's thread used from the sleep to the wake-up:
    a stall with little CPU is the thread waiting to be scheduled (the machine), one with as
    much CPU as wall time is code running on the loop."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.lags = array("q")
        self.cpu = array("q")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def summary(self) -> dict[str, Any]:
        """Percentiles (ms) of the wake-up lags, their max, the count over 10 ms, the share
        of those stalls' wall time the loop's thread spent on a CPU, and ``max_cpu_ms``: the
        most CPU time the loop's thread used between one sleep and its wake-up (the longest
        piece of code that ran on the loop, wherever the machine was busy or not)."""
        import numpy as np

        values = np.asarray(self.lags, dtype=np.int64) / 1e6
        if not len(values):
            return {}
        cpu = np.asarray(self.cpu, dtype=np.int64) / 1e6
        stalls = values > 10
        stall_wall = float((values[stalls] + self.interval * 1e3).sum())
        cut = {f"{q}_ms": float(np.percentile(values, float(q[1:]))) for q in PERCENTILES}
        return {
            **cut,
            "max_ms": float(values.max()),
            "wakeups": len(values),
            "stalls_over_10ms": int(stalls.sum()),
            "stall_cpu_share": float(cpu[stalls].sum()) / stall_wall if stall_wall else None,
            "max_cpu_ms": float(cpu.max()),
        }

    async def _run(self) -> None:
        perf_counter_ns, thread_time_ns = time.perf_counter_ns, time.thread_time_ns
        sleep, add_lag, add_cpu = asyncio.sleep, self.lags.append, self.cpu.append
        interval = self.interval
        interval_ns = round(interval * 1e9)
        while True:
            due = perf_counter_ns() + interval_ns
            cpu = thread_time_ns()
            await sleep(interval)
            add_lag(max(perf_counter_ns() - due, 0))
            add_cpu(thread_time_ns() - cpu)


async def warm_up(target: Target, messages: Sequence[tuple[bytes | None, bytes]], n: int) -> None:
    """Send ``n`` untimed messages as fast as the target takes them, and wait for their acks."""
    for i in range(n):
        key, value = messages[i % len(messages)]
        handed_off = target.send(-1 - i, key, value)
        if handed_off is not None:
            await handed_off
    await target.flush()


async def _nonblocking_sender(
    target: Target,
    messages: Sequence[tuple[bytes | None, bytes]],
    timings: RunTimings,
    t0: int,
    interval: int,
    limit: int,
    deadline_ns: int | None,
) -> None:
    perf_counter_ns = time.perf_counter_ns
    sleep = asyncio.sleep
    due_array, send_array = timings.due, timings.send
    send = target.send
    n_messages = len(messages)
    i = 0
    while i < limit:
        due = t0 + i * interval
        now = perf_counter_ns()
        if due > now:
            # Sleep until the next message is due; everything due by then goes in one burst.
            await sleep((due - now) / 1e9)
            now = perf_counter_ns()
        elif i % _YIELD_EVERY == 0:
            await sleep(0)
            now = perf_counter_ns()
        if not interval:
            due = now  # rate 0: every message is due when the sender gets to it
            if deadline_ns is not None and now - t0 >= deadline_ns:
                break
        if i >= timings.capacity:
            timings.grow(timings.capacity * 2)
            due_array, send_array = timings.due, timings.send
        key, value = messages[i % n_messages]
        due_array[i] = due
        send_array[i] = now
        timings.sent = i + 1
        handed_off = send(i, key, value)
        if handed_off is not None:
            await handed_off
        i += 1


async def _sync_sender(
    target: Target,
    messages: Sequence[tuple[bytes | None, bytes]],
    timings: RunTimings,
    state: list[int],
    limit: int,
    deadline_ns: int | None,
) -> None:
    perf_counter_ns = time.perf_counter_ns
    t0, interval = timings.t0, timings.interval
    n_messages = len(messages)
    while True:
        i = state[0]
        if i >= limit:
            return
        state[0] = i + 1
        due = t0 + i * interval
        now = perf_counter_ns()
        if due > now:
            await asyncio.sleep((due - now) / 1e9)
            now = perf_counter_ns()
        if not interval:
            due = now
            if deadline_ns is not None and now - t0 >= deadline_ns:
                return
        if i >= timings.capacity:
            timings.grow(timings.capacity * 2)
        key, value = messages[i % n_messages]
        timings.due[i] = due
        timings.send[i] = now
        timings.sent = max(timings.sent, i + 1)
        ok = await target.send_wait(i, key, value)
        timings.on_ack(i, ok)


class ProgressThread:
    """Calls ``progress(timings, seconds)`` every ``interval`` seconds (``seconds``: the time
    since the last call) from a thread of its own, so that reading the timestamps and writing a
    progress line never run on the event loop being measured. The callback only reads
    ``timings``; what it imports must be imported before the clock starts (a first import of
    numpy holds the GIL for tens of milliseconds)."""

    def __init__(self, timings: RunTimings, progress: ProgressCallback, interval: float) -> None:
        self._timings = timings
        self._progress = progress
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="producerkit-bench-progress", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No call after this returns (one under way is waited for)."""
        self._stopped.set()
        self._thread.join()

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stopped.wait(self._interval):
            now = time.perf_counter()
            self._progress(self._timings, now - last)
            last = now
