"""The progress line of ``producerkit produce`` (``--progress``), drawn with rich.

rich is imported only when the line is shown; without it the run goes on without a line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    import producerkit as pk
    from producerkit.cli.failures import FailureSink

__all__ = ["ProgressLine", "progress_columns"]


class ProgressLine:
    """A rich progress line, refreshed ~10 times a second by a task, never per record.

    ``records`` counts the records taken from the reader; the bar follows the bytes it read.
    """

    def __init__(
        self, enabled: bool, total_bytes: int | None, label: str, bytes_read: Callable[[], int]
    ) -> None:
        self.records = 0
        self._bytes_read = bytes_read
        self._producer: pk.Producer | None = None
        self._failures: FailureSink | None = None
        self._progress: Any = None
        self._started = time.perf_counter()
        if not enabled:
            return
        try:
            from rich.console import Console
            from rich.progress import Progress
        except ImportError:
            print(
                'producerkit produce: no progress bar without rich: pip install "producerkit[cli]"',
                file=sys.stderr,
            )
            return
        console = Console(stderr=True)
        self._progress = Progress(
            *progress_columns(console.width),
            console=console,
            auto_refresh=False,
            transient=False,
        )
        self._id = self._progress.add_task(
            label, total=total_bytes, records=0, rate="0", in_flight=0, acked=0, failed=0
        )

    def start(self, producer: pk.Producer, failures: FailureSink) -> None:
        self._producer = producer
        self._failures = failures
        self._started = time.perf_counter()
        if self._progress is not None:
            self._progress.start()

    async def refresh_every(self, seconds: float) -> None:
        """Refresh until cancelled (a task of the run's task group)."""
        if self._progress is None:
            return
        while True:
            self.refresh()
            await anyio.sleep(seconds)

    def refresh(self) -> None:
        if self._progress is None or self._producer is None or self._failures is None:
            return
        stats = self._producer.stats
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        self._progress.update(
            self._id,
            completed=self._bytes_read(),
            records=self.records,
            rate=_short_number(self.records / elapsed),
            in_flight=stats.in_flight,
            acked=stats.acked,
            failed=self._failures.count,
            refresh=True,
        )

    def stop(self) -> None:
        if self._progress is not None:
            self.refresh()
            self._progress.stop()


#: Below this many columns the progress line is the counts alone (no label, bar or clock).
_WIDE = 100


def progress_columns(width: int) -> list[Any]:
    """The progress line's columns for a terminal ``width`` wide: the counts in one column that
    never wraps or truncates; the label, the bar (taking what is left) and the clock only
    where there is room for them."""
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
    from rich.table import Column

    counts = TextColumn(
        "{task.fields[records]:,} read {task.fields[rate]}/s  acked {task.fields[acked]:,}  "
        "failed {task.fields[failed]:,}  in flight {task.fields[in_flight]:,}",
        table_column=Column(no_wrap=True),
    )
    if width < _WIDE:
        return [counts]
    return [
        TextColumn("[bold]{task.description}"),
        BarColumn(bar_width=None),
        counts,
        TimeElapsedColumn(),
    ]


def _short_number(number: float) -> str:
    """``number`` in at most 5 characters: 935, 63.1k, 1.23M."""
    for divisor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if number >= divisor:
            scaled = number / divisor
            return f"{scaled:.3g}{suffix}" if scaled < 1000 else f"{scaled:.0f}{suffix}"
    return f"{number:.0f}"
