"""Kafka record batches (v2) from producerkit Records: the C encoder, or aiokafka's builder.

``encode_batch(records, start, max_bytes, time_shift) -> (data, end)`` encodes
``records[start:end]``, taking records while the batch stays within ``max_bytes`` (always at
least one), and returns the batch's bytes and where it stopped. A record's CreateTime is its
deadline plus ``time_shift`` (the producer sets the deadline to ``monotonic() + timeout`` when
the message is produced, so the backend recovers the produce time without a clock read per
message).

The C encoder (``producerkit/_speedups.c``, see ``producerkit._fast``) is used where it was
built; without it aiokafka's batch builder encodes the same bytes (``tests/test_record_batch.py``
compares them). Compressed batches always use aiokafka's builder, which has the codecs.
"""

from __future__ import annotations

from collections.abc import Callable

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from producerkit import _fast
from producerkit._types import DEADLINE, HEADERS, KEY, VALUE, Record

Encoder = Callable[[list[Record], int, int, float], tuple[bytes | bytearray, int]]

#: Shared by every record without headers: aiokafka's encoder only reads it (and wants a list).
_NO_HEADERS: list[tuple[str, bytes]] = []


def append_records(
    builder: DefaultRecordBatchBuilder, records: list[Record], start: int, time_shift: float
) -> int:
    """Append ``records[start:]`` to aiokafka's builder until it is full; return where it
    stopped (the builder always takes the first)."""
    append = builder.append
    for end in range(start, len(records)):
        record = records[end]
        headers = list(record[HEADERS]) if record[HEADERS] else _NO_HEADERS
        timestamp = int((record[DEADLINE] + time_shift) * 1000 // 1)
        if append(end - start, timestamp, record[KEY], record[VALUE], headers) is None:
            return end
    return len(records)


def encode_batch_with_aiokafka(
    records: list[Record], start: int, max_bytes: int, time_shift: float, compression: int = 0
) -> tuple[bytes | bytearray, int]:
    """The same batch through aiokafka's builder: the fallback, and the one that compresses."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=max_bytes,
    )
    end = append_records(builder, records, start, time_shift)
    return builder.build(), end


encode_batch: Encoder = (
    _fast.speedups.encode_batch if _fast.speedups is not None else encode_batch_with_aiokafka
)
