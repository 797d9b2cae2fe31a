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

from producerkit import _fast
from producerkit._record import Record
from producerkit.backends.kafka import _aiokafka_compat

Encoder = Callable[[list[Record], int, int, float], tuple[bytes | bytearray, int]]


def encode_batch_with_aiokafka(
    records: list[Record], start: int, max_bytes: int, time_shift: float, compression: int = 0
) -> tuple[bytes | bytearray, int]:
    """The same batch through aiokafka's builder: the fallback, and the one that compresses."""
    builder = _aiokafka_compat.new_record_batch_builder(compression, max_bytes)
    end = _aiokafka_compat.append_records(builder.append, records, start, time_shift)
    return builder.build(), end


encode_batch: Encoder = (
    _fast.speedups.encode_batch if _fast.speedups is not None else encode_batch_with_aiokafka
)
