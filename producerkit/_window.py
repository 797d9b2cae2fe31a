"""The bounded in-flight window: the one place where "how many messages may be in flight" lives.

A producer may have at most ``limit`` messages in flight. When a produce finds the window full it
waits until completions have drained it to half the limit, then resumes (seed 000, lesson 2):
waiting for half rather than for one free slot turns a stream of tiny wake-ups into a few large
bursts, and gives a saturated link time to recover before it is filled again.

Waiters are woken by completions, never by polling. Each waiter has its own future so that a
cancelled caller cannot cancel anybody else's wait, and nothing is counted for a caller that is
cancelled while it waits.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque


class InFlightWindow:
    __slots__ = (
        "_empty_waiters",
        "_room_waiters",
        "in_flight",
        "limit",
        "low_water",
        "max_in_flight",
        "wait_seconds",
        "waits",
    )

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.low_water = limit // 2
        self.in_flight = 0
        self.max_in_flight = 0
        self.waits = 0
        self.wait_seconds = 0.0
        self._room_waiters: deque[asyncio.Future[None]] = deque()
        self._empty_waiters: list[asyncio.Future[None]] = []

    @property
    def full(self) -> bool:
        return self.in_flight >= self.limit

    async def wait_for_room(self) -> None:
        """Wait until the window has drained to half; return with at least one free slot."""
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        counted = False
        try:
            # Several waiters wake together at half; the ones that find it full again wait again.
            while self.in_flight >= self.limit:
                if not counted:
                    self.waits += 1
                    counted = True
                waiter: asyncio.Future[None] = loop.create_future()
                self._room_waiters.append(waiter)
                try:
                    await waiter
                finally:
                    if not waiter.done():
                        waiter.cancel()
        finally:
            if counted:
                self.wait_seconds += time.perf_counter() - started

    def acquire(self) -> None:
        """Take a slot. Callers check ``full`` (and wait) first; the window never exceeds limit."""
        in_flight = self.in_flight + 1
        self.in_flight = in_flight
        if in_flight > self.max_in_flight:
            self.max_in_flight = in_flight

    def release(self) -> None:
        in_flight = self.in_flight - 1
        self.in_flight = in_flight
        if in_flight <= self.low_water:
            if self._room_waiters:
                self._wake(self._room_waiters)
            if in_flight == 0 and self._empty_waiters:
                waiters, self._empty_waiters = self._empty_waiters, []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    async def wait_empty(self) -> None:
        """Wait until nothing is in flight."""
        while self.in_flight:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._empty_waiters.append(waiter)
            await waiter

    @staticmethod
    def _wake(waiters: deque[asyncio.Future[None]]) -> None:
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
