"""Ctrl-C and SIGTERM for the CLI's waits, also where SIGINT was inherited as ignored."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt inside the block, whatever their handlers were
    (a command started with ``&`` from a script inherits SIGINT ignored, and Python then never
    raises KeyboardInterrupt); the handlers before are restored after it."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: a handler not set from Python, nothing to restore
                signal.signal(sig, handler)


class StopRequest:
    """Inside :meth:`installed`, SIGINT and SIGTERM set :attr:`requested` instead of raising
    (also where SIGINT was inherited as ignored): for a loop that polls child processes, since
    a KeyboardInterrupt raised inside ``Popen.poll()`` can leave its lock taken, and every later
    ``wait()`` on that process then blocks for good."""

    def __init__(self) -> None:
        self.requested = False

    def _request(self, signum: int, frame: object) -> None:
        self.requested = True

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers for the block; the ones before are restored after it."""
        previous = {
            sig: signal.signal(sig, self._request) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            yield
        finally:
            for sig, handler in previous.items():
                if handler is not None:
                    signal.signal(sig, handler)

    def listen_again(self) -> None:
        """Take SIGINT and SIGTERM back, :attr:`requested` cleared: from here on a signal is a
        new request. For the end of an event loop's own handling of them, after which asyncio
        leaves SIGINT raising KeyboardInterrupt wherever the main thread is and SIGTERM killing
        the process (its ``remove_signal_handler``), whatever handled them before."""
        self.requested = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._request)

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until a signal is requested (at once if one was): whether one
        was."""
        deadline = time.monotonic() + seconds
        while not self.requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))
        return self.requested
