"""``kafka://host:port[,host:port]`` on aiokafka, batching with the protocol's own record batches.

Instead of one ``send()`` (and one future) per message, records are appended to an open record
batch per partition (aiokafka's ``create_batch``) and each batch is handed to ``send_batch``. One
done-callback per batch then acks every record in it, with offset ``base_offset + index``.

Batching needs no linger: a partition's batch stays open while the previous batch of that
partition is still in aiokafka's accumulator (aiokafka keeps one per partition), so batches grow
exactly as large as the broker's pace requires. With ``linger_ms=0`` (the default, for latency)
an idle partition ships its batch at the end of the current event-loop iteration.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors
from aiokafka.producer.message_accumulator import BatchBuilder

from producerkit import _security
from producerkit._types import Record
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
    "max_request_size": int,
    "metadata_max_age_ms": int,
    "request_timeout_ms": int,
    "retry_backoff_ms": int,
    "send_backoff_ms": int,
}

#: Options for throughput over latency (``preset="throughput"``); see docs/tuning.md.
THROUGHPUT_PRESET: dict[str, Any] = {"linger_ms": 5}
DEFAULT_MAX_BATCH_SIZE = 512 * 1024


class _PartitionQueue:
    """Batches of one partition waiting for aiokafka, oldest first, and the open one.

    Records go straight into the open batch's encoder (aiokafka's compiled
    ``DefaultRecordBatchBuilder.append``), skipping ``BatchBuilder.append``'s per-call
    serializer dispatch; :meth:`seal` then sets the count that wrapper would have kept. That is
    a third of the per-record cost on the Kafka hot path. ``tests/test_producer.py`` round trips
    keys, values, headers and offsets through it, so an aiokafka change here fails loudly.
    """

    __slots__ = ("append", "builder", "full", "records", "shipping")

    def __init__(self) -> None:
        self.builder: BatchBuilder | None = None
        self.append: Any = None
        self.records: list[Record] = []
        self.full: deque[tuple[BatchBuilder, list[Record]]] = deque()
        self.shipping = False

    def open(self, producer: AIOKafkaProducer) -> None:
        builder = self.builder = producer.create_batch()
        self.append = builder._builder.append
        self.records = []

    def seal(self) -> tuple[BatchBuilder, list[Record]]:
        builder, records = self.builder, self.records
        assert builder is not None
        builder._relative_offset = len(records)  # what BatchBuilder.append would have counted
        builder.close()
        self.builder = self.append = None
        self.records = []
        return builder, records


#: Shared by every record without headers: the encoder only reads it (and wants a list).
_NO_HEADERS: list[tuple[str, bytes]] = []


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
        checked = super().check_options(others)
        checked.update(security)
        if checked.get("preset") not in (None, "latency", "throughput"):
            raise ConfigurationError(
                f"unknown preset {checked['preset']!r}: use 'latency' or 'throughput'"
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
        self._linger = settings["linger_ms"] / 1000
        self._queues: dict[str, dict[int, _PartitionQueue]] = {}
        self._ship_scheduled = False
        self._partition_counts: dict[str, int] = {}
        self._shippers: set[asyncio.Task[None]] = set()
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
        self._producer.client.cluster.add_listener(self._metadata_updated)

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
        if preset == "throughput":
            settings.update(THROUGHPUT_PRESET)
        settings.update(options)
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

    def send(self, record: Record) -> None:
        partitions = self._queues.get(record.topic)
        if partitions is None:
            partitions = self._queues[record.topic] = {}
        queue = partitions.get(record.partition)  # type: ignore[arg-type]
        if queue is None:
            queue = partitions[record.partition] = _PartitionQueue()  # type: ignore[index]
        if queue.builder is None:
            queue.open(self._producer)
        headers = list(record.headers) if record.headers else _NO_HEADERS
        records = queue.records
        if queue.append(len(records), None, record.key, record.value, headers) is None:
            if not records:
                self.sink.failed(record, MessageTooLarge("record larger than max_batch_size"))
                return
            # The open batch is full: queue it and start the next one with this record.
            queue.full.append(queue.seal())
            queue.open(self._producer)
            records = queue.records
            queue.append(0, None, record.key, record.value, headers)
        records.append(record)
        if not queue.shipping and not self._ship_scheduled:
            self._ship_scheduled = True
            loop = asyncio.get_running_loop()
            if self._linger:
                loop.call_later(self._linger, self._ship_all)
            else:
                loop.call_soon(self._ship_all)

    def _ship_all(self) -> None:
        self._ship_scheduled = False
        for topic, partitions in self._queues.items():
            for partition, queue in partitions.items():
                if not queue.shipping and (queue.records or queue.full):
                    queue.shipping = True
                    task = asyncio.ensure_future(self._ship(topic, partition, queue))
                    self._shippers.add(task)
                    task.add_done_callback(self._shippers.discard)

    def _all_queues(self) -> list[_PartitionQueue]:
        return [queue for partitions in self._queues.values() for queue in partitions.values()]

    async def _ship(self, topic: str, partition: int, queue: _PartitionQueue) -> None:
        """Hand this partition's batches to aiokafka in order, one at a time (it queues one per
        partition); meanwhile the open batch keeps filling."""
        try:
            while True:
                if queue.full:
                    builder, records = queue.full.popleft()
                elif queue.records:
                    builder, records = queue.seal()
                else:
                    return
                self.sink.batch_sent(topic, partition)
                try:
                    future = await self._producer.send_batch(builder, topic, partition=partition)
                except Exception as exc:
                    self._fail_all(records, exc)
                    continue
                future.add_done_callback(
                    lambda done, records=records: self._batch_done(done, records)
                )
        finally:
            queue.shipping = False

    def _batch_done(self, done: asyncio.Future[Any], records: list[Record]) -> None:
        if done.cancelled():
            self._fail_all(
                records, BrokerUnavailable("the batch was cancelled (connection closed)")
            )
            return
        exc = done.exception()
        if exc is not None:
            self._fail_all(records, exc)
            return
        offset = done.result().offset
        acked = self.sink.acked
        for record in records:
            acked(record, offset)
            offset += 1

    def _fail_all(self, records: list[Record], exc: BaseException) -> None:
        error = _translate(exc)
        for record in records:
            self.sink.failed(record, error)

    async def flush(self) -> None:
        # Start shipping what is open now; acks (or deadlines) end each record, not this call.
        if any(queue.records or queue.full for queue in self._all_queues()):
            self._ship_all()

    async def close(self) -> None:
        for task in list(getattr(self, "_shippers", ())):
            task.cancel()
        for queue in self._all_queues() if hasattr(self, "_queues") else []:
            stranded = [record for _, records in queue.full for record in records] + queue.records
            queue.full.clear()
            queue.records = []
            queue.builder = queue.append = None
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
