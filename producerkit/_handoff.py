"""Messages handed from other threads to the producer's event loop (``SyncProducer``'s way in).

A message handed over counts as in flight from that moment: :meth:`Handoff.put` takes its room
in the window (``window.reserve()``) in the calling thread, and blocks that thread while the
window is full, until it has drained to its resume point, through the window's own wait. The
loop is woken once when the queue goes non-empty, never once per message, and submits what is
queued, in order, through the producer's one way in; a message that cannot be admitted there
fails, counted and reported like any other.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from producerkit._record import Message, Slot
from producerkit._window import InFlightWindow
from producerkit.errors import ProducerClosed, ProduceTimeout

#: ``submit(message, slot, context)``: the producer's way in for a handed-over message (its
#: room reserved).
Submit = Callable[[Message, Slot, Any], "Awaitable[None] | None"]


class Handoff:
    """The queue between other threads and the loop (see the module docstring)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, window: InFlightWindow, submit: Submit
    ) -> None:
        self._loop = loop
        self._window = window
        self._submit = submit
        self._queue: deque[tuple[Message, Slot, Any]] = deque()
        self._taking: deque[tuple[Message, Slot, Any]] = deque()  # what the drain is submitting
        self._lock = threading.Lock()  # the queue's, and the reservations' (see reserve)
        self._draining = False  # a drain is scheduled or running
        self._drain: asyncio.Task[None] | None = None
        self._closed = False

    def put(self, message: Message, slot: Slot, context: Any, timeout: float) -> None:
        """Hand ``message`` over (call from any thread but the loop's), with what tells its
        outcome (see ``Submitter.submit``); wait at most ``timeout`` seconds for room.
        ProduceTimeout if none came, ProducerClosed after :meth:`close`."""
        deadline = 0.0
        lock = self._lock
        while True:
            lock.acquire()
            try:
                if self._closed:
                    raise ProducerClosed("the producer is closed: create a new one")
                if self._window.reserve():
                    self._queue.append((message, slot, context))
                    if self._draining:
                        return
                    self._draining = True
                    break
            finally:
                lock.release()
            if not deadline:
                deadline = time.monotonic() + timeout
            self._wait_for_room(deadline, timeout)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _wait_for_room(self, deadline: float, timeout: float) -> None:
        waiting = asyncio.run_coroutine_threadsafe(self._window.wait_for_room(), self._loop)
        try:
            waiting.result(max(deadline - time.monotonic(), 0.0))
        except concurrent.futures.TimeoutError:
            waiting.cancel()
            raise ProduceTimeout(f"no room in the producer's window within {timeout}s") from None

    def _start_drain(self) -> None:
        self._drain = self._loop.create_task(self._drain_queue())

    async def _drain_queue(self) -> None:
        """On the loop: submit what is queued, in order, until the queue is empty (taking it
        a whole queue at a time, so the threads that hand over seldom wait for the lock)."""
        submit, fail_unadmitted = self._submit, self._window.fail_unadmitted
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    return
                self._taking, self._queue = self._queue, deque()
            taking = self._taking
            while taking:
                message, slot, context = taking.popleft()
                try:
                    waiting = submit(message, slot, context)
                except Exception as exc:  # not admitted: it fails in the room it held
                    fail_unadmitted(message, slot, context, exc)
                    continue
                if waiting is not None:
                    await waiting  # a message it cannot admit, it fails itself

    def close(self) -> None:
        """Refuse further messages (those queued are still submitted)."""
        with self._lock:
            self._closed = True

    def abandon(self, error: BaseException) -> None:
        """Stop submitting: what is still queued fails with ``error`` (at a close that ran
        out of time)."""
        if self._drain is not None:
            self._drain.cancel()
        with self._lock:
            queued = [*self._taking, *self._queue]
            self._taking.clear()
            self._queue.clear()
            self._closed = True
        for message, slot, context in queued:
            self._window.fail_unadmitted(message, slot, context, error)

    async def drained(self) -> None:
        """Wait until everything handed over so far has been submitted."""
        drain = self._drain
        while drain is not None and not drain.done():
            await asyncio.wait((drain,))
            drain = self._drain
