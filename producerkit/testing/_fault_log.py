"""What a :class:`~producerkit.testing.proxy.FaultProxy` records of its faults: a
:class:`FaultWindow` each, kept by a :class:`FaultLog`, and ``_Timed``, a fault in force with the
timer that ends it."""

from __future__ import annotations

import asyncio
import threading
import time

import attrs

__all__ = ["FaultLog", "FaultWindow"]


@attrs.frozen(slots=True)
class FaultWindow:
    """One fault: its ``mode`` (``stall``, ``blackhole``, ``refuse``, ``slow``, ``reset``,
    ``latency``, or a broker's ``kill``), when it started and ended (``time.monotonic()``;
    ``ended`` is None while it lasts and equals ``started`` for an instant one, ``reset``), and
    ``detail``, the arguments it was given."""

    mode: str
    started: float
    ended: float | None
    detail: str = ""


class FaultLog:
    """Every fault of a proxy in the order they started; safe to read and write from any
    thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: list[FaultWindow] = []
        self._open: dict[int, str] = {}

    def open(self, mode: str, detail: str = "") -> int:
        """Record a fault starting now; returns the number to give :meth:`close`."""
        with self._lock:
            self._windows.append(FaultWindow(mode, time.monotonic(), None, detail))
            number = len(self._windows) - 1
            self._open[number] = mode
            return number

    def close(self, number: int) -> None:
        """Record that the fault :meth:`open` numbered ``number`` ended now (once: a fault
        already ended keeps its end)."""
        with self._lock:
            if self._open.pop(number, None) is not None:
                ended = time.monotonic()
                self._windows[number] = attrs.evolve(self._windows[number], ended=ended)

    def instant(self, mode: str, detail: str = "") -> None:
        """Record a fault that starts and ends now."""
        with self._lock:
            now = time.monotonic()
            self._windows.append(FaultWindow(mode, now, now, detail))

    def windows(self) -> list[FaultWindow]:
        """A copy of every window so far, the ones still open included (``ended`` None)."""
        with self._lock:
            return list(self._windows)

    def active(self) -> tuple[str, ...]:
        """The modes of the faults in force now, in the order they started."""
        with self._lock:
            return tuple(self._open.values())


class _Timed:
    """A fault in force: its log window and the timer that ends it (None: until ended)."""

    __slots__ = ("mode", "timer", "window")

    def __init__(self, mode: str, window: int, timer: asyncio.TimerHandle | None) -> None:
        self.mode = mode
        self.window = window
        self.timer = timer

    def end(self, log: FaultLog) -> None:
        if self.timer is not None:
            self.timer.cancel()
        log.close(self.window)
