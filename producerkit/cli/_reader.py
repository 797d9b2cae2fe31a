"""The input of ``producerkit produce``, read and parsed in a worker thread, stoppable at any time.

Reading on the event loop would block it whenever a pipe has no data yet (``tail -f |``): no acks,
no writes, no progress while waiting for the next line. :class:`InputReader` reads in an anyio
worker thread and sends the parsed records, in batches, into a bounded memory object stream that
the producing task reads; a full stream holds the thread back (no polling anywhere).

Its contract: every record it parses is either received from the stream or, once the run is
stopped, in :attr:`InputReader.leftovers`, so a caller can account for every record read. The
thread never blocks in a read of the input: it waits in ``select()`` on the input and on a wake-up
pipe, so :meth:`InputReader.stop` ends it at once even on an idle terminal or pipe, and nothing is
left holding stdin's lock when the interpreter exits.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Generic, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

Item = TypeVar("Item")
UTF8_BOM = b"\xef\xbb\xbf"


class _Stopped(Exception):
    """Raised inside the reading thread once :meth:`InputReader.stop` was called."""


class InputReader(Generic[Item]):
    """Reads ``source``, turns its lines into items with ``parse`` and sends them in batches.

    ``parse`` takes an iterable of lines (each ending in ``\\n`` but the last) and yields items;
    it runs in the worker thread. A UTF-8 byte order mark at the start of the input is dropped.
    ``parsed`` counts the items made so far and ``bytes`` the bytes read (both written by the
    thread, read by anyone).
    """

    CHUNK = 64 * 1024
    MAX_BATCH = 4096
    BATCHES_AHEAD = 4

    def __init__(self, parse: Callable[[Iterable[bytes]], Iterator[Item]], source: IO[bytes]):
        self.parsed = 0
        self.bytes = 0
        #: Items parsed but never sent, once :meth:`run` has returned.
        self.leftovers: list[Item] = []
        #: What ended the thread, if not the end of the input or stop().
        self.error: Exception | None = None
        self._parse = parse
        self._source = source
        self._fd = _selectable_fd(source)
        self._batch: list[Item] = []
        self._send: MemoryObjectSendStream[list[Item]] | None = None
        self._stopping = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        self._finished = anyio.Event()

    def open_stream(
        self,
    ) -> tuple[MemoryObjectSendStream[list[Item]], MemoryObjectReceiveStream[list[Item]]]:
        """A bounded stream for :meth:`run` to send batches into."""
        return anyio.create_memory_object_stream[list[Item]](self.BATCHES_AHEAD)

    async def run(self, send: MemoryObjectSendStream[list[Item]]) -> None:
        """Read and send until the input ends or :meth:`stop`; closes ``send`` when done."""
        self._send = send
        try:
            async with send:
                await anyio.to_thread.run_sync(self._read_and_send)
        finally:
            self._finished.set()

    async def copy(self, write: Callable[[bytes], object]) -> int:
        """Pass the raw input to ``write`` until it ends or :meth:`stop`; the lines seen."""
        return await anyio.to_thread.run_sync(self._copy, write)

    def stop(self) -> None:
        """End the reading thread as soon as possible; safe from any thread, more than once."""
        if not self._stopping.is_set():
            self._stopping.set()
            os.write(self._wake_write, b"x")

    async def stopped(self, receive: MemoryObjectReceiveStream[list[Item]]) -> list[Item]:
        """Stop, close ``receive`` and wait for the thread: every item parsed and never
        received (in the stream's buffer or still in the thread's hands), in input order."""
        self.stop()
        unreceived: list[Item] = []
        # Synchronously, so no send lands between the last receive and the close.
        while True:
            try:
                unreceived += receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        receive.close()
        await self._finished.wait()
        return unreceived + self.leftovers

    def close(self) -> None:
        """Release the wake-up pipe (after the thread has ended)."""
        for fd in (self._wake_read, self._wake_write):
            os.close(fd)

    # ------------------------------------------------------------------ in the worker thread

    def _read_and_send(self) -> None:
        try:
            for item in self._parse(self._lines()):
                self._batch.append(item)
                self.parsed += 1
                if len(self._batch) >= self.MAX_BATCH:
                    self._hand_over()
            self._hand_over()
        except _Stopped:
            pass
        except Exception as exc:
            self.error = exc
        self.leftovers, self._batch = self._batch, []

    def _hand_over(self) -> None:
        """Send the batch parsed so far (kept, for ``leftovers``, if it cannot be sent)."""
        if not self._batch:
            return
        if self._stopping.is_set():
            raise _Stopped
        assert self._send is not None
        try:
            anyio.from_thread.run(self._send.send, self._batch)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise _Stopped from None
        self._batch = []

    def _lines(self) -> Iterator[bytes]:
        pending = b""
        first = True
        while True:
            self._hand_over()  # before a read that may wait, what was parsed goes out
            chunk = self._read()
            if not chunk:
                break
            self.bytes += len(chunk)
            if first:
                first = False
                chunk = chunk.removeprefix(UTF8_BOM)
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                yield line + b"\n"
        if pending:
            yield pending

    def _copy(self, write: Callable[[bytes], object]) -> int:
        lines = 0
        last = b"\n"
        try:
            while chunk := self._read():
                self.bytes += len(chunk)
                write(chunk)
                lines += chunk.count(b"\n")
                last = chunk[-1:]
        except _Stopped:
            pass
        return lines + (last != b"\n")

    def _read(self) -> bytes:
        """The next chunk of input (empty at its end), waiting for it without blocking stop()."""
        if self._stopping.is_set():
            raise _Stopped
        if self._fd is None:
            read = getattr(self._source, "read1", self._source.read)
            chunk: bytes = read(self.CHUNK)
            return chunk
        select.select([self._fd, self._wake_read], [], [])
        if self._stopping.is_set():
            raise _Stopped
        return os.read(self._fd, self.CHUNK)


def _selectable_fd(source: IO[bytes]) -> int | None:
    """The file descriptor to wait on with ``select()`` (None: read ``source`` directly)."""
    if os.name == "nt":  # select() takes only sockets there
        return None
    try:
        return source.fileno()
    except (AttributeError, OSError, ValueError):  # an in-memory file
        return None
