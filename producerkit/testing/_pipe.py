"""One direction of a proxied connection: the chunks read from one side wait in a ``_Pipe`` until
their delivery time (arrival plus half the added round trip), then go to the other side in order;
a stall holds them, a blackhole discards them, a slow link lets them go at its pace (``_Pace``),
and a queue past the high water mark pauses reading the side they come from."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from producerkit.testing._connection import _Connection

#: Pause reading a side once this many bytes wait to be written to the other.
_HIGH_WATER: Final = 4 * 1024 * 1024
#: A slow link sends slices of this many seconds of its bandwidth.
_PACE_QUANTUM: Final = 0.01

Chunk = bytes | memoryview


class _Pace:
    """One direction of a slow link: when its next byte may go."""

    __slots__ = ("next_free", "rate", "slice")

    def __init__(self, bytes_per_second: float) -> None:
        self.rate = bytes_per_second
        self.slice = max(1, int(bytes_per_second * _PACE_QUANTUM))
        self.next_free = 0.0

    def cut(self, chunk: Chunk, now: float) -> Chunk:
        """The piece of ``chunk`` the link carries now, its time booked."""
        piece = chunk[: self.slice]
        self.next_free = max(self.next_free, now) + len(piece) / self.rate
        return piece


class _Pipe:
    """One direction of one connection: chunks waiting for their delivery time, in order."""

    __slots__ = (
        "closing",
        "connection",
        "dest",
        "direction",
        "framer",
        "handle",
        "loop",
        "proxy",
        "queue",
        "queued",
        "source",
        "throttled",
    )

    def __init__(
        self,
        connection: _Connection,
        direction: int,
        loop: asyncio.AbstractEventLoop,
        framer: Callable[[bytes], list[bytes]] | None,
    ) -> None:
        self.connection = connection
        self.proxy = connection.proxy
        self.direction = direction  # 0: toward the broker, 1: toward the client
        self.loop = loop
        self.framer = framer
        self.queue: collections.deque[tuple[float, Chunk]] = collections.deque()
        self.queued = 0
        self.handle: asyncio.TimerHandle | None = None
        self.dest: asyncio.Transport | None = None
        self.source: asyncio.Transport | None = None
        self.closing = False
        self.throttled = False

    def push(self, data: bytes) -> None:
        if self.proxy._blackholed:
            self.connection.lost_bytes = True
            return
        due = self.loop.time() + self.proxy._half_delay
        chunks = [data] if self.framer is None else self.framer(data)
        for chunk in chunks:
            self.queue.append((due, chunk))
            self.queued += len(chunk)
        if self.queued > _HIGH_WATER and self.source is not None and not self.throttled:
            self.throttled = True  # the far side is slow (or stalled): push back on the sender
            self.source.pause_reading()
        if self.handle is None:
            self.deliver()

    def finish(self) -> None:
        """The source closed: close the destination once everything queued is delivered."""
        self.closing = True
        if self.handle is None:
            self.deliver()

    def kick(self) -> None:
        """Deliver now what is due: a fault that held chunks back ended."""
        if self.handle is not None:
            self.handle.cancel()
        self.deliver()

    def drop(self) -> None:
        """Forget every chunk queued."""
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.queue.clear()
        self.queued = 0

    def deliver(self) -> None:
        """Write every chunk that is due (on a slow link, as its bandwidth allows), then set a
        timer for the next."""
        self.handle = None
        proxy = self.proxy
        dest = self.dest
        if proxy._stalled or dest is None:
            return
        if dest.is_closing():
            self.drop()
            return
        now = self.loop.time()
        queue = self.queue
        pace = None if proxy._paces is None else proxy._paces[self.direction]
        wake = None
        while queue:
            due, chunk = queue[0]
            if due > now:
                wake = due
                break
            if pace is None:
                queue.popleft()
            else:
                if pace.next_free > now:
                    wake = pace.next_free
                    break
                piece = pace.cut(chunk, now)
                if len(piece) < len(chunk):
                    queue[0] = (due, memoryview(chunk)[len(piece) :])
                else:
                    queue.popleft()
                chunk = piece
            self.queued -= len(chunk)
            dest.write(chunk)
        if wake is not None:
            self.handle = self.loop.call_at(wake, self.deliver)
        elif self.closing:
            dest.close()
        if self.throttled and self.queued <= _HIGH_WATER // 2 and self.source is not None:
            self.throttled = False
            self.source.resume_reading()
