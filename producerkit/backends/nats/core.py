"""Core NATS: fire-and-forget publishes, acknowledged a burst at a time by PING/PONG.

Core NATS has no acks. Its "ack" is the server's PONG to a PING sent after the message: the server
answers in order, so a PONG proves it received everything published before the PING (not that any
subscriber got it). One PONG acknowledges a whole burst of messages.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable
from typing import Any

from producerkit._record import Record
from producerkit.backends.nats import _natspy_compat
from producerkit.backends.nats.connection import NatsClientConnection
from producerkit.backends.nats.errors import translate
from producerkit.errors import AuthorizationError


class NatsConnection(NatsClientConnection):
    """Core NATS. On the fast path each burst writes nats-py's buffer out first, then its own
    PING with a future nats-py never cancels (nats-py's ``flush()`` can write its PING ahead of
    buffered publishes, and a timed-out flush leaves a cancelled future that breaks the next
    PONG); on the public path a burst is confirmed by ``flush()`` then ``rtt()``. Bursts are
    pipelined; a burst whose PONG never comes (connection lost) is failed by its deadline.
    """

    def setup(self) -> None:
        super().setup()
        self._unflushed: list[Record] = []
        self._confirming: set[asyncio.Future[None]] = set()
        self._confirm_scheduled = False
        #: Refusals (-ERR) waiting for their record's burst to be confirmed, by subject.
        self._denials: dict[str, deque[AuthorizationError]] = {}

    def send(self, record: Record) -> Awaitable[None] | None:
        self._unflushed.append(record)
        if not self._confirm_scheduled:
            self._confirm_scheduled = True
            asyncio.get_running_loop().call_soon(self._confirm_burst)
        return self.publish(record)

    def _confirm_burst(self) -> None:
        self._confirm_scheduled = False
        if not self._unflushed:
            return
        burst, self._unflushed = self._unflushed, []
        task = asyncio.ensure_future(self._ping_after(burst))
        self._confirming.add(task)
        task.add_done_callback(self._confirming.discard)

    async def _ping_after(self, burst: list[Record]) -> None:
        pong: asyncio.Future[Any]
        try:
            if self._direct_writer is not None:
                pong = asyncio.get_running_loop().create_future()
                await self._direct_writer.ping_after_buffer(pong)
            else:
                pong = asyncio.ensure_future(_natspy_compat.confirm_written(self._nc, self.timeout))
        except Exception as exc:
            error = translate(exc)
            for record in burst:
                self.reports.failed(record, error)
            return
        pong.add_done_callback(lambda done: self._burst_confirmed(done, burst))

    def _burst_confirmed(self, pong: asyncio.Future[Any], burst: list[Record]) -> None:
        if pong.cancelled() or pong.exception() is not None:
            return  # left to the records' deadlines
        if self._denials:
            self._settle_with_denials(burst)
            return
        acked = self.reports.acked
        for record in burst:
            acked(record, None)

    def refused(self, subject: str, error: AuthorizationError) -> None:
        """The record is in a burst whose PONG is still to come (the -ERR precedes it): the
        k-th refusal for a subject is its k-th oldest unconfirmed record, failed when the burst
        is confirmed."""
        self._denials.setdefault(subject, deque()).append(error)

    def _settle_with_denials(self, burst: list[Record]) -> None:
        denials = self._denials
        for record in burst:
            subject = self.subject(record)
            waiting = denials.get(subject)
            if not waiting:
                self.reports.acked(record, None)
                continue
            error = waiting.popleft()
            if not waiting:
                del denials[subject]
            self.reports.failed(record, error, False)  # the server refused it

    def flush(self) -> None:
        self._confirm_burst()
