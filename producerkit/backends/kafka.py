"""``kafka://host:port[,host:port]`` on aiokafka, batching with the protocol's own record batches.

Instead of one ``send()`` (and one future) per message, records are appended to an open list
per partition; a full list is encoded as record batches in one call (``_record_batch``: C where
it was built, else aiokafka's builder). The backend writes its own Produce requests, one per
leader carrying one batch per partition, on aiokafka's connections, and acks every record of a
batch from the partition's result: offset ``base_offset + index``.

Batching needs no linger: a partition's batch stays open while its previous batch is with the
broker (one in flight per partition, which also keeps per-key order), so batches grow exactly as
large as the broker's pace requires. With ``linger_ms=0`` (the default, for latency) an idle
partition ships its batch at the end of the current event-loop iteration. Retriable errors
(connection lost, leader moved, request timed out) retry the batch after ``retry_backoff_ms``
until ``request_timeout_ms`` after it was sealed, as aiokafka does; then its records fail.
"""

from __future__ import annotations

import asyncio
import functools
import re
import ssl
import struct
import time
from collections import deque
from collections.abc import Awaitable, Coroutine, Mapping
from typing import Any, ClassVar

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.client import ConnectionGroup
from aiokafka.conn import CloseReason
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.protocol.produce import ProduceRequest

from producerkit import _fast, _security
from producerkit._types import PARTITION, TOPIC, Record
from producerkit.backends import _record_batch
from producerkit.backends.base import Backend
from producerkit.errors import (
    AuthenticationError,
    AuthorizationError,
    BrokerUnavailable,
    ConfigurationError,
    DeliveryError,
    MessageError,
    MessageTooLarge,
    ProducerError,
    ProduceTimeout,
    TLSError,
)

_monotonic = time.monotonic

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

#: aiokafka producer settings accepted as options, with their types. ``acks`` is special-cased.
_AIOKAFKA_OPTIONS: dict[str, type] = {
    "acks": str,  # 0, 1, -1 or all; converted in check_options
    "client_id": str,
    "compression_type": str,
    "connections_max_idle_ms": int,
    "enable_idempotence": bool,
    "linger_ms": int,
    "max_batch_size": int,
    "max_in_flight": int,
    "max_request_size": int,
    "metadata_max_age_ms": int,
    "request_timeout_ms": int,
    "retry_backoff_ms": int,
    "send_backoff_ms": int,
}

#: Options for throughput over latency (``preset="throughput"``); see docs/tuning.md.
THROUGHPUT_PRESET: dict[str, Any] = {"linger_ms": 5}
#: Batches per partition in flight with ``preset="throughput"``: the Java client's default. As
#: there (without idempotence) and in librdkafka, a retried batch may then land after a later one.
THROUGHPUT_MAX_IN_FLIGHT = 5
DEFAULT_MAX_BATCH_SIZE = 512 * 1024


class _Batch:
    """A sealed record batch of one partition, with the records it carries in offset order.

    ``expires`` is aiokafka's delivery timeout: a retriable error retries the batch only until
    ``request_timeout_ms`` after it was sealed; the records' own deadlines are the window's.
    """

    __slots__ = ("data", "expires", "number", "queue", "records", "sent")

    def __init__(
        self,
        queue: _PartitionQueue,
        number: int,
        data: bytes | bytearray | BatchBuilder,
        records: list[Record],
        expires: float,
    ) -> None:
        self.queue = queue
        self.number = number  # order within the partition: a retry goes back in its place
        self.data = data  # the encoded batch (an aiokafka builder for the idempotent producer)
        self.records = records
        self.expires = expires
        self.sent = False


class _PartitionQueue:
    """One partition: the open records being gathered, and sealed batches waiting their turn.

    ``in_flight`` counts this partition's batches in requests; ``backoff`` is set while a retry
    waits. Capping batches in flight lets the open list grow as large as the broker's pace
    requires, and with ``max_in_flight=1`` keeps per-key order even across retries.
    """

    __slots__ = ("backoff", "full", "in_flight", "key", "partition", "records", "sealed", "topic")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.key = TopicPartition(topic, partition)
        self.records: list[Record] = []
        self.full: deque[_Batch] = deque()
        self.in_flight = 0
        self.backoff = False
        self.sealed = 0

    def requeue(self, batch: _Batch) -> None:
        """Put a batch back for a retry, ahead of every batch sealed after it."""
        index = 0
        for index, waiting in enumerate(self.full):  # noqa: B007 - the index is the result
            if waiting.number > batch.number:
                break
        else:
            index = len(self.full)
        self.full.insert(index, batch)


_COMPRESSION_CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}

#: Records gathered before the first seal measures their size (then it adapts to fill a batch).
_INITIAL_BATCH_RECORDS = 256


class _Gathering:
    """What send() reads besides the queue: whether a ship is due, and how many records fill a
    batch. Where it was built, ``producerkit._speedups.Gather`` takes its place: the same two
    attributes, and a C send() for when a record only has to be appended."""

    __slots__ = ("batch_records", "ship_due")

    def __init__(self) -> None:
        self.batch_records = 1
        self.ship_due = False


_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_REQUEST_HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_PARTITION_DATA = struct.Struct(">ii")  # partition, record batch size


class KafkaBackend(Backend):
    DEFAULT_KEYLESS: ClassVar[str] = "sticky"
    OPTIONS: ClassVar[Mapping[str, type]] = {
        **_AIOKAFKA_OPTIONS,
        **_security.OPTIONS,
        "preset": str,
    }

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        # Security options are checked apart, so that no message can print a password.
        others, security = _security.check_options("kafka", options)
        acks_given = others.get("acks")
        if type(acks_given) is int:  # acks=1 as a keyword, "1" from a URL: both mean the same
            others = {**others, "acks": str(acks_given)}
        checked = super().check_options(others)
        checked.update(security)
        if checked.get("preset") not in (None, "latency", "throughput"):
            raise ConfigurationError(
                f"unknown preset {checked['preset']!r}: use 'latency' or 'throughput'"
            )
        if checked.get("max_in_flight", 1) < 1:
            raise ConfigurationError(
                f"max_in_flight must be at least 1, got {checked['max_in_flight']}"
            )
        acks = checked.get("acks")
        if acks is not None:
            if acks not in ("0", "1", "-1", "all"):
                raise ConfigurationError(f"acks must be 0, 1, -1 or 'all', got {acks!r}")
            checked["acks"] = acks if acks == "all" else int(acks)
        return checked

    async def connect(self) -> None:
        settings = self._client_settings()
        self.max_message_size = settings.get("max_request_size", 1024 * 1024)
        self._producer = AIOKafkaProducer(bootstrap_servers=self.url.server_strings(), **settings)
        self._client = self._producer.client
        self._linger = settings["linger_ms"] / 1000
        self._acks = -1 if settings["acks"] == "all" else settings["acks"]
        self._request_timeout_ms = settings["request_timeout_ms"]
        self._request_timeout = self._request_timeout_ms / 1000
        self._retry_backoff = settings.get("retry_backoff_ms", 100) / 1000
        # The idempotent producer needs aiokafka's sender (producer id, sequence numbers).
        self._through_aiokafka = bool(settings["enable_idempotence"])
        throughput = self.options.get("preset") == "throughput"
        self._max_in_flight = (
            1
            if self._through_aiokafka
            else self.options.get("max_in_flight", THROUGHPUT_MAX_IN_FLIGHT if throughput else 1)
        )
        self._max_batch_size = settings["max_batch_size"]
        compression = _COMPRESSION_CODECS.get(settings.get("compression_type") or "", 0)
        self._encode: _record_batch.Encoder = (
            functools.partial(_record_batch.encode_batch_with_aiokafka, compression=compression)
            if compression
            else _record_batch.encode_batch
        )
        client_id = (settings.get("client_id") or "producerkit").encode()
        self._client_id_field = _INT16.pack(len(client_id)) + client_id
        self._produce_request = ProduceRequest(None, self._acks, self._request_timeout_ms, [])
        self._queues: dict[str, dict[int, _PartitionQueue]] = {}
        if _fast.Gather is not None:
            # The C send appends when that is all there is to do, and calls this class's send
            # for everything else. The producer takes each connection's send after connect().
            gathering = _fast.Gather(self._queues, self.send)
            self.send = gathering.send  # type: ignore[method-assign]
        else:
            gathering = _Gathering()
        gathering.batch_records = _INITIAL_BATCH_RECORDS
        gathering.ship_due = False  # a ship is due: soon, or when the linger timer fires
        self._gathering: _Gathering = gathering  # or the C Gather: the same attributes
        self._ship_soon = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._partition_counts: dict[str, int] = {}
        self._tasks: set[asyncio.Future[None]] = set()
        self._loop = asyncio.get_running_loop()
        try:
            if "ssl_context" in settings:
                await _probe_tls(self.url.servers[0], settings["ssl_context"], self.timeout)
            await self._producer.start()
        except BaseException as exc:
            await self._producer.stop()
            if isinstance(exc, KeyError) and "sasl_mechanism" in settings:
                # aiokafka's SCRAM reads the server's final message without checking for an
                # error ("e=unknown-user"), so a refused login surfaces as KeyError('v').
                raise AuthenticationError(
                    f"{settings['sasl_mechanism']} authentication failed for user "
                    f"{settings['sasl_plain_username']!r} (unknown user or wrong password)"
                ) from exc
            if isinstance(exc, Exception):
                raise _translate(exc) from exc
            raise
        self._client.cluster.add_listener(self._metadata_updated)

    def _client_settings(self) -> dict[str, Any]:
        # max_batch_size: batches here grow only while the partition's previous batch is still
        # with the broker (see the module docstring), so a large ceiling costs no latency and saves
        # a request per 16 KiB (aiokafka's default) under load.
        settings: dict[str, Any] = {
            "linger_ms": 0,
            "acks": 1,
            "enable_idempotence": False,
            "max_batch_size": DEFAULT_MAX_BATCH_SIZE,
        }
        options = {name: v for name, v in self.options.items() if name not in _security.OPTIONS}
        preset = options.pop("preset", None)
        options.pop("max_in_flight", None)  # producerkit's own sender setting, not aiokafka's
        if preset == "throughput":
            settings.update(THROUGHPUT_PRESET)
        settings.update(options)
        if settings["enable_idempotence"] and "acks" not in options:
            settings["acks"] = "all"  # idempotence requires it; the Java client defaults the same
        settings.update(_security.kafka_settings(self.options))
        settings.setdefault("request_timeout_ms", int(self.timeout * 1000))
        return settings

    @classmethod
    def check_topic(cls, topic: str) -> None:
        if not _TOPIC.match(topic) or topic in (".", ".."):
            raise MessageError(
                f"invalid Kafka topic {topic!r}: use 1 to 249 of the characters a-z A-Z 0-9 . _ -"
            )

    async def prepare_topic(self, topic: str) -> int | None:
        try:
            partitions = await self._producer.partitions_for(topic)
        except Exception as exc:
            raise _translate(exc) from exc
        self._partition_counts[topic] = len(partitions)
        return len(partitions)

    def _metadata_updated(self, cluster: Any) -> None:
        for topic, known in list(self._partition_counts.items()):
            partitions = cluster.partitions_for_topic(topic)
            if partitions is not None and len(partitions) != known:
                self._partition_counts[topic] = len(partitions)
                self.sink.topic_changed(topic)

    @classmethod
    def translate_error(cls, exc: BaseException) -> ProducerError:
        return _translate(exc)

    # ------------------------------------------------------------------ the hot path

    def send(self, record: Record) -> Awaitable[None] | None:
        partitions = self._queues.get(record[TOPIC])
        if partitions is None:
            partitions = self._queues[record[TOPIC]] = {}
        queue = partitions.get(record[PARTITION])  # type: ignore[arg-type]
        if queue is None:
            queue = partitions[record[PARTITION]] = _PartitionQueue(  # type: ignore[index]
                record[TOPIC],
                record[PARTITION],  # type: ignore[arg-type]
            )
        records = queue.records
        records.append(record)
        gathering = self._gathering
        if len(records) >= gathering.batch_records:
            # Enough for a full batch: encode it now and let the loop write it (and read acks)
            # at once, not only when the window is full, so the broker works while the caller
            # keeps producing.
            self._seal(queue)
            self._schedule_ship()
            return asyncio.sleep(0)
        if not gathering.ship_due and queue.in_flight < self._max_in_flight:
            self._schedule_ship(self._linger)
        return None

    def _seal(self, queue: _PartitionQueue) -> None:
        """Encode the partition's open records as batches of at most ``max_batch_size``."""
        records, queue.records = queue.records, []
        now = _monotonic()
        expires = now + self._request_timeout
        # The records' deadlines are monotonic() + timeout at produce time: this shift turns
        # them back into wall-clock CreateTimes.
        time_shift = time.time() - now - self.timeout
        start = 0
        while start < len(records):
            if self._through_aiokafka:
                data, end = self._fill_aiokafka_batch(records, start, time_shift)
            else:
                data, end = self._encode(records, start, self._max_batch_size, time_shift)
            queue.sealed += 1
            batch_records = records if start == 0 and end == len(records) else records[start:end]
            queue.full.append(_Batch(queue, queue.sealed, data, batch_records, expires))
            if not self._through_aiokafka:
                # Gather as many records as fill a batch at the sizes seen last.
                self._gathering.batch_records = max(
                    1, (end - start) * self._max_batch_size // len(data)
                )
            start = end

    def _fill_aiokafka_batch(
        self, records: list[Record], start: int, time_shift: float
    ) -> tuple[BatchBuilder, int]:
        """The idempotent producer's batch: aiokafka's sender numbers it when it sends it."""
        builder = self._producer.create_batch()
        end = _record_batch.append_records(builder._builder, records, start, time_shift)
        builder._relative_offset = end - start  # what BatchBuilder.append would have counted
        builder.close()
        return builder, end

    # ------------------------------------------------------------------ the sender
    #
    # producerkit writes its own Produce requests on aiokafka's connection to each leader:
    # aiokafka's encoder joins every batch into the request, the header onto that, and the size
    # onto that, three fresh half-megabyte copies per request, which cost more than the whole
    # rest of the Kafka path (docs/performance.md). Here the small framing is written, then each
    # batch buffer as it is. aiokafka still owns connecting, SASL/TLS, version negotiation,
    # metadata and reading responses (the request is queued on its connection like its own).

    def _schedule_ship(self, delay: float = 0.0) -> None:
        """Ship at the end of this loop iteration, or after ``delay`` (the linger) if nothing is
        due sooner. A full batch or a freed slot ships now even while a linger runs."""
        if self._closing:
            return
        if not delay:
            if not self._ship_soon:
                self._ship_soon = self._gathering.ship_due = True
                self._loop.call_soon(self._ship_all)
        elif not self._gathering.ship_due:
            self._gathering.ship_due = True
            self._linger_timer = self._loop.call_later(delay, self._ship_all)

    def _ship_all(self) -> None:
        """Send the next batch of every partition that has one and room in flight
        (``max_in_flight``), in one request per leader."""
        self._ship_soon = self._gathering.ship_due = False
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if self._closing:
            return
        by_leader: dict[int, list[_Batch]] = {}
        for partitions in self._queues.values():
            for queue in partitions.values():
                # One batch per partition per request: a request may name a partition once.
                if (
                    queue.in_flight < self._max_in_flight
                    and not queue.backoff
                    and (queue.records or queue.full)
                ):
                    self._ship_next(queue, by_leader)
        for leader, batches in by_leader.items():
            conn = self._client._conns.get((leader, ConnectionGroup.DEFAULT))
            if conn is not None and conn.connected():
                self._write_request(conn, batches)
            else:
                self._spawn(self._connect_then_write(leader, batches))

    def _ship_next(self, queue: _PartitionQueue, by_leader: dict[int, list[_Batch]]) -> None:
        if not queue.full:
            self._seal(queue)
        batch = queue.full.popleft()
        queue.in_flight += 1
        if not batch.sent:
            batch.sent = True
            self.sink.batch_sent(queue.topic, queue.partition)
        if self._through_aiokafka:
            self._spawn(self._send_through_aiokafka(batch))
            return
        leader = self._client.cluster.leader_for_partition(queue.key)
        if leader is None or leader < 0:
            self._client.force_metadata_update()
            self._retry_or_fail(batch, kafka_errors.LeaderNotAvailableError())
            return
        by_leader.setdefault(leader, []).append(batch)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect_then_write(self, leader: int, batches: list[_Batch]) -> None:
        try:
            conn = await self._client._get_conn(leader)  # None if it cannot connect (logs why)
        except Exception as exc:  # anything else: the batches still end, retried or failed
            for batch in batches:
                self._retry_or_fail(batch, exc)
            return
        if conn is None or self._closing:
            error = kafka_errors.NodeNotReadyError(f"cannot connect to broker node {leader}")
            for batch in batches:
                self._retry_or_fail(batch, error)
            return
        self._write_request(conn, batches)

    def _write_request(self, conn: Any, batches: list[_Batch]) -> None:
        """Frame one Produce request (v3+) around ``batches`` and write it without joining them."""
        try:
            request = self._produce_request.prepare(conn._versions)
        except Exception as exc:  # a broker without Produce v3+: each record is told why
            for batch in batches:
                self._retry_or_fail(batch, exc)
            return
        correlation_id = conn._next_correlation_id()
        by_topic: dict[str, list[_Batch]] = {}
        for batch in batches:
            by_topic.setdefault(batch.queue.topic, []).append(batch)
        framing = [
            _REQUEST_HEADER.pack(0, request.API_VERSION, correlation_id),
            self._client_id_field,
            b"\xff\xff",  # transactional_id: null
            _INT16.pack(self._acks),
            _INT32.pack(self._request_timeout_ms),
            _INT32.pack(len(by_topic)),
        ]
        parts: list[bytes | bytearray] = []
        for topic, topic_batches in by_topic.items():
            name = topic.encode()
            framing += (_INT16.pack(len(name)), name, _INT32.pack(len(topic_batches)))
            for batch in topic_batches:
                assert not isinstance(batch.data, BatchBuilder)
                framing.append(_PARTITION_DATA.pack(batch.queue.partition, len(batch.data)))
                parts.append(b"".join(framing))
                parts.append(batch.data)
                framing = []
        writer = conn._writer
        if writer is None:
            error = kafka_errors.KafkaConnectionError("the connection closed")
            for batch in batches:
                self._retry_or_fail(batch, error)
            return
        writer.write(_INT32.pack(sum(map(len, parts))))
        for part in parts:
            # A memoryview: if the socket takes part of it, asyncio keeps the rest without a copy.
            writer.write(memoryview(part))
        if self._acks == 0:  # no response will come: written is all there is
            for batch in batches:
                self._acked(batch, None)
            return
        response: asyncio.Future[Any] = self._loop.create_future()
        conn._requests.append((correlation_id, request, response))
        timer = self._loop.call_later(self._request_timeout, _time_out_request, conn, response)
        response.add_done_callback(functools.partial(self._request_done, batches, timer))

    def _request_done(
        self, batches: list[_Batch], timer: asyncio.TimerHandle, response: asyncio.Future[Any]
    ) -> None:
        timer.cancel()
        if response.cancelled():
            error: BaseException | None = kafka_errors.KafkaConnectionError("request cancelled")
        else:
            error = response.exception()
        if error is not None:
            if getattr(error, "invalid_metadata", False):
                self._client.force_metadata_update()
            for batch in batches:
                self._retry_or_fail(batch, error)
        else:
            results = {
                (topic, info[0]): (info[1], info[2])  # partition: (error_code, base_offset)
                for topic, partitions in response.result().topics
                for info in partitions
            }
            for batch in batches:
                queue = batch.queue
                code, offset = results.get((queue.topic, queue.partition), (None, None))
                if code == 0:
                    self._acked(batch, offset)
                    continue
                if code is None:
                    self._retry_or_fail(
                        batch, DeliveryError(f"the broker did not answer for {queue.key}")
                    )
                    continue
                broker_error = kafka_errors.for_code(code)()
                if broker_error.invalid_metadata:
                    self._client.force_metadata_update()
                self._retry_or_fail(batch, broker_error)
        self._schedule_ship()

    def _acked(self, batch: _Batch, offset: int | None) -> None:
        batch.queue.in_flight -= 1
        self.sink.acked_run(batch.records, offset)

    def _retry_or_fail(self, batch: _Batch, error: BaseException) -> None:
        """Retry a retriable error after the backoff while the batch has time; else fail it."""
        queue = batch.queue
        retriable = getattr(error, "retriable", False)
        if retriable and not self._closing and _monotonic() < batch.expires:
            queue.requeue(batch)
            queue.in_flight -= 1
            if not queue.backoff:
                queue.backoff = True
                self._loop.call_later(self._retry_backoff, self._retry_ready, queue)
            return
        queue.in_flight -= 1
        self._fail_all(batch.records, error)

    def _retry_ready(self, queue: _PartitionQueue) -> None:
        queue.backoff = False
        self._schedule_ship()

    async def _send_through_aiokafka(self, batch: _Batch) -> None:
        queue = batch.queue
        try:
            assert isinstance(batch.data, BatchBuilder)
            future = await self._producer.send_batch(
                batch.data, queue.topic, partition=queue.partition
            )
            result = await future
        except Exception as exc:
            queue.in_flight -= 1
            self._fail_all(batch.records, exc)
        else:
            self._acked(batch, result.offset)
        self._schedule_ship()

    def _fail_all(self, records: list[Record], exc: BaseException) -> None:
        error = _translate(exc)
        for record in records:
            self.sink.failed(record, error)

    def _all_queues(self) -> list[_PartitionQueue]:
        return [queue for partitions in self._queues.values() for queue in partitions.values()]

    async def flush(self) -> None:
        # Start shipping what is open now; acks (or deadlines) end each record, not this call.
        if any(queue.records or queue.full for queue in self._all_queues()):
            self._ship_all()

    async def close(self) -> None:
        self._closing = True
        linger_timer = getattr(self, "_linger_timer", None)  # None also if connect() failed
        if linger_timer is not None:
            linger_timer.cancel()
        for task in list(getattr(self, "_tasks", ())):
            task.cancel()
        for queue in self._all_queues() if hasattr(self, "_queues") else []:
            stranded = [record for batch in queue.full for record in batch.records]
            stranded += queue.records
            queue.full.clear()
            queue.records = []
            for record in stranded:
                self.sink.failed(
                    record, BrokerUnavailable("the connection closed before this message was sent")
                )
        await self._producer.stop()


def _time_out_request(conn: Any, response: asyncio.Future[Any]) -> None:
    """No response within request_timeout_ms: fail it, and drop the connection as aiokafka does
    (a late answer would arrive on a connection nobody trusts to be in sync)."""
    if not response.done():
        response.set_exception(kafka_errors.RequestTimedOutError())
        conn.close(reason=CloseReason.CONNECTION_TIMEOUT)


async def _probe_tls(server: tuple[str, int], context: ssl.SSLContext, timeout: float) -> None:
    """Handshake once with the first bootstrap server before aiokafka connects: aiokafka logs a
    TLS failure and reports only "Unable to bootstrap", and a plaintext listener may never
    answer a ClientHello. Unreachable servers are left to aiokafka's own error."""
    host, port = server
    # A handshake takes round trips, not seconds; a plaintext listener reads the ClientHello as
    # the start of a huge request and waits for the rest.
    patience = min(timeout / 2, 5.0)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), patience)
    except (OSError, TimeoutError):
        return
    try:
        await asyncio.wait_for(
            writer.start_tls(context, server_hostname=host.strip("[]")), patience
        )
    except TimeoutError as exc:
        raise TLSError(
            f"no TLS handshake from {host}:{port} within {patience}s: "
            "is TLS enabled on this listener?"
        ) from exc
    except (ssl.SSLError, OSError) as exc:
        raise TLSError(f"TLS handshake with {host}:{port} failed: {exc}") from exc
    finally:
        writer.transport.abort()


def _translate(exc: BaseException) -> ProducerError:
    """aiokafka's exceptions -> producerkit's, at this backend's edge."""
    if isinstance(exc, ProducerError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(
        exc, kafka_errors.MessageSizeTooLargeError | kafka_errors.RecordListTooLargeError
    ):
        return MessageTooLarge(text)
    if isinstance(
        exc,
        kafka_errors.TopicAuthorizationFailedError
        | kafka_errors.ClusterAuthorizationFailedError
        | kafka_errors.GroupAuthorizationFailedError,
    ):
        return AuthorizationError(text)
    if isinstance(
        exc, kafka_errors.AuthenticationFailedError | kafka_errors.UnsupportedSaslMechanismError
    ):
        return AuthenticationError(text)
    if isinstance(exc, kafka_errors.KafkaTimeoutError | kafka_errors.RequestTimedOutError):
        return ProduceTimeout(text)
    if isinstance(
        exc,
        kafka_errors.KafkaConnectionError
        | kafka_errors.NodeNotReadyError
        | kafka_errors.NotLeaderForPartitionError
        | kafka_errors.LeaderNotAvailableError
        | ConnectionError
        | OSError,
    ):
        return BrokerUnavailable(text)
    if isinstance(exc, kafka_errors.InvalidTopicError):
        return MessageError(text)
    return DeliveryError(text)
