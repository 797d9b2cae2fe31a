"""Ctrl-C and SIGTERM for the CLI's waits, also where SIGINT was inherited as ignored."""

from __future__ import annotations

import signal
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
