"""Kafka record batches (v2) from producerkit Records, through the wire's encoder (``wire``: C where
it was built, else producerkit's Python one).

``encode_batch(records, start, max_bytes, time_shift) -> (data, end)`` encodes
``records[start:end]``, taking records while the batch stays within ``max_bytes`` (always at
least one), and returns the batch's bytes and where it stopped. A record's CreateTime is its
deadline plus ``time_shift`` (the producer sets the deadline to ``monotonic() + timeout`` when
the message is produced, so the backend recovers the produce time without a clock read per
message).

:class:`CompressedEncoder` makes the same for a codec: the records section is encoded the same
way, compressed whole (``codecs``: cramjam, librdkafka's default levels) and framed, on a thread
of its own for a large section.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

from producerkit._record import Record
from producerkit.backends.kafka import codecs, wire

Encoder = Callable[[list[Record], int, int, float], tuple[bytes | bytearray, int]]

encode_batch: Callable[..., tuple[bytes | bytearray, int]] = wire.ACTIVE.encode_batch


def unchecked(encode: Callable[..., tuple[bytes | bytearray, int]]) -> Encoder:
    """``encode`` (an ``encode_batch``) leaving each batch's CRC 0: for batches that are all
    stamped before they are sent (``idempotence.stamp`` makes the CRC), so that it is made once."""

    def encode_unchecked(
        records: list[Record], start: int, max_bytes: int, time_shift: float
    ) -> tuple[bytes | bytearray, int]:
        return encode(records, start, max_bytes, time_shift, False)

    return encode_unchecked


encode_records: Callable[[list[Record], int, int, float], tuple[Any, int, int, int]] = (
    wire.ACTIVE.encode_records
)
frame_batch: Callable[[Any, int, int, int, int], bytes] = wire.ACTIVE.frame_batch


class CompressedEncoder:
    """Batches compressed with ``codec`` at ``level``, large ones compressed on a thread.

    Calling it is an :data:`Encoder` that compresses on the caller's thread. :meth:`encode_later`
    encodes the records section at once and, for the codecs ``codecs.compresses_off_the_loop``
    names, compresses a section of ``OFF_LOOP_FROM`` bytes or more on a thread of this
    encoder's own (started on first use), so that the event loop goes on while a full batch is
    compressed: it returns a future of the framed batch, or the batch itself otherwise.
    :meth:`close` stops the thread; batches not yet compressed are cancelled.
    """

    #: A section this large forms only when messages come faster than the broker takes them,
    #: where the thread raises the rate. Below it the hand-over costs latency: the thread waits
    #: for the GIL while the loop runs, then stops the loop to take it (docs/tuning.md).
    OFF_LOOP_FROM: Final = 256 * 1024

    def __init__(self, codec: str, level: int | None) -> None:
        self._codec = codec
        self._level = level
        self._attribute = codecs.CODECS[codec]
        self._compress = codecs.compressor(codec, level)
        # The thread gets a compressor of its own when it starts.
        self._compress_on_thread: Callable[[Any], Any] = self._compress
        self._thread: ThreadPoolExecutor | None = None
        self._off_loop = codecs.compresses_off_the_loop(codec)

    def __call__(
        self, records: list[Record], start: int, max_bytes: int, time_shift: float
    ) -> tuple[bytes | bytearray, int]:
        section, end, first, latest = encode_records(records, start, max_bytes, time_shift)
        return self._frame(self._compress, section, end - start, first, latest), end

    def encode_later(
        self, records: list[Record], start: int, max_bytes: int, time_shift: float
    ) -> tuple[bytes | Future[bytes], int, int]:
        """One batch from ``records[start:]``: (the batch or a future of it, where it stopped,
        the size of its records section)."""
        section, end, first, latest = encode_records(records, start, max_bytes, time_shift)
        size = len(section)
        if not self._off_loop or size < self.OFF_LOOP_FROM:
            return self._frame(self._compress, section, end - start, first, latest), end, size
        thread = self._thread
        if thread is None:
            self._compress_on_thread = codecs.compressor(self._codec, self._level)
            thread = self._thread = ThreadPoolExecutor(1, thread_name_prefix="producerkit-compress")
        framed = thread.submit(
            self._frame, self._compress_on_thread, section, end - start, first, latest
        )
        return framed, end, size

    def _frame(
        self, compress: Callable[[Any], Any], section: Any, count: int, first: int, latest: int
    ) -> bytes:
        return frame_batch(compress(section), self._attribute, count, first, latest)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
