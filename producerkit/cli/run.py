"""One run of ``producerkit produce``: the input read, produced, settled and summed up.

Every record read ends up in exactly one of two places: acknowledged by the broker, or in the
:class:`~producerkit.cli.failures.FailureSink` (counted, and written to ``--failed-out``). An
interrupt (SIGINT, SIGTERM) keeps that true: see :class:`ProduceRun`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import anyio

import producerkit as pk
from producerkit.cli._reader import InputReader
from producerkit.cli._signals import StopRequest
from producerkit.cli.failures import FailureSink, possibly_stored_path
from producerkit.cli.formats import Format, InvalidRecord, Parsed
from producerkit.cli.progress import ProgressLine
from producerkit.errors import MessageError, ProduceError, ProducerClosed, ProducerkitError

if TYPE_CHECKING:
    from anyio.abc import TaskGroup, TaskStatus

    from producerkit.cli.metrics import Metrics

__all__ = ["ProduceRun", "produce_file"]


def _open_input(name: str) -> tuple[IO[bytes], int | None]:
    if name == "-":
        return sys.stdin.buffer, None
    file = open(name, "rb")  # noqa: SIM115 - closed by the caller
    return file, os.fstat(file.fileno()).st_size


class ProduceRun:
    """One run: the producer, the input's reader, the failures file, and what a signal does.

    SIGINT and SIGTERM are taken on the event loop, never as a KeyboardInterrupt raised at a
    random point: they cancel what the run waits for and stop the reader. Every record read and
    not handed to the producer then goes to the failures file, and the producer closes, settling
    what is in flight (acked, or failed and written by ``on_error``). So the summary's ``read ==
    acked + failed`` holds after an interrupt as after a full run.
    """

    def __init__(
        self,
        producer: pk.Producer,
        reader: InputReader[Parsed | InvalidRecord],
        failures: FailureSink,
        progress: ProgressLine,
        headers: dict[str, str] | None,
        pipelined: bool,
        metrics: Metrics | None,
    ) -> None:
        self.producer = producer
        self.reader = reader
        self.failures = failures
        self.progress = progress
        self.headers = headers
        self.pipelined = pipelined
        self.metrics = metrics
        self.interrupted = False
        self.records_copied: int | None = None  # the producer never started: input copied
        self._scope: anyio.CancelScope | None = None
        self._closing = False
        # The batch being produced and how much of it is done, for what an interrupt leaves.
        self._batch: list[Parsed | InvalidRecord] = []
        self._done = 0
        self._in_call = False  # inside produce() for self._batch[self._done]
        self._calls = 0  # produce() calls made ...
        self._refused = 0  # ... and refused at the call, never a message

    @property
    def records_read(self) -> int:
        return self.reader.parsed if self.records_copied is None else self.records_copied

    async def watch_signals(
        self,
        early: StopRequest | None = None,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Until cancelled: a SIGINT or SIGTERM interrupts the run; another one while the
        producer closes stops waiting for the messages in flight (they fail as Purged).
        ``early``: where the signals went before this took them (one counts as the first), and
        go again once it stops."""
        try:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                task_status.started()
                if early is not None and early.requested:
                    self._on_signal()
                async for _ in signals:
                    self._on_signal()
        finally:
            if early is not None:  # a signal after the run is a new request (the linger's end)
                early.listen_again()

    def _on_signal(self) -> None:
        if self._closing and self.interrupted:
            self.producer.purge()  # on_error writes each to the failures file
        self.interrupted = True
        self.reader.stop()
        if self._scope is not None:
            self._scope.cancel()

    @contextlib.contextmanager
    def _interruptible(self) -> Iterator[None]:
        """A block that a signal cancels (at once, if one came already)."""
        with anyio.CancelScope() as scope:
            self._scope = scope
            if self.interrupted:
                scope.cancel()
            try:
                yield
            finally:
                self._scope = None

    async def run(self, tasks: TaskGroup) -> None:
        """Start the producer and publish the input; if the producer cannot start, the whole
        input goes to the failures file."""
        error: ProducerkitError | None = None
        with self._interruptible():
            try:
                await self.producer.start()
            except ProducerkitError as exc:
                error = exc
        if error is not None:
            self.records_copied = await self.reader.copy(self.failures.write_raw)
            self.failures.input_unsent(self.records_copied, error)
            return
        if self.interrupted:
            return
        self.progress.start(self.producer, self.failures)
        tasks.start_soon(self.progress.refresh_every, 0.1)
        if self.metrics is not None:
            self.metrics.attach(self.producer)
        send, receive = self.reader.open_stream()
        tasks.start_soon(self.reader.run, send)
        try:
            with self._interruptible():
                await self._produce_all(receive)
        finally:
            for item in self._unsent() + await self.reader.stopped(receive):
                self.failures.add_unsent(item)

    async def _produce_all(self, receive: AsyncIterable[list[Parsed | InvalidRecord]]) -> None:
        """Produce every record received, then flush; a record refused at the call (a
        MessageError) or a one-by-one produce's own failure goes to the failures file."""
        produce, headers, nonblocking = self.producer.produce, self.headers, self.pipelined
        failures, progress = self.failures, self.progress
        async for batch in receive:
            self._batch, self._done = batch, 0
            for item in batch:
                progress.records += 1
                if isinstance(item, InvalidRecord):
                    failures.add_raw(item.raw, item)
                else:
                    value, key, msg_id = item
                    self._calls += 1
                    self._in_call = True
                    try:
                        await produce(
                            value, key=key, headers=headers, msg_id=msg_id, nonblocking=nonblocking
                        )
                    except (MessageError, ProducerClosed) as exc:
                        self._refused += 1
                        failures.add(value, key, msg_id, exc)
                    except ProducerkitError as exc:  # a one-by-one produce's own failure
                        failures.add(value, key, msg_id, exc)
                    self._in_call = False
                self._done += 1
                if self._done & 1023 == 0:
                    # A burst that never waits would starve the progress task and sockets.
                    await anyio.sleep(0)
        with contextlib.suppress(ProduceError):  # its failures were written by on_error
            await self.producer.flush()

    def _unsent(self) -> list[Parsed | InvalidRecord]:
        """The records of the current batch not handed to the producer (after a cancel)."""
        rest, self._batch = self._batch[self._done :], []
        if rest and self._in_call:
            admitted_before = self._calls - 1 - self._refused
            if self.producer.stats.produced > admitted_before:
                rest = rest[1:]  # it became a message: the producer settles it
        return rest

    async def close(self) -> None:
        """Close the producer (not cancellable: it settles every message in flight)."""
        self._closing = True
        in_flight = self.producer.stats.in_flight
        if self.interrupted and in_flight:
            print(
                f"producerkit produce: interrupted; waiting for the acks of {in_flight:,} "
                "messages in flight (Ctrl-C again: stop waiting, they go to the failures file)",
                file=sys.stderr,
            )
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(ProduceError):  # its failures were written by on_error
                await self.producer.close()
            if self.metrics is not None:
                self.metrics.detach()


async def produce_file(
    file: str,
    fmt: Format,
    kwargs: dict[str, Any],
    headers: dict[str, str] | None,
    failed_out: Path | None,
    show_progress: bool,
    pipelined: bool,
    metrics: Metrics | None = None,
    early: StopRequest | None = None,
) -> int:
    """Publish every record of ``file`` (``-``: stdin) in format ``fmt`` with a Producer of
    ``kwargs``, print the summary and return the exit code: 0 all acked, 1 some failed, 130
    interrupted. ``pipelined``: many messages in flight (else one by one, each acked first).
    ``early``: the signals that came before the run took them over count as its own.
    Raises ConfigurationError if the Producer refuses its settings, and what stopped reading the
    input (ConfigurationError for a CSV header without a column a field flag names)."""
    failures = FailureSink(fmt, failed_out, metrics)
    # Delivery failures are written the moment they happen (so a killed run keeps what it
    # learnt); flush()/close() raise the same failures again, which are therefore not re-added.
    producer = pk.Producer(
        **kwargs,
        on_error=failures.add_failure,
        on_outcome=metrics.observe if metrics is not None else None,
        value_serializer=fmt.values.serializer(),
    )
    source, size = _open_input(file)
    reader: InputReader[Parsed | InvalidRecord] = InputReader(fmt.records, source)
    progress = ProgressLine(show_progress, size, f"→ {kwargs['topic']}", lambda: reader.bytes)
    run = ProduceRun(producer, reader, failures, progress, headers, pipelined, metrics)
    started = time.perf_counter()
    try:
        async with anyio.create_task_group() as tasks:
            await tasks.start(run.watch_signals, early)
            try:
                await run.run(tasks)
            finally:
                await run.close()
                progress.stop()
                tasks.cancel_scope.cancel()  # the signal watcher and the progress refresh
    finally:
        reader.close()
        if source is not sys.stdin.buffer:
            source.close()
        failures.finish()
    if reader.error is not None:
        raise reader.error  # e.g. a CSV header without the --key-field column
    elapsed = time.perf_counter() - started
    _summary(
        kwargs, producer.stats, run.records_read, failures, elapsed, failed_out, run.interrupted
    )
    if run.interrupted:
        return 130
    return 1 if failures.count else 0


def _summary(
    kwargs: dict[str, Any],
    stats: pk.Stats | None,
    records: int,
    failures: FailureSink,
    elapsed: float,
    failed_out: Path | None,
    interrupted: bool = False,
) -> None:
    acked = stats.acked if stats is not None else 0
    rate = records / elapsed if elapsed > 0 else 0.0
    line = (
        f"producerkit produce: {records:,} records in {elapsed:.2f} s ({rate:,.0f}/s) "
        f"to {kwargs['topic']!r}: {acked:,} acked, {failures.count:,} failed"
    )
    if failures.count:
        reasons = ", ".join(f"{count:,} {name}" for name, count in sorted(failures.reasons.items()))
        line += f" ({reasons})"
    if interrupted:
        line += "; interrupted (the input after the last record read was left unread)"
    print(line, file=sys.stderr)
    for example in failures.examples:
        print(f"  e.g. {example}", file=sys.stderr)
    if failures.count:
        if failed_out is not None:
            print(
                f"failed records written to {failed_out}: rerun with it as the input to retry them",
                file=sys.stderr,
            )
            if failures.possibly_stored:
                print(
                    f"{failures.possibly_stored:,} of them may be stored all the same (their "
                    f"answer was lost): those are in {possibly_stored_path(failed_out)}, to "
                    "rerun only where a duplicate does no harm",
                    file=sys.stderr,
                )
        else:
            print("pass --failed-out FILE to keep the failed records for a rerun", file=sys.stderr)
