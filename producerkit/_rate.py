"""The rate limit: token buckets in messages and bytes per second, shared by every connection.

A :class:`RateLimit` holds up to two buckets (messages, bytes). A produce takes one message and its
size in bytes from them before it is admitted; when a bucket is short it waits in one first-in,
first-out queue, and a single timer, armed for the moment the head of the queue can be served,
wakes it: no polling, no timer or task per message, and a later produce never overtakes a waiting
one. A bucket fills at its rate up to its burst, so a producer idle for a while may send one
burst at once, and over any long run sends at most ``rate`` per second (plus one burst).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Final

from producerkit.errors import ConfigurationError

#: Seconds of the rate a bucket holds when no burst is given.
DEFAULT_BURST_SECONDS: Final = 0.05


class TokenBucket:
    """Tokens that refill at ``rate`` per second up to ``burst``; starts full."""

    __slots__ = ("_stamp", "burst", "rate", "tokens")

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self._stamp = time.monotonic()

    def refill(self, now: float) -> None:
        tokens = self.tokens + (now - self._stamp) * self.rate
        self.tokens = tokens if tokens < self.burst else self.burst
        self._stamp = now

    def shortfall(self, amount: float) -> float:
        """Seconds until ``amount`` tokens are there (0.0: now). An amount above the burst
        waits for a full bucket and then takes it, leaving a debt (tokens below zero)."""
        needed = min(amount, self.burst) - self.tokens
        return needed / self.rate if needed > 0 else 0.0


class RateLimit:
    """At most ``messages_per_second`` messages and ``bytes_per_second`` bytes (either may be
    None: no limit on it). :meth:`acquire` returns once the message may be admitted."""

    __slots__ = (
        "_buckets",
        "_byte_bucket",
        "_loop",
        "_message_bucket",
        "_timer",
        "_waiters",
        "wait_seconds",
        "waits",
    )

    def __init__(
        self,
        messages_per_second: float | None,
        bytes_per_second: float | None,
        burst: float | None = None,
    ) -> None:
        self._message_bucket: TokenBucket | None = None
        self._byte_bucket: TokenBucket | None = None
        if messages_per_second is not None:
            rate = _positive_rate("max_rate", messages_per_second)
            self._message_bucket = TokenBucket(rate, _burst(burst, rate, "messages"))
        if bytes_per_second is not None:
            rate = _positive_rate("max_bytes_rate", bytes_per_second)
            # ``burst`` counts messages; the byte bucket holds the same time's worth of bytes.
            seconds = (
                burst / messages_per_second
                if burst is not None and messages_per_second is not None
                else DEFAULT_BURST_SECONDS
            )
            self._byte_bucket = TokenBucket(rate, max(1.0, rate * seconds))
        self._buckets = tuple(
            bucket for bucket in (self._message_bucket, self._byte_bucket) if bucket is not None
        )
        self._waiters: deque[tuple[asyncio.Future[None], int]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.waits = 0  # produces that had to wait
        self.wait_seconds = 0.0

    def try_acquire(self, size: int) -> bool:
        """Take one message of ``size`` bytes if nobody waits and the buckets have it now."""
        if self._waiters:
            return False
        now = time.monotonic()
        if self._wait_time(size, now) > 0.0:
            return False
        self._take(size)
        return True

    async def acquire(self, size: int) -> None:
        """Wait (first in, first out) until one message of ``size`` bytes may go, and take it.
        A caller cancelled while waiting takes nothing."""
        if not self.try_acquire(size):
            await self.wait_for_turn(size)

    async def wait_for_turn(self, size: int) -> None:
        """:meth:`acquire` for a caller whose :meth:`try_acquire` has just failed: queue at
        once, without trying again."""
        loop = self._loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append((waiter, size))
        self.waits += 1
        started = time.monotonic()
        if len(self._waiters) == 1:
            self._serve()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._give_back(size)  # served just as it was cancelled: the tokens go back
            else:
                self._forget(waiter)
            raise
        finally:
            self.wait_seconds += time.monotonic() - started

    def _serve(self) -> None:
        """Serve the waiters at the head whose tokens are there; arm the timer for the next."""
        self._timer = None
        waiters = self._waiters
        now = time.monotonic()
        while waiters:
            waiter, size = waiters[0]
            if waiter.done():  # cancelled
                waiters.popleft()
                continue
            delay = self._wait_time(size, now)
            if delay > 0.0:
                assert self._loop is not None
                self._timer = self._loop.call_at(self._loop.time() + delay, self._serve)
                return
            waiters.popleft()
            self._take(size)
            waiter.set_result(None)

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        for index, (queued, _) in enumerate(self._waiters):
            if queued is waiter:
                del self._waiters[index]
                break
        if self._timer is not None:  # the head may have changed: re-arm for the new one
            self._timer.cancel()
        self._serve()

    def _wait_time(self, size: int, now: float) -> float:
        delay = 0.0
        for bucket in self._buckets:
            bucket.refill(now)
            amount = 1 if bucket is self._message_bucket else size
            delay = max(delay, bucket.shortfall(amount))
        return delay

    def _take(self, size: int) -> None:
        if self._message_bucket is not None:
            self._message_bucket.tokens -= 1
        if self._byte_bucket is not None:
            self._byte_bucket.tokens -= size

    def _give_back(self, size: int) -> None:
        if self._message_bucket is not None:
            self._message_bucket.tokens += 1
        if self._byte_bucket is not None:
            self._byte_bucket.tokens += size

    def close(self) -> None:
        """Stop the timer; waiters still queued are woken (the producer then refuses them)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._waiters:
            waiter, _ = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)


def _positive_rate(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value > 0
        or value == float("inf")
    ):
        raise ConfigurationError(f"{name} must be a positive number per second, got {value!r}")
    return float(value)


def _burst(burst: object, rate: float, unit: str) -> float:
    if burst is None:
        return max(1.0, rate * DEFAULT_BURST_SECONDS)
    if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not burst >= 1:
        raise ConfigurationError(f"rate_burst must be a number of {unit} >= 1, got {burst!r}")
    return float(burst)
