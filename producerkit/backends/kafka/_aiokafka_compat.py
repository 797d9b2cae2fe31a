"""Every access to aiokafka's internals, in one module, behind one probe.

The Kafka backend has two ways to move a sealed batch, chosen once per connection by
:func:`choose_path` after aiokafka's client has started:

- **fast**: producerkit frames its own Produce requests (versions 3 to 8, the non-flexible ones,
  and, for a transaction of KIP-890's transactions v2, version 12) around its encoded batches and
  queues them on aiokafka's broker connections as aiokafka queues its own (:class:`ProduceWire`).
  aiokafka still connects, authenticates, negotiates versions, keeps metadata and reads the
  responses.
- **public**: each batch is filled through aiokafka's public batch API (``create_batch()``,
  ``BatchBuilder.append()``) and handed to ``send_batch()``, which owns retries and ordering.

The probe checks every internal the fast path reads, on a real connection, and the Produce version
aiokafka would negotiate with the broker; if anything is not as expected, or
``PRODUCERKIT_CLIENT_PATH=public`` is set, the public path is used (see ``_clients``).
Nothing outside this module reads a private name of aiokafka.
"""

from __future__ import annotations

import asyncio
import collections
import struct
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Final

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors

from producerkit._record import Record
from producerkit.backends import _clients

try:  # aiokafka modules the fast path needs; a release may move them
    from aiokafka.client import ConnectionGroup
    from aiokafka.conn import CloseReason
    from aiokafka.protocol.admin import ApiVersionRequest
    from aiokafka.protocol.api import RequestStruct, Response
    from aiokafka.protocol.produce import ProduceRequest
    from aiokafka.protocol.types import (
        CompactArray,
        CompactString,
        Int16,
        Int32,
        Int64,
        Schema,
        TaggedFields,
    )
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    _MISSING: str | None = None
except ImportError as exc:  # pragma: no cover - depends on the installed aiokafka
    _MISSING = f"{exc.name or 'a module'} cannot be imported ({exc})"

#: Produce request versions whose framing :class:`ProduceWire` writes (v9 on are flexible).
PRODUCE_VERSIONS: Final = range(3, 9)
#: The Produce version of a transaction of KIP-890's transactions v2: the same fields as v9-v11
#: (flexible), and the broker adds each partition it writes to the open transaction itself.
IMPLICIT_ADD_VERSION: Final = 12
#: An empty set of tagged fields (a flexible version's structures each end with one).
_NO_TAGS: Final = b"\x00"

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_REQUEST_HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_PARTITION_DATA = struct.Struct(">ii")  # partition, record batch size
#: Shared by every record without headers: aiokafka's encoder only reads it (and wants a list).
_NO_HEADERS: list[tuple[str, bytes | None]] = []


def _uvarint(value: int) -> bytes:
    """An unsigned varint (a flexible version's lengths, plus one: 0 is null)."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


if _MISSING is None:

    class _ProduceResponse_v12(Response):  # type: ignore[misc]
        """Produce v12's response: what aiokafka's reader decodes the answer to a v12 request
        with (the field names of aiokafka's own Produce responses, for
        :func:`partition_results`)."""

        API_KEY = 0
        API_VERSION = 12
        SCHEMA = Schema(
            (
                "topics",
                CompactArray(
                    ("topic", CompactString("utf-8")),
                    (
                        "partitions",
                        CompactArray(
                            ("partition", Int32),
                            ("error_code", Int16),
                            ("offset", Int64),
                            ("timestamp", Int64),
                            ("log_start_offset", Int64),
                            (
                                "record_errors",
                                CompactArray(
                                    ("batch_index", Int32),
                                    ("batch_index_error_message", CompactString("utf-8")),
                                    ("tags", TaggedFields),
                                ),
                            ),
                            ("error_message", CompactString("utf-8")),
                            ("tags", TaggedFields),
                        ),
                    ),
                    ("tags", TaggedFields),
                ),
            ),
            ("throttle_time_ms", Int32),
            ("tags", TaggedFields),
        )

    class _ProduceRequest_v12(RequestStruct):  # type: ignore[misc]
        """Produce v12, for aiokafka's reader only (its header version and response type):
        :class:`ProduceWire` writes the bytes itself."""

        API_KEY = 0
        API_VERSION = 12
        FLEXIBLE_VERSION = True
        RESPONSE_TYPE = _ProduceResponse_v12
        SCHEMA = Schema(
            ("transactional_id", CompactString("utf-8")),
            ("acks", Int16),
            ("timeout_ms", Int32),
            ("topics", CompactArray(("topic", CompactString("utf-8")), ("tags", TaggedFields))),
            ("tags", TaggedFields),
        )


#: A Produce request unanswered past its timeout is waited for this much longer at most (or
#: for the request timeout once more, where that is longer).
OVERDUE_LIMIT: Final = 10.0
#: While a request is overdue, its connection is asked for an ApiVersions answer this often.
OVERDUE_PROBE_INTERVAL: Final = 1.0


async def choose_path(producer: AIOKafkaProducer, acks: int) -> tuple[str, str]:
    """``(FAST or PUBLIC, why)`` for a started producer: probes a live broker connection."""
    version = _clients.check_client("aiokafka")
    if _clients.forced_path() == _clients.PUBLIC:
        problem: str | None = "not probed"
    elif _MISSING is not None:
        problem = _MISSING
    else:
        try:
            problem = _probe_batch_builder(producer) or await _probe(producer.client, acks)
        except Exception as exc:  # a probe that cannot run says the internals are unexpected
            problem = f"probing its internals raised {type(exc).__name__}: {exc}"
    return _clients.resolve_path("aiokafka", version, problem)


#: Attempts at a connection to probe (aiokafka's own connect timeout bounds each).
_PROBE_ATTEMPTS: Final = 3


def _probe_batch_builder(producer: AIOKafkaProducer) -> str | None:
    """What :func:`fill_builder`'s fast fill cannot use on this client's BatchBuilder."""
    builder = producer.create_batch()
    inner = getattr(builder, "_builder", None)
    if not callable(getattr(inner, "append", None)):
        return "BatchBuilder._builder.append is missing or not as expected"
    if type(getattr(builder, "_relative_offset", None)) is not int:
        return "BatchBuilder._relative_offset is missing or not as expected"
    return None


async def _probe(client: Any, acks: int) -> str | None:
    """What the fast path cannot use on this client, or None if everything is as expected."""
    brokers = sorted(client.cluster.brokers(), key=lambda broker: broker.nodeId)
    if not brokers:
        return "no broker in the cluster metadata"
    node_id = brokers[0].nodeId
    conn: Any = None
    for _ in range(_PROBE_ATTEMPTS):
        conn = await client._get_conn(node_id)
        if conn is not None:
            break
    if conn is None:  # nothing was checked: nothing may be assumed
        return f"no connection to broker {node_id} could be opened to probe its internals"
    for name, check in (
        ("_requests", lambda value: isinstance(value, collections.deque)),
        ("_writer", lambda value: hasattr(value, "write")),
        ("_versions", lambda value: isinstance(value, dict)),
        ("_next_correlation_id", callable),
        ("connected", callable),
        ("close", callable),
    ):
        if not check(getattr(conn, name, None)):
            return f"AIOKafkaConnection.{name} is missing or not as expected"
    versions: dict[int, tuple[int, int]] = conn._versions
    conns = getattr(client, "_conns", None)
    if not isinstance(conns, dict) or conns.get((node_id, ConnectionGroup.DEFAULT)) is not conn:
        return "AIOKafkaClient._conns is not keyed by (node_id, ConnectionGroup.DEFAULT)"
    request = ProduceRequest(None, acks, 30000, []).prepare(versions)
    version = getattr(request, "API_VERSION", None)
    if version not in PRODUCE_VERSIONS or getattr(request, "FLEXIBLE_VERSION", False):
        return (
            f"it negotiates Produce v{version} with the broker; producerkit frames "
            f"v{PRODUCE_VERSIONS.start}-v{PRODUCE_VERSIONS.stop - 1}"
        )
    if not hasattr(request, "RESPONSE_TYPE"):
        return "a prepared ProduceRequest has no RESPONSE_TYPE"
    question = ApiVersionRequest().prepare(versions)
    if not callable(getattr(question, "build_request_header", None)) or not callable(
        getattr(question, "encode", None)
    ):
        return "a prepared ApiVersionRequest cannot build its header or encode itself"
    return None


class ProduceWire:
    """The fast path: Produce requests framed by producerkit on aiokafka's connections.

    aiokafka's own encoder joins every batch into the request, the header onto that and the size
    onto that: three copies of each batch per request. Here the small framing is written, then
    each batch buffer as it is. The request is queued on the connection like aiokafka's own, so
    aiokafka's reader matches the response to it by correlation id.

    A request unanswered after the request timeout keeps its connection (unlike aiokafka, which
    closes it): the broker may still store it, and a batch sent meanwhile on a new connection
    could be stored before it, out of order. It is waited for until it is answered, the
    connection closes, or :data:`OVERDUE_LIMIT` more seconds (the request timeout, if longer)
    pass; then it fails with RequestTimedOutError and the connection is closed. Meanwhile an
    ApiVersions request is written on the connection every :data:`OVERDUE_PROBE_INTERVAL`: a
    broker answers a connection's requests in order, so when that answer comes first the Produce
    request never reached the broker; aiokafka's reader finds the correlation ids out of order
    and closes the connection, failing the request.
    """

    def __init__(
        self, producer: AIOKafkaProducer, acks: int, request_timeout_ms: int, client_id: str
    ) -> None:
        self._client = producer.client
        self._acks = acks
        self._request_timeout_ms = request_timeout_ms
        self._request_timeout = request_timeout_ms / 1000
        self._overdue_limit = max(OVERDUE_LIMIT, self._request_timeout)
        self._request = ProduceRequest(None, acks, request_timeout_ms, [])
        client_id_bytes = client_id.encode()
        self._client_id_field = _INT16.pack(len(client_id_bytes)) + client_id_bytes
        #: The requests' transactional_id field: null unless the wire is transactional.
        self._transactional_id_field = b"\xff\xff"
        #: With :meth:`transactional` ``(implicit_add=True)``: every request is Produce v12.
        self._implicit_add: Any = None
        self._loop = asyncio.get_running_loop()
        #: When each connection with an overdue request was last asked for ApiVersions.
        self._last_probe: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    def transactional(self, transactional_id: str, *, implicit_add: bool) -> None:
        """Write every request with ``transactional_id``. ``implicit_add``: as Produce v12
        (KIP-890's transactions v2: the broker adds each partition written to the open
        transaction itself, where no AddPartitionsToTxn did), else at the version aiokafka
        negotiates (v3-v8), which writes only to partitions added to the transaction before."""
        name = transactional_id.encode()
        if implicit_add:
            self._transactional_id_field = _uvarint(len(name) + 1) + name
            self._implicit_add = _ProduceRequest_v12(transactional_id, self._acks, 0, [], {})
        else:
            self._transactional_id_field = _INT16.pack(len(name)) + name
            self._implicit_add = None

    def ready_connection(self, node_id: int) -> Any | None:
        """aiokafka's open connection to ``node_id``, or None if it has none right now."""
        conn = self._client._conns.get((node_id, ConnectionGroup.DEFAULT))
        return conn if conn is not None and conn.connected() else None

    async def connect(self, node_id: int) -> Any | None:
        """aiokafka's connection to ``node_id``, opened if needed; None if it cannot connect."""
        return await self._client._get_conn(node_id)

    def _produce_request(self, conn: Any) -> tuple[Any, int]:
        """aiokafka's Produce request (which parses the response) for ``conn``, and the version
        to write. Raises UnsupportedVersionError where producerkit cannot frame what the broker
        takes."""
        request = self._implicit_add
        if request is None:
            request = self._request.prepare(conn._versions)
            version = request.API_VERSION
            if version not in PRODUCE_VERSIONS or getattr(request, "FLEXIBLE_VERSION", False):
                raise kafka_errors.UnsupportedVersionError(
                    f"the broker and aiokafka agreed on Produce v{version}; producerkit frames "
                    f"v{PRODUCE_VERSIONS.start}-v{PRODUCE_VERSIONS.stop - 1}"
                )
        else:
            version = IMPLICIT_ADD_VERSION
            speaks = conn._versions.get(0)
            if speaks is None or not speaks[0] <= version <= speaks[1]:
                raise kafka_errors.UnsupportedVersionError(
                    f"the broker does not take Produce v{version} (its range: {speaks}), which "
                    "a transaction of transactions v2 is written with"
                )
        return request, version

    def _frame(
        self,
        version: int,
        flexible: bool,
        correlation_id: int,
        batches: Sequence[tuple[str, int, bytes | None, bytes | bytearray]],
    ) -> list[bytes | bytearray | memoryview]:
        """The Produce request's bytes after its size, in parts (the batches not copied)."""
        by_topic: dict[str, list[tuple[int, bytes | None, bytes | bytearray]]] = {}
        for topic, partition, head, data in batches:
            by_topic.setdefault(topic, []).append((partition, head, data))
        # Flexible versions: the header ends in tagged fields, lengths are unsigned varints of
        # the length plus one, and each structure (partition, topic, request) ends in tags.
        framing = [_REQUEST_HEADER.pack(0, version, correlation_id), self._client_id_field]
        if flexible:
            framing.append(_NO_TAGS)
        framing += (
            self._transactional_id_field,
            _INT16.pack(self._acks),
            _INT32.pack(self._request_timeout_ms),
            _uvarint(len(by_topic) + 1) if flexible else _INT32.pack(len(by_topic)),
        )
        parts: list[bytes | bytearray | memoryview] = []
        for topic, partitions in by_topic.items():
            name = topic.encode()
            if flexible:
                framing += (_uvarint(len(name) + 1), name, _uvarint(len(partitions) + 1))
            else:
                framing += (_INT16.pack(len(name)), name, _INT32.pack(len(partitions)))
            for partition, head, data in partitions:
                if flexible:
                    framing += (_INT32.pack(partition), _uvarint(len(data) + 1))
                else:
                    framing.append(_PARTITION_DATA.pack(partition, len(data)))
                if head is None:
                    parts.append(b"".join(framing))
                    parts.append(data)
                else:
                    framing.append(head)
                    parts.append(b"".join(framing))
                    parts.append(memoryview(data)[len(head) :])
                framing = [_NO_TAGS] if flexible else []
            if flexible:
                framing.append(_NO_TAGS)
        if flexible:
            framing.append(_NO_TAGS)
            parts.append(b"".join(framing))
        return parts

    def write(
        self, conn: Any, batches: Sequence[tuple[str, int, bytes | None, bytes | bytearray]]
    ) -> asyncio.Future[Any] | None:
        """Write one Produce request carrying ``(topic, partition, head, batch)`` items (each
        partition once): ``head``, where given, is the batch's 61-byte header stamped anew
        (``idempotence.stamp``), written in place of the batch's own. Returns the future of its
        response (failed with RequestTimedOutError once it is given up on, see the class), or
        None with ``acks=0``, where no response comes.

        Raises KafkaConnectionError (retriable) if the connection has closed, and whatever
        else goes wrong before anything was written.
        """
        request, version = self._produce_request(conn)
        writer = conn._writer
        if _closing(conn):
            raise kafka_errors.KafkaConnectionError("the connection closed")
        correlation_id = conn._next_correlation_id()
        parts = self._frame(version, request.FLEXIBLE_VERSION, correlation_id, batches)
        writer.write(_INT32.pack(sum(map(len, parts))))
        for part in parts:
            # A memoryview: if the socket takes part of it, asyncio keeps the rest without a copy.
            writer.write(memoryview(part))
        if self._acks == 0:
            return None
        response: asyncio.Future[Any] = self._loop.create_future()
        conn._requests.append((correlation_id, request, response))
        timer = self._loop.call_later(self._request_timeout, self._overdue, conn, response, None)
        response.add_done_callback(lambda _: timer.cancel())
        return response

    def _overdue(self, conn: Any, response: asyncio.Future[Any], since: float | None) -> None:
        """The request on ``conn`` is overdue (``since``: when it became so, None the first
        time): probe the connection, or give up on it (see the class)."""
        if response.done():
            return
        now = self._loop.time()
        if since is None:
            since = now
        elif now - since >= self._overdue_limit:
            response.set_exception(kafka_errors.RequestTimedOutError())
            conn.close(reason=CloseReason.CONNECTION_TIMEOUT)
            return
        if now - self._last_probe.get(conn, -OVERDUE_PROBE_INTERVAL) >= OVERDUE_PROBE_INTERVAL:
            self._last_probe[conn] = now
            self._write_probe(conn)
        timer = self._loop.call_later(OVERDUE_PROBE_INTERVAL, self._overdue, conn, response, since)
        response.add_done_callback(lambda _: timer.cancel())

    def _write_probe(self, conn: Any) -> None:
        """An ApiVersions request on ``conn``, through aiokafka's own ``send``; its answer (or
        the connection's end) is all it is for. Nothing on a connection that is closing (uvloop's
        transport raises at a write then, asyncio's drops it)."""
        if _closing(conn):
            return  # closed: the overdue request fails with the connection
        try:
            answer = conn.send(ApiVersionRequest())
        except (kafka_errors.KafkaConnectionError, RuntimeError, OSError):
            return  # as above
        asyncio.ensure_future(answer).add_done_callback(_ignore_outcome)


def partition_results(response: Any) -> dict[tuple[str, int], tuple[int, int, int]]:
    """A Produce response as ``{(topic, partition): (error_code, base_offset,
    log_append_time)}``; log_append_time is -1 where the topic keeps CreateTime."""
    return {
        (topic, info[0]): (info[1], info[2], info[3] if len(info) > 3 else -1)
        for topic, partitions, *_ in response.topics
        for info in partitions
    }


def _closing(conn: Any) -> bool:
    """Whether aiokafka's connection ``conn`` can take no more writes (closed, or closing)."""
    writer = conn._writer
    return writer is None or bool(writer.transport.is_closing())


def _ignore_outcome(answer: asyncio.Future[Any]) -> None:
    if not answer.cancelled():
        answer.exception()  # retrieved: a probe's failure (or timeout) is its connection's


# ---------------------------------------------------------------------- batches through aiokafka


def fill_builder(
    builder: Any, records: list[Record], start: int, time_shift: float, *, fast: bool
) -> int:
    """Append ``records[start:]`` to an aiokafka ``BatchBuilder`` from ``create_batch()`` until
    it is full, close it, and return where it stopped (it always takes the first record).

    ``fast`` appends to the record-batch builder inside it directly (no serializer calls, one
    Python call less per record); otherwise through ``BatchBuilder.append()``, the public API.
    """
    if fast:
        end = append_records(builder._builder.append, records, start, time_shift)
        builder._relative_offset = end - start  # what BatchBuilder.append would have counted
        if builder.record_count() != end - start:  # the probe checked these; never assume
            raise kafka_errors.KafkaError(
                f"aiokafka's BatchBuilder holds {builder.record_count()} records after "
                f"{end - start} were appended"
            )
    else:

        def append(offset: int, timestamp: int, key: Any, value: Any, headers: Any) -> Any:
            return builder.append(timestamp=timestamp, key=key, value=value, headers=headers)

        end = append_records(append, records, start, time_shift)
    builder.close()
    return end


def append_records(
    append: Callable[
        [int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]], object
    ],
    records: list[Record],
    start: int,
    time_shift: float,
) -> int:
    """Append ``records[start:]`` with a record-batch builder's ``append(offset, timestamp,
    key, value, headers)`` until it returns None (full); return where it stopped (a builder
    always takes the first record). A record's CreateTime is its TIMESTAMP where set, else its
    deadline plus ``time_shift``, as the C encoder does."""
    for end in range(start, len(records)):
        record = records[end]
        headers: list[tuple[str, bytes | None]] = (
            list(record.headers) if record.headers else _NO_HEADERS
        )
        timestamp = record.timestamp
        if timestamp is None:
            timestamp = int((record.deadline + time_shift) * 1000 // 1)
        if append(end - start, timestamp, record.key, record.value, headers) is None:
            return end
    return len(records)


def new_record_batch_builder(compression: int, max_bytes: int) -> Any:
    """aiokafka's builder of one v2 record batch (no producer id): the fast path's fallback
    encoder, and the one that compresses."""
    return DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=max_bytes,
    )


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) by aiokafka's implementation: the fallback of ``_cwire.crc32c``."""
    from aiokafka.record.util import calc_crc32c

    return int(calc_crc32c(data))
