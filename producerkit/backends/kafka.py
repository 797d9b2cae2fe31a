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
import logging
import re
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Coroutine, Mapping
from typing import Any, ClassVar

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka import errors as kafka_errors

from producerkit import _fast, _security
from producerkit._types import PARTITION, TOPIC, Record
from producerkit.backends import _aiokafka_compat, _clients, _record_batch
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

logger = logging.getLogger("producerkit.kafka")

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
        data: bytes | bytearray | Any,
        records: list[Record],
        expires: float,
    ) -> None:
        self.queue = queue
        self.number = number  # order within the partition: a retry goes back in its place
        self.data = data  # the encoded batch, or an aiokafka BatchBuilder (sent through aiokafka)
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
        _clients.check_client("aiokafka")
        settings = self._client_settings()
        self.max_message_size = settings.get("max_request_size", 1024 * 1024)
        self._producer = AIOKafkaProducer(bootstrap_servers=self.url.server_strings(), **settings)
        self._client = self._producer.client
        self._linger = settings["linger_ms"] / 1000
        self._acks = -1 if settings["acks"] == "all" else settings["acks"]
        self._request_timeout_ms = settings["request_timeout_ms"]
        self._request_timeout = self._request_timeout_ms / 1000
        self._retry_backoff = settings.get("retry_backoff_ms", 100) / 1000
        # The idempotent producer needs aiokafka's sender (producer id, sequence numbers); so
        # does the public path. Both are decided once connected.
        self._idempotent = bool(settings["enable_idempotence"])
        self._through_aiokafka = True
        self._fast_fill = False
        self._wire: _aiokafka_compat.ProduceWire | None = None
        throughput = self.options.get("preset") == "throughput"
        self._max_in_flight = (
            1
            if self._idempotent
            else self.options.get("max_in_flight", THROUGHPUT_MAX_IN_FLIGHT if throughput else 1)
        )
        self._max_batch_size = settings["max_batch_size"]
        compression = _COMPRESSION_CODECS.get(settings.get("compression_type") or "", 0)
        self._encode: _record_batch.Encoder = (
            functools.partial(_record_batch.encode_batch_with_aiokafka, compression=compression)
            if compression
            else _record_batch.encode_batch
        )
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
        try:
            self.client_path, self.client_path_reason = await _aiokafka_compat.choose_path(
                self._producer, self._acks
            )
        except BaseException:
            await self._producer.stop()
            raise
        self._fast_fill = self.client_path == _clients.FAST
        self._through_aiokafka = self._idempotent or not self._fast_fill
        if not self._through_aiokafka:
            self._wire = _aiokafka_compat.ProduceWire(
                self._producer,
                self._acks,
                self._request_timeout_ms,
                settings.get("client_id") or "producerkit",
            )
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
        """Encode the partition's open records as batches of at most ``max_batch_size``. If the
        encoder raises, the records it could not seal fail with that error as their cause."""
        records, queue.records = queue.records, []
        now = _monotonic()
        expires = now + self._request_timeout
        # The records' deadlines are monotonic() + timeout at produce time: this shift turns
        # them back into wall-clock CreateTimes.
        time_shift = time.time() - now - self.timeout
        start = 0
        try:
            while start < len(records):
                if self._through_aiokafka:
                    builder = self._producer.create_batch()
                    end = _aiokafka_compat.fill_builder(
                        builder, records, start, time_shift, fast=self._fast_fill
                    )
                    data, size = builder, builder.size()
                else:
                    data, end = self._encode(records, start, self._max_batch_size, time_shift)
                    size = len(data)
                queue.sealed += 1
                whole = start == 0 and end == len(records)
                batch_records = records if whole else records[start:end]
                queue.full.append(_Batch(queue, queue.sealed, data, batch_records, expires))
                # Gather as many records as fill a batch at the sizes seen last.
                self._gathering.batch_records = max(
                    1, (end - start) * self._max_batch_size // max(size, 1)
                )
                start = end
        except Exception as exc:
            self._fail_all(records[start:], exc)

    # ------------------------------------------------------------------ the sender
    #
    # On the fast path producerkit writes its own Produce requests on aiokafka's connection to
    # each leader (_aiokafka_compat.ProduceWire); on the public path, and for the idempotent
    # producer, each batch goes through aiokafka's send_batch(). Either way every batch ends
    # acked, retried or failed: an exception anywhere in these callbacks fails the batches it
    # concerns at once, with the exception as the cause, and the sender carries on.

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
            try:
                conn = self._wire.ready_connection(leader)  # type: ignore[union-attr]
            except Exception as exc:
                self._retry_or_fail_all(batches, exc)
                continue
            if conn is not None:
                self._write_request(conn, batches)
            else:
                self._spawn(self._connect_then_write(leader, batches))

    def _ship_next(self, queue: _PartitionQueue, by_leader: dict[int, list[_Batch]]) -> None:
        if not queue.full:
            self._seal(queue)
            if not queue.full:
                return  # the encoder failed these records
        batch = queue.full.popleft()
        queue.in_flight += 1
        if not batch.sent:
            batch.sent = True
            try:
                self.sink.batch_sent(queue.topic, queue.partition)
            except Exception:  # a keyless partitioner's trouble is not this batch's
                logger.exception("error reporting a sent batch of %s", queue.key)
        if self._through_aiokafka:
            self._spawn(self._send_through_aiokafka(batch))
            return
        try:
            leader = self._client.cluster.leader_for_partition(queue.key)
        except Exception as exc:
            self._retry_or_fail(batch, exc)
            return
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
            conn = await self._wire.connect(leader)  # type: ignore[union-attr]
        except Exception as exc:  # None if it cannot connect (aiokafka logs why); else this
            self._retry_or_fail_all(batches, exc)
            return
        if conn is None or self._closing:
            error = kafka_errors.NodeNotReadyError(f"cannot connect to broker node {leader}")
            self._retry_or_fail_all(batches, error)
            return
        self._write_request(conn, batches)

    def _write_request(self, conn: Any, batches: list[_Batch]) -> None:
        """One Produce request carrying ``batches``, written on ``conn`` by the fast path."""
        try:
            response = self._wire.write(  # type: ignore[union-attr]
                conn, [(batch.queue.topic, batch.queue.partition, batch.data) for batch in batches]
            )
        except Exception as exc:  # nothing was written: each batch retries or fails with it
            self._retry_or_fail_all(batches, exc)
            return
        if response is None:  # acks=0: no response will come, written is all there is
            for batch in batches:
                self._acked(batch, None)
            return
        response.add_done_callback(functools.partial(self._request_done, batches))

    def _request_done(self, batches: list[_Batch], response: asyncio.Future[Any]) -> None:
        error: BaseException | None
        if response.cancelled():
            error = kafka_errors.KafkaConnectionError("request cancelled")
        else:
            error = response.exception()
        results: dict[tuple[str, int], tuple[int, int]] = {}
        if error is None:
            try:
                results = _aiokafka_compat.partition_results(response.result())
            except Exception as exc:  # a response not shaped as expected
                error = exc
        if error is not None:
            if getattr(error, "invalid_metadata", False):
                self._client.force_metadata_update()
            self._retry_or_fail_all(batches, error)
        else:
            for batch in batches:
                try:
                    self._settle(batch, results)
                except Exception as exc:  # reported ones stay reported; the rest fail with it
                    logger.exception("error settling a batch of %s", batch.queue.key)
                    self._fail_all(batch.records, exc)
        self._schedule_ship()

    def _settle(self, batch: _Batch, results: dict[tuple[str, int], tuple[int, int]]) -> None:
        queue = batch.queue
        code, offset = results.get((queue.topic, queue.partition), (None, None))
        if code == 0:
            self._acked(batch, offset)
        elif code is None:
            self._retry_or_fail(batch, DeliveryError(f"the broker did not answer for {queue.key}"))
        else:
            broker_error = kafka_errors.for_code(code)()
            if broker_error.invalid_metadata:
                self._client.force_metadata_update()
            self._retry_or_fail(batch, broker_error)

    def _acked(self, batch: _Batch, offset: int | None) -> None:
        batch.queue.in_flight -= 1
        self.sink.acked_run(batch.records, offset)

    def _retry_or_fail_all(self, batches: list[_Batch], error: BaseException) -> None:
        for batch in batches:
            self._retry_or_fail(batch, error)

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
            future = await self._producer.send_batch(
                batch.data, queue.topic, partition=queue.partition
            )
            result = await future
        except Exception as exc:
            queue.in_flight -= 1
            self._fail_all(batch.records, exc)
        else:  # no RecordMetadata with acks=0: no response, no offset
            self._acked(batch, None if result is None or self._acks == 0 else result.offset)
        self._schedule_ship()

    def _fail_all(self, records: list[Record], exc: BaseException) -> None:
        if not isinstance(exc, kafka_errors.KafkaError | ProducerError | OSError):
            # Not the broker's or the network's doing: producerkit's or aiokafka's. Say so once
            # per batch, with the traceback; the records fail with it as their cause.
            logger.error("%d message(s) failed on an unexpected error", len(records), exc_info=exc)
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
    """aiokafka's exceptions -> producerkit's, at this backend's edge; the original is kept as
    the new error's ``__cause__``."""
    if isinstance(exc, ProducerError):
        return exc
    error = _producerkit_error(exc)
    error.__cause__ = exc
    return error


def _producerkit_error(exc: BaseException) -> ProducerError:
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
