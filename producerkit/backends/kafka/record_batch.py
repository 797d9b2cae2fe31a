"""Kafka record batches (v2) from producerkit Records: the C encoder, or aiokafka's builder.

``encode_batch(records, start, max_bytes, time_shift) -> (data, end)`` encodes
``records[start:end]``, taking records while the batch stays within ``max_bytes`` (always at
least one), and returns the batch's bytes and where it stopped. A record's CreateTime is its
deadline plus ``time_shift`` (the producer sets the deadline to ``monotonic() + timeout`` when
the message is produced, so the backend recovers the produce time without a clock read per
message).

:class:`CompressedEncoder` makes the same for a codec: the records section is encoded the same
way, compressed whole (``codecs``: cramjam, librdkafka's default levels) and framed, on a thread
of its own for a large section.

The C functions (``producerkit/_speedups.c``, see ``producerkit._fast``) are used where they were
built; without them aiokafka's batch builder encodes the same bytes (``tests/test_record_batch.py``
compares them) and :func:`frame_batch_in_python` frames a compressed section.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

from producerkit import _fast
from producerkit._record import Record
from producerkit.backends.kafka import _aiokafka_compat, codecs

Encoder = Callable[[list[Record], int, int, float], tuple[bytes | bytearray, int]]

#: RecordBatch v2: the header's length, and where the CRC and the attributes are in it.
_HEADER: Final = 61
_CRC_AT: Final = 17
_ATTRIBUTES_AT: Final = 21
_TIMESTAMPS: Final = struct.Struct(">qq")  # first and max timestamp, at offset 27


def encode_batch_with_aiokafka(
    records: list[Record], start: int, max_bytes: int, time_shift: float
) -> tuple[bytes | bytearray, int]:
    """The same batch through aiokafka's builder: the fallback."""
    builder = _aiokafka_compat.new_record_batch_builder(0, max_bytes)
    end = _aiokafka_compat.append_records(builder.append, records, start, time_shift)
    return builder.build(), end


def encode_records_in_python(
    records: list[Record], start: int, max_bytes: int, time_shift: float
) -> tuple[bytes, int, int, int]:
    """The Python twin of ``_speedups.encode_records``: a batch's records section (no header),
    where it stopped, and its first and max timestamps."""
    batch, end = encode_batch_with_aiokafka(records, start, max_bytes, time_shift)
    first, latest = _TIMESTAMPS.unpack_from(batch, 27)
    return bytes(batch[_HEADER:]), end, first, latest


def frame_batch_in_python(
    section: Any, codec: int, count: int, first_timestamp: int, max_timestamp: int
) -> bytes:
    """The Python twin of ``_speedups.frame_batch``: a RecordBatch around a compressed records
    section."""
    header = struct.pack(
        ">qiibIhiqqqhii",
        0,
        _HEADER + len(section) - 12,
        -1,
        2,
        0,
        codec,
        count - 1,
        first_timestamp,
        max_timestamp,
        -1,
        -1,
        -1,
        count,
    )
    batch = bytearray(header)
    batch += section
    crc = _aiokafka_compat.crc32c(bytes(batch[_ATTRIBUTES_AT:]))
    struct.pack_into(">I", batch, _CRC_AT, crc)
    return bytes(batch)


encode_batch: Encoder = (
    _fast.speedups.encode_batch if _fast.speedups is not None else encode_batch_with_aiokafka
)
encode_records: Callable[[list[Record], int, int, float], tuple[Any, int, int, int]] = (
    _fast.speedups.encode_records if _fast.speedups is not None else encode_records_in_python
)
frame_batch: Callable[[Any, int, int, int, int], bytes] = (
    _fast.speedups.frame_batch if _fast.speedups is not None else frame_batch_in_python
)


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
