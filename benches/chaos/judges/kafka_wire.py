"""The Kafka protocol as the judges read it: the request header of every request, the fields of
the three APIs that decide what a ``read_committed`` consumer sees, and a record batch as a
broker stores and serves it.

- Produce (API 0) requests v3+ (v3-v8 fixed-width strings and arrays, v9-v12 flexible: compact
  strings and arrays, tagged fields): the transactional id, and per partition the first record
  batch's header, at fixed offsets of the v2 batch format (attributes @21, producer id @43,
  epoch @51, base sequence @53, record count @57). The records are skipped, never decoded.
  Responses: per partition, the error code and the base offset. The recorder
  (:mod:`chaos.judges.kafka_recorder`) reads those with a transactional id for the transaction
  log, and (with a batch log) those of idempotent producers, whose batch carries a producer id.
- EndTxn (API 26) requests (v0-v2 fixed, v3+ flexible): transactional id, producer id, epoch,
  committed; responses: the error code.
- InitProducerId (API 22) requests with a transactional id (v0-v1 fixed, v2+ flexible): the
  transactional id and the transaction timeout; responses: error code, producer id, epoch.
- :func:`record_batches`: each whole record batch (magic 2) of a partition's records as a Fetch
  serves them, its header (the same offsets) and its records' offsets and values.

Every frame parser takes one whole frame (its 4-byte size prefix included) and raises
:class:`ValueError` (or :class:`struct.error`) on bytes it cannot read; the recorder forwards
the frame untouched either way.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, NamedTuple

PRODUCE: Final = 0
INIT_PRODUCER_ID: Final = 22
END_TXN: Final = 26

#: The first version of each API whose requests and responses are flexible (KIP-482).
_FLEXIBLE_FROM: Final = {PRODUCE: 9, INIT_PRODUCER_ID: 2, END_TXN: 3}
#: Produce v13 names topics by id, not name: the recorder reads v3..v12.
_PRODUCE_VERSIONS: Final = range(3, 13)

#: Record batch (magic 2) header offsets, from the batch's first byte.
_BATCH_ATTRIBUTES: Final = 21
_BATCH_PRODUCER_ID: Final = 43
_BATCH_EPOCH: Final = 51
_BATCH_BASE_SEQUENCE: Final = 53
_BATCH_RECORD_COUNT: Final = 57
_BATCH_HEADER: Final = 61
_MAGIC: Final = 16
ATTR_COMPRESSION: Final = 0x07
ATTR_TRANSACTIONAL: Final = 0x10
ATTR_CONTROL: Final = 0x20

_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_I64: Final = struct.Struct(">q")
_HEADER: Final = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id
#: The head of a stored batch, and the producer's stamp on it (from _BATCH_PRODUCER_ID on).
_BATCH_HEAD: Final = struct.Struct(">qiib")  # base offset, batch length, leader epoch, magic
_BATCH_STAMP: Final = struct.Struct(">qhii")  # producer id, epoch, base sequence, count


def wanted(api_key: int, api_version: int) -> bool:
    """Whether the recorder reads requests of this API and version (and their responses)."""
    if api_key == PRODUCE:
        return api_version in _PRODUCE_VERSIONS
    return api_key in (END_TXN, INIT_PRODUCER_ID)


def flexible(api_key: int, api_version: int) -> bool:
    return api_version >= _FLEXIBLE_FROM[api_key]


class _Wire:
    """A cursor over one frame: reads advance ``pos``; nothing is copied but what is read."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("truncated frame")
        self.pos += n

    def int8(self) -> int:
        self.skip(1)
        return self.data[self.pos - 1]

    def int16(self) -> int:
        value: int = _I16.unpack_from(self.data, self.pos)[0]
        self.pos += 2
        return value

    def int32(self) -> int:
        value: int = _I32.unpack_from(self.data, self.pos)[0]
        self.pos += 4
        return value

    def int64(self) -> int:
        value: int = _I64.unpack_from(self.data, self.pos)[0]
        self.pos += 8
        return value

    def uvarint(self) -> int:
        result = shift = 0
        while True:
            byte = self.int8()
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    def length(self, compact: bool) -> int:
        """A string's, bytes' or array's length (-1: null)."""
        return self.uvarint() - 1 if compact else self.int32()

    def string(self, compact: bool) -> str | None:
        size = self.uvarint() - 1 if compact else self.int16()
        if size < 0:
            return None
        start = self.pos
        self.skip(size)
        return self.data[start : self.pos].decode("utf-8")

    def tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.skip(self.uvarint())


def request_header(frame: bytes | bytearray) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` of a request frame of at least 12 bytes."""
    _, api_key, api_version, correlation_id = _HEADER.unpack_from(frame, 0)
    return api_key, api_version, correlation_id


def _request_body(frame: bytes, api_key: int, api_version: int) -> tuple[_Wire, bool]:
    """A cursor at the request's body, past the header's client id (request header v1) and,
    for a flexible version, its tagged fields (header v2: the client id stays a plain
    nullable string there)."""
    wire = _Wire(frame, 12)
    size = wire.int16()
    wire.skip(max(size, 0))
    compact = flexible(api_key, api_version)
    if compact:
        wire.tagged_fields()
    return wire, compact


def _response_body(frame: bytes, api_key: int, api_version: int) -> tuple[_Wire, bool]:
    wire = _Wire(frame, 8)  # size, correlation_id
    compact = flexible(api_key, api_version)
    if compact:
        wire.tagged_fields()  # response header v1
    return wire, compact


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """One partition's first record batch in a Produce request."""

    topic: str
    partition: int
    producer_id: int
    epoch: int
    base_sequence: int
    record_count: int
    attributes: int

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)


def produce_request(frame: bytes, api_version: int) -> tuple[str, list[BatchHeader]] | None:
    """The transactional id and each partition's batch header of a Produce request; None for a
    request without a transactional id (nothing to record)."""
    wire, compact = _request_body(frame, PRODUCE, api_version)
    transactional_id = wire.string(compact)
    if transactional_id is None:
        return None
    return transactional_id, _produce_batches(wire, compact)


def produce_batches(frame: bytes, api_version: int) -> tuple[str | None, list[BatchHeader]]:
    """The transactional id (None: none) and each partition's batch header of any Produce
    request (for the batch recorder, which reads idempotent producers' requests too)."""
    wire, compact = _request_body(frame, PRODUCE, api_version)
    transactional_id = wire.string(compact)
    return transactional_id, _produce_batches(wire, compact)


def _produce_batches(wire: _Wire, compact: bool) -> list[BatchHeader]:
    """Each partition's first batch header, from a Produce request's acks field on."""
    frame = wire.data
    wire.skip(6)  # acks, timeout_ms
    batches: list[BatchHeader] = []
    for _ in range(wire.length(compact)):
        topic = wire.string(compact) or ""
        for _ in range(wire.length(compact)):
            partition = wire.int32()
            size = wire.length(compact)
            start = wire.pos
            wire.skip(max(size, 0))
            if size >= _BATCH_HEADER and frame[start + _MAGIC] == 2:
                batches.append(
                    BatchHeader(
                        topic=topic,
                        partition=partition,
                        producer_id=_I64.unpack_from(frame, start + _BATCH_PRODUCER_ID)[0],
                        epoch=_I16.unpack_from(frame, start + _BATCH_EPOCH)[0],
                        base_sequence=_I32.unpack_from(frame, start + _BATCH_BASE_SEQUENCE)[0],
                        record_count=_I32.unpack_from(frame, start + _BATCH_RECORD_COUNT)[0],
                        attributes=_I16.unpack_from(frame, start + _BATCH_ATTRIBUTES)[0],
                    )
                )
            if compact:
                wire.tagged_fields()
        if compact:
            wire.tagged_fields()
    return batches


def produce_response(frame: bytes, api_version: int) -> dict[tuple[str, int], tuple[int, int]]:
    """``(topic, partition) -> (error_code, base_offset)`` of a Produce response."""
    wire, compact = _response_body(frame, PRODUCE, api_version)
    results: dict[tuple[str, int], tuple[int, int]] = {}
    for _ in range(wire.length(compact)):
        topic = wire.string(compact) or ""
        for _ in range(wire.length(compact)):
            partition = wire.int32()
            error = wire.int16()
            base_offset = wire.int64()
            results[(topic, partition)] = (error, base_offset)
            if api_version >= 2:
                wire.skip(8)  # log_append_time_ms
            if api_version >= 5:
                wire.skip(8)  # log_start_offset
            if api_version >= 8:
                for _ in range(wire.length(compact)):  # record_errors
                    wire.skip(4)  # batch_index
                    wire.string(compact)  # batch_index_error_message
                    if compact:
                        wire.tagged_fields()
                wire.string(compact)  # error_message
            if compact:
                wire.tagged_fields()  # current_leader (v10+) among them
        if compact:
            wire.tagged_fields()
    return results


def end_txn_request(frame: bytes, api_version: int) -> tuple[str, int, int, bool]:
    """``(transactional_id, producer_id, epoch, committed)`` of an EndTxn request."""
    wire, compact = _request_body(frame, END_TXN, api_version)
    transactional_id = wire.string(compact) or ""
    producer_id = wire.int64()
    epoch = wire.int16()
    committed = wire.int8() != 0
    return transactional_id, producer_id, epoch, committed


def end_txn_response(frame: bytes, api_version: int) -> int:
    """The error code of an EndTxn response."""
    wire, _ = _response_body(frame, END_TXN, api_version)
    wire.skip(4)  # throttle_time_ms
    return wire.int16()


def init_producer_id_request(frame: bytes, api_version: int) -> tuple[str, int] | None:
    """``(transactional_id, transaction_timeout_ms)`` of an InitProducerId request; None for
    an idempotent producer's (no transactional id)."""
    wire, compact = _request_body(frame, INIT_PRODUCER_ID, api_version)
    transactional_id = wire.string(compact)
    if transactional_id is None:
        return None
    return transactional_id, wire.int32()


def init_producer_id_response(frame: bytes, api_version: int) -> tuple[int, int, int]:
    """``(error_code, producer_id, epoch)`` of an InitProducerId response."""
    wire, _ = _response_body(frame, INIT_PRODUCER_ID, api_version)
    wire.skip(4)  # throttle_time_ms
    return wire.int16(), wire.int64(), wire.int16()


# ---------------------------------------------------------------------- stored batches


class ServedBatch(NamedTuple):
    """A record batch as the mock stored it: where, and the producer's stamp on it."""

    partition: int
    base_offset: int
    producer_id: int
    epoch: int
    base_sequence: int
    record_count: int


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, position after it)."""
    shift = result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def record_batches(
    partition: int, records: bytes
) -> Iterator[tuple[ServedBatch, list[tuple[int, bytes]]]]:
    """Each whole record batch (magic 2) in a partition's records: its header and its
    ``(offset, value)`` pairs (a batch cut short at the end is left out: it comes again)."""
    pos, end = 0, len(records)
    while pos + _BATCH_HEADER <= end:
        base_offset, length, _, magic = _BATCH_HEAD.unpack_from(records, pos)
        stop = pos + 12 + length
        if stop > end:
            return
        if magic == 2:
            (attributes,) = _I16.unpack_from(records, pos + _BATCH_ATTRIBUTES)
            stamp = _BATCH_STAMP.unpack_from(records, pos + _BATCH_PRODUCER_ID)
            producer_id, epoch, sequence, count = stamp
            if attributes & ATTR_COMPRESSION:
                raise ValueError("the live read-back reads uncompressed batches only")
            values: list[tuple[int, bytes]] = []
            at = pos + _BATCH_HEADER
            for _ in range(count if not attributes & ATTR_CONTROL else 0):
                size, at = _varint(records, at)
                following = at + size
                _, at = _varint(records, at + 1)  # attributes (1 byte), timestamp delta
                delta, at = _varint(records, at)
                key_size, at = _varint(records, at)
                value_size, at = _varint(records, at + max(key_size, 0))
                values.append((base_offset + delta, records[at : at + max(value_size, 0)]))
                at = following
            yield (
                ServedBatch(partition, base_offset, producer_id, epoch, sequence, count),
                values,
            )
        pos = stop
