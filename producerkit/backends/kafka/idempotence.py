"""The idempotent producer's identity and its batches' stamps.

A broker that grants a producer id (InitProducerId) keeps, per partition, the sequence number
it expects next from that producer: a batch stamped with the id, its epoch and the sequence of
its first record is stored once, in sequence order, however often it is sent. So retries store
nothing twice, and up to five batches per partition may be in flight with every key in order
(the broker refuses a batch whose predecessor it has not stored: OUT_OF_ORDER_SEQUENCE_NUMBER).

- :func:`request_producer_id` asks for an id (or, given the current one, for its epoch to be
  bumped, KIP-360) with the newest InitProducerId version both sides speak (v0-v4: Tansu grants
  ids from v3 on only).
- :func:`stamp` writes an id, epoch and base sequence into an encoded record batch: the
  sender stamps a batch when it is first written, so batches that fail before any request
  carried them leave no gap in the partition's sequence.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any, ClassVar, Final, NamedTuple

from aiokafka import errors as kafka_errors
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.transaction import (
    InitProducerIdRequest as _AIOKafkaInitProducerIdRequest,
)
from aiokafka.protocol.types import (
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    String,
    TaggedFields,
)

from producerkit.backends.kafka import wire
from producerkit.backends.kafka.wire import ATTRIBUTES_AT as _ATTRIBUTES_AT
from producerkit.backends.kafka.wire import CRC_AT as _CRC_AT
from producerkit.backends.kafka.wire import HEADER_SIZE as _HEADER

#: The InitProducerId API key.
INIT_PRODUCER_ID: Final = 22
_PRODUCER_AT: Final = 43  # producer id (int64), epoch (int16), base sequence (int32)
_ATTRIBUTES = struct.Struct(">h")
_PRODUCER = struct.Struct(">qhi")
_CRC = struct.Struct(">I")
#: The attributes bit of a transactional batch.
TRANSACTIONAL_BIT: Final = 0x10
#: Sequence numbers are int32 and wrap to 0 after the largest.
_SEQUENCE_LIMIT: Final = 2**31


class ProducerId(NamedTuple):
    """A producer id and its epoch, as a broker granted them."""

    id: int
    epoch: int


class _InitProducerIdResponse_v0(Response):  # type: ignore[misc]
    API_KEY = INIT_PRODUCER_ID
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
    )


class _InitProducerIdResponse_v1(_InitProducerIdResponse_v0):
    API_VERSION = 1


class _InitProducerIdResponse_v2(Response):  # type: ignore[misc]
    API_KEY = INIT_PRODUCER_ID
    API_VERSION = 2
    FLEXIBLE_VERSION = True
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("tags", TaggedFields),
    )


class _InitProducerIdResponse_v3(_InitProducerIdResponse_v2):
    API_VERSION = 3


class _InitProducerIdResponse_v4(_InitProducerIdResponse_v2):
    API_VERSION = 4


class _InitProducerIdRequest_v0(RequestStruct):  # type: ignore[misc]
    API_KEY = INIT_PRODUCER_ID
    API_VERSION = 0
    RESPONSE_TYPE = _InitProducerIdResponse_v0
    SCHEMA = Schema(("transactional_id", String("utf-8")), ("transaction_timeout_ms", Int32))


class _InitProducerIdRequest_v1(RequestStruct):  # type: ignore[misc]
    API_KEY = INIT_PRODUCER_ID
    API_VERSION = 1
    RESPONSE_TYPE = _InitProducerIdResponse_v1
    SCHEMA = _InitProducerIdRequest_v0.SCHEMA


class _InitProducerIdRequest_v2(RequestStruct):  # type: ignore[misc]
    API_KEY = INIT_PRODUCER_ID
    API_VERSION = 2
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = _InitProducerIdResponse_v2
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("transaction_timeout_ms", Int32),
        ("tags", TaggedFields),
    )


class _InitProducerIdRequest_v3(RequestStruct):  # type: ignore[misc]
    API_KEY = INIT_PRODUCER_ID
    API_VERSION = 3
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = _InitProducerIdResponse_v3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("transaction_timeout_ms", Int32),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("tags", TaggedFields),
    )


class _InitProducerIdRequest_v4(RequestStruct):  # type: ignore[misc]
    API_KEY = INIT_PRODUCER_ID
    API_VERSION = 4
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = _InitProducerIdResponse_v4
    SCHEMA = _InitProducerIdRequest_v3.SCHEMA


_Versions = (
    _InitProducerIdRequest_v0
    | _InitProducerIdRequest_v1
    | _InitProducerIdRequest_v2
    | _InitProducerIdRequest_v3
    | _InitProducerIdRequest_v4
)


class InitProducerIdRequest(Request[_Versions]):  # type: ignore[misc]
    """InitProducerId v0-v4, the newest the broker speaks; ``current`` (v3+) asks for the
    current id's epoch to be bumped instead of a new id."""

    API_KEY: ClassVar[int] = INIT_PRODUCER_ID

    def __init__(
        self, transactional_id: str | None, transaction_timeout_ms: int, current: ProducerId | None
    ) -> None:
        self._transactional_id = transactional_id
        self._transaction_timeout_ms = transaction_timeout_ms
        self._current = current

    def build(self, request_struct_class: type[_Versions]) -> _Versions:
        version = request_struct_class.API_VERSION
        fields: list[Any] = [self._transactional_id, self._transaction_timeout_ms]
        if version >= 3:
            current = self._current or ProducerId(-1, -1)
            fields += [current.id, current.epoch]
        if version >= 2:
            fields.append({})
        return request_struct_class(*fields)


def _broker_error(code: int) -> kafka_errors.KafkaError:
    """aiokafka's error for a broker's error ``code``; where aiokafka has no class for it
    (PRODUCER_FENCED, ...), its UnknownError carrying the code as ``errno``."""
    error: kafka_errors.KafkaError = kafka_errors.for_code(code)()
    if error.errno != code:
        error.errno = code
    return error


#: Errors of InitProducerId worth asking again for, after a backoff.
_RETRIABLE_CODES: Final = frozenset({7, 13, 14, 15, 16, 51})  # timeout, network, coordinator...
#: COORDINATOR_NOT_AVAILABLE and NOT_COORDINATOR.
_MOVED_CODES: Final = frozenset({15, 16})


async def request_producer_id(
    client: Any,
    *,
    deadline: float,
    transactional_id: str | None = None,
    transaction_timeout_ms: int = 60_000,
    current: ProducerId | None = None,
    node_id: Callable[[], int | None] | None = None,
    retry_backoff: float = 0.1,
    newest: bool = True,
) -> ProducerId:
    """A producer id from the cluster of aiokafka's ``client``: a new one, or ``current`` with
    its epoch bumped. Asks each broker in turn (or ``node_id()``'s, the transaction
    coordinator) until one grants it or the loop's clock passes ``deadline``; a retriable
    refusal is asked again after ``retry_backoff``. ``newest=False`` asks as aiokafka's own
    idempotent producer does (v0), to learn whether it will be granted one.

    Raises the aiokafka error for the broker's error code (``UnknownServerError`` from a broker
    that does not grant ids at the versions both speak), ``KafkaConnectionError`` if no broker
    answered, ``KafkaTimeoutError`` at the deadline.
    """
    loop = asyncio.get_running_loop()
    request: Any = (
        InitProducerIdRequest(transactional_id, transaction_timeout_ms, current)
        if newest
        else _AIOKafkaInitProducerIdRequest(transactional_id, transaction_timeout_ms)
    )
    last_error: BaseException | None = None
    while True:
        nodes = [node_id()] if node_id is not None else _broker_ids(client)
        for node in nodes:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise kafka_errors.KafkaTimeoutError(
                    f"no producer id granted in time (last: {last_error!r})"
                )
            if node is None:
                last_error = kafka_errors.CoordinatorNotAvailableError()
                continue
            try:
                response = await asyncio.wait_for(client.send(node, request), remaining)
            except TimeoutError as exc:
                last_error = exc
                continue
            except kafka_errors.KafkaError as exc:
                if not exc.retriable:
                    raise
                last_error = exc
                continue
            code = response.error_code
            if code == 0:
                return ProducerId(response.producer_id, response.producer_epoch)
            error = _broker_error(code)
            if code not in _RETRIABLE_CODES or (node_id is not None and code in _MOVED_CODES):
                raise error  # a coordinator that moved is the caller's to look up again
            last_error = error
        if loop.time() + retry_backoff >= deadline:
            raise last_error or kafka_errors.KafkaConnectionError("no broker to ask")
        await asyncio.sleep(retry_backoff)


def _broker_ids(client: Any) -> list[int | None]:
    brokers = sorted(client.cluster.brokers(), key=lambda broker: broker.nodeId)
    return [broker.nodeId for broker in brokers] or [None]


def next_sequence(sequence: int, count: int) -> int:
    """The sequence after a batch of ``count`` records from ``sequence`` (int32, wrapping)."""
    return (sequence + count) % _SEQUENCE_LIMIT


def stamp(
    data: bytes | bytearray, producer: ProducerId, sequence: int, *, transactional: bool = False
) -> bytes:
    """The 61-byte header of the encoded record batch ``data`` stamped with ``producer``, the
    base ``sequence`` and the transactional bit, its CRC made anew over the stamped header and
    the unchanged records section (``data[61:]``, which goes out as it is)."""
    header = bytearray(data[:_HEADER])
    (attributes,) = _ATTRIBUTES.unpack_from(header, _ATTRIBUTES_AT)
    if transactional:
        attributes |= TRANSACTIONAL_BIT
    else:
        attributes &= ~TRANSACTIONAL_BIT
    _ATTRIBUTES.pack_into(header, _ATTRIBUTES_AT, attributes)
    _PRODUCER.pack_into(header, _PRODUCER_AT, producer.id, producer.epoch, sequence)
    _CRC.pack_into(header, _CRC_AT, _crc_of(header, data))
    return bytes(header)


def _crc_of(header: bytearray, data: bytes | bytearray) -> int:
    return wire.ACTIVE.crc32c_of(memoryview(header)[_ATTRIBUTES_AT:], memoryview(data)[_HEADER:])
