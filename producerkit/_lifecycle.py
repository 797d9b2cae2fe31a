"""What runs beside a producer while it runs: the left-open guard and the stats timer.

A producer left open is closed when its event loop shuts down, and reported: an application that
never closes its producer loses whatever is still in flight when its loop ends.
:class:`LeftOpenGuard` is an async generator parked on the producer's loop while it runs: its
``finally`` runs when the loop shuts down its async generators (the end of ``asyncio.run``), or
soon after the producer is dropped while its loop still runs. It then closes the producer,
flushing what the loop still allows, and reports the messages that were never acknowledged (an
ERROR log line and a ResourceWarning, each with the counts). :class:`StatsTimer` calls
``on_stats`` every ``stats_interval`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Final

from producerkit._types import Stats
from producerkit.errors import ProduceError

logger = logging.getLogger("producerkit.producer")

#: Seconds a producer left open gets to flush when its event loop shuts down.
LEFT_OPEN_CLOSE_SECONDS: Final = 2.0


class LeftOpenGuard:
    """Watches one running producer through its public ``close``, ``stats`` and repr."""

    def __init__(
        self,
        close: Callable[[float], Awaitable[None]],
        stats: Callable[[], Stats],
        describe: Callable[[], str],
        timeout: float,
    ) -> None:
        self._close = close
        self._stats = stats
        self._describe = describe
        self._timeout = min(timeout, LEFT_OPEN_CLOSE_SECONDS)
        self._watching = False
        self._generator: AsyncGenerator[None, None] | None = None

    async def start(self) -> None:
        """Park the guard on the running loop."""
        self._watching = True
        self._generator = self._watch()
        await self._generator.asend(None)

    async def stop(self) -> None:
        """The producer is being closed by its owner: nothing to do at loop shutdown."""
        self._watching = False
        generator, self._generator = self._generator, None
        if generator is not None:
            await generator.aclose()

    def forget(self) -> None:
        """Nothing to do at loop shutdown, without awaiting (in a forked child)."""
        self._watching = False
        self._generator = None

    async def _watch(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            if self._watching:
                self._watching = False
                self._generator = None  # close() must not close this generator itself
                await self._close_left_open()

    async def _close_left_open(self) -> None:
        before, described = self._stats(), self._describe()
        try:
            await self._close(self._timeout)
        except ProduceError:
            pass  # counted below
        except Exception:
            logger.debug("closing a producer left open", exc_info=True)
        if before.in_flight:
            acked_since = self._stats().acked - before.acked
            report_left_open(described, before.in_flight, before.in_flight - acked_since)


def report_left_open(producer: str, in_flight: int, never_acked: int) -> None:
    """Say that ``producer`` was never closed, with ``in_flight`` messages of which
    ``never_acked`` were never acknowledged."""
    outcome = (
        f"{never_acked} of them were never acknowledged"
        if never_acked
        else "they were flushed when it was dropped"
    )
    message = (
        f"{producer} was never closed (use `async with` or await close()): it had {in_flight} "
        f"message(s) in flight; {outcome}"
    )
    try:
        logger.error("%s", message)
        warnings.warn(message, ResourceWarning, stacklevel=2)
    except Exception:  # at interpreter exit, logging or warnings may be gone
        pass


class StatsTimer:
    """Calls ``on_stats(stats())`` every ``interval`` seconds between :meth:`start` and
    :meth:`stop` (what it raises is logged)."""

    def __init__(
        self, on_stats: Callable[[Stats], object], stats: Callable[[], Stats], interval: float
    ) -> None:
        self._on_stats = on_stats
        self._stats = stats
        self._interval = interval
        self._timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = loop.call_later(self._interval, self._report, loop)

    def _report(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._on_stats(self._stats())
        except Exception:
            logger.exception("on_stats callback raised")
        if self._timer is not None:
            self._timer = loop.call_later(self._interval, self._report, loop)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
