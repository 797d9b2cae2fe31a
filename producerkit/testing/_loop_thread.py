"""Running an action on a test server's own event loop thread, from any thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable


def run_on_loop(
    loop: asyncio.AbstractEventLoop, action: Callable[[], None], timeout: float
) -> None:
    """Run ``action`` on ``loop`` (running in another thread) and wait until it has: what it
    raises is raised here; TimeoutError if it has not run within ``timeout`` seconds."""
    done: concurrent.futures.Future[None] = concurrent.futures.Future()

    def run() -> None:
        try:
            action()
        except BaseException as exc:
            done.set_exception(exc)
        else:
            done.set_result(None)

    loop.call_soon_threadsafe(run)
    done.result(timeout)
