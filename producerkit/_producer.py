"""The asynchronous Producer: each message is validated, routed (``_routing``), admitted into
the in-flight window (``_window``, which owns the accounting and the deadlines) and sent on its
connection (``backends``); the connections report every outcome back to the window.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import math
import time
import warnings
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from producerkit import _fast, _logging, _security, serializers
from producerkit._rate import RateLimit
from producerkit._routing import Router
from producerkit._types import (
    CONNECTION,
    SEQ,
    ConnectionStats,
    Delivery,
    DeliveryCallback,
    DeliveryNotice,
    Failure,
    HeaderPairs,
    Headers,
    Outcome,
    Record,
    Stats,
    failure_of,
)
from producerkit._urls import parse_url
from producerkit._window import ByteBoundedWindow, InFlightWindow, message_size
from producerkit.backends import Connection, spec_for
from producerkit.errors import (
    BrokerUnavailable,
    ConfigurationError,
    MessageError,
    MessageTooLarge,
    MissingDependencyError,
    ProduceError,
    ProducerClosed,
    ProducerError,
    ProduceTimeout,
    Purged,
    SerializationError,
)
from producerkit.jetstream import Expect

if TYPE_CHECKING:
    from producerkit import partitioners
    from producerkit.serializers import Serializer

__all__ = ["Producer"]

logger = logging.getLogger("producerkit.producer")

_NEW: Final = 0
_RUNNING: Final = 1
_CLOSING: Final = 2
_CLOSED: Final = 3

_monotonic = time.monotonic

#: Bytes a backend adds around a record (lengths, timestamps, attributes); used in the size check.
_RECORD_OVERHEAD: Final = 64
_DECLINED: Final = _fast.DECLINED

ErrorCallback = Callable[[Failure], object]
Partitioner = Callable[[bytes, int], int]

#: The latest CreateTime accepted, in seconds: the end of year 9999.
_MAX_TIMESTAMP: Final = 253_402_300_800
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MILLISECOND: Final = datetime.timedelta(milliseconds=1)


class Producer:
    """Publishes messages to Kafka, NATS, JetStream, memory or nowhere, with the same calls.

    ``async with Producer(url, topic=...) as producer:`` connects, and on leaving flushes and
    closes. ``await producer.produce(value, key=...)`` waits for the broker's ack and returns a
    :class:`~producerkit.Delivery`; with ``nonblocking=True`` it returns once the message is handed
    off, and the outcome is counted in :attr:`stats` and reported by :meth:`flush`.

    Args:
        url: ``kafka://host:port[,host:port]``, ``jetstream://host:port``, ``nats://host:port``,
            ``memory://[name]`` or ``null://``; query parameters are backend options.
        topic: default topic (Kafka topic, NATS subject) for ``produce()`` calls that name none.
        max_in_flight_messages: most messages in flight at once (default 1000; 10,000 with
            Kafka's ``preset="throughput"``); a produce that finds the window full waits until
            it has drained to ``resume_at`` of the limit.
        timeout: seconds a message may stay unacknowledged before it fails with
            :class:`~producerkit.ProduceTimeout`; also bounds connecting.
        connections: independent connections to the broker; a partition always uses the same one.
        partitioner: ``"xxhash"`` (default), ``"murmur2"`` (Java-compatible), ``"memphis"``,
            ``"crc32"`` or a function ``(key: bytes, num_partitions: int) -> int``.
        keyless: how messages without key or partition spread over partitions: ``"sticky"``
            (Kafka's default: one partition until its batch is sent) or ``"round_robin"`` (the
            default on backends that do not batch).
        on_error: called with each :class:`~producerkit.Failure` as it happens.
        on_delivery: called exactly once per message, blocking or not, as
            ``on_delivery(result, context)``: ``result`` is its :class:`~producerkit.Delivery`
            or its :class:`~producerkit.Failure`, ``context`` what ``produce(context=...)`` was
            given (None if nothing). Runs on the event loop; what it raises is logged. Failures
            are also reported as without it (``on_error``, ``flush()``). No cost unset.
        on_outcome: the instrumentation hook: called with an :class:`~producerkit.Outcome` for
            every group of messages that settle together (a batch acked, a message failed),
            with their numbers and produce times; for metrics and benchmarks. No cost unset.
        on_stats: called with a :class:`~producerkit.Stats` snapshot every ``stats_interval``
            seconds while the producer runs.
        value_serializer: turns each value into bytes before it is produced: a callable
            ``(obj) -> bytes`` or ``"json"``, ``"str"``, ``"bytes"`` (see
            :mod:`producerkit.serializers`, which also makes Avro serializers). None (the
            default): values must be bytes or str, and cost nothing more.
        key_serializer: the same for keys (a None key stays None).
        max_in_flight_bytes: most bytes (values, keys and headers) in flight at once, as well as
            ``max_in_flight_messages``; a produce waits while either is reached. None: no bound
            in bytes (and ``Stats.peak_bytes_in_flight`` is None).
        resume_at: the fraction of each bound to which a full window must drain before the
            produces waiting for room go on: 0.5 (the default) resumes at half, in bursts; 0.9
            keeps the window nearly full, like a sliding window, for links with a long round
            trip.
        max_rate: most messages per second, over every connection together (a token bucket:
            a produce waits for its turn, first come first served). None: no limit.
        max_bytes_rate: most bytes (value + key) per second, the same way. None: no limit.
        rate_burst: messages a producer that was idle may send at once (default: 50 ms of
            ``max_rate``); the byte bucket holds the same time's worth of bytes.
        concurrent_task_limit: the deprecated name of ``max_in_flight_messages``.
        propagate_trace: inject the current OpenTelemetry context into each message's headers
            (W3C ``traceparent``, and ``tracestate``/``baggage`` where set, through
            OpenTelemetry's configured propagator), so consumers can continue the trace. Needs
            ``producerkit[otel]``. Off by default.
        **options: backend options (``linger_ms``, ``acks``, ``partitions``, ...).
    """

    def __init__(
        self,
        url: str,
        *,
        topic: str | None = None,
        max_in_flight_messages: int | None = None,
        timeout: float = 30.0,
        connections: int = 1,
        partitioner: str | Partitioner = "xxhash",
        keyless: str | partitioners.KeylessPartitioner | None = None,
        on_error: ErrorCallback | None = None,
        on_delivery: DeliveryCallback | None = None,
        on_outcome: Callable[[Outcome], object] | None = None,
        on_stats: Callable[[Stats], object] | None = None,
        stats_interval: float = 5.0,
        value_serializer: str | Serializer | None = None,
        key_serializer: str | Serializer | None = None,
        propagate_trace: bool = False,
        max_in_flight_bytes: int | None = None,
        resume_at: float = 0.5,
        max_rate: float | None = None,
        max_bytes_rate: float | None = None,
        rate_burst: float | None = None,
        concurrent_task_limit: int | None = None,
        **options: Any,
    ) -> None:
        self._url = parse_url(url)
        self._spec = spec_for(self._url.scheme)
        # Keywords beat URL query options, then the URL's user:password@, then the environment.
        self._options = self._spec.checked_options(
            _security.merge_credentials(
                self._url.username,
                self._url.password,
                {**self._url.options, **options},
                self._spec.options,
            )
        )
        self._limit = _window_limit(
            max_in_flight_messages, concurrent_task_limit, self._spec.default_window(self._options)
        )
        self._connection_count = _positive_int("connections", connections)
        self._timeout = _positive_number("timeout", timeout)
        if topic is not None:
            _check_topic_type(topic, ConfigurationError)
            try:
                self._spec.check_topic(topic)
            except MessageError as exc:  # a bad default topic is a bad setting: say so now
                raise ConfigurationError(str(exc)) from None
        self._topic = topic
        # Imported here, not at module level: ``import producerkit`` needs no hashing library.
        from producerkit import partitioners

        self._partitioner: Partitioner = partitioners.resolve(partitioner)
        self._key_hash = partitioners.modulo_hash(self._partitioner)
        if keyless is None:
            keyless = self._spec.default_keyless
        self._keyless = partitioners.resolve_keyless(keyless)
        if on_error is not None and not callable(on_error):
            raise ConfigurationError("on_error must be a callable taking a producerkit.Failure")
        self._on_error = on_error
        if on_delivery is not None and not callable(on_delivery):
            raise ConfigurationError(
                "on_delivery must be a callable taking (Delivery or Failure, context)"
            )
        self._on_delivery = on_delivery
        if on_outcome is not None and not callable(on_outcome):
            raise ConfigurationError("on_outcome must be a callable taking a producerkit.Outcome")
        if on_stats is not None and not callable(on_stats):
            raise ConfigurationError("on_stats must be a callable taking a producerkit.Stats")
        self._on_stats = on_stats
        self._stats_interval = _positive_number("stats_interval", stats_interval)
        self._value_serializer = serializers.resolve(value_serializer, "value_serializer")
        self._key_serializer = serializers.resolve(key_serializer, "key_serializer")
        self._inject_trace = _trace_injector() if propagate_trace else None
        if self._value_serializer or self._key_serializer or self._inject_trace:
            # Only then does produce() go through a wrapper: without them it costs nothing.
            self.produce = self._produce_prepared  # type: ignore[method-assign]
        self._stats_timer: asyncio.TimerHandle | None = None
        self._rate: RateLimit | None = None
        if max_rate is not None or max_bytes_rate is not None:
            self._rate = RateLimit(max_rate, max_bytes_rate, rate_burst)
        elif rate_burst is not None:
            raise ConfigurationError("rate_burst needs max_rate or max_bytes_rate")

        self._state = _NEW
        self._running = False  # the hot path's one-attribute view of _state == _RUNNING
        self._start_lock: asyncio.Lock | None = None
        self._connections: list[Connection] = []
        window_options: dict[str, Any] = {
            # Only where records wait for a batch's ack: on null:// a record dies at once, and
            # untracking it would cost more than the collections it saves.
            "untrack": self._spec.holds_records,
            "resume_at": _fraction("resume_at", resume_at),
        }
        self._byte_bounded = max_in_flight_bytes is not None
        self._window: InFlightWindow
        if max_in_flight_bytes is None:
            window_class: type[InFlightWindow] = InFlightWindow
        else:
            window_class = ByteBoundedWindow
            window_options["byte_limit"] = _positive_int("max_in_flight_bytes", max_in_flight_bytes)
        self._window = window_class(
            self._limit,
            self._timeout,
            self._connection_count,
            on_error,
            on_outcome,
            **window_options,
        )
        self._reports = _Reports(self._window, self._topic_changed, self._batch_sent)
        self._pending = self._window.pending
        self._router = Router(
            self._partitioner, self._key_hash, self._keyless, self._connection_count
        )
        self._sends: list[Callable[[Record], Awaitable[None] | None]] = []
        self._topics: dict[str, int | None] = {}  # partition counts (None: unpartitioned)
        self._topic_tasks: dict[str, asyncio.Task[int | None]] = {}
        self._max_payload = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._admit: Callable[..., Any] | None = None  # the C fast path, while running
        self._left_open_guard: AsyncGenerator[None, None] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect every connection. Raises BrokerUnavailable within ``timeout`` if it cannot."""
        if self._state == _RUNNING:
            return
        if self._state != _NEW:
            raise ProducerClosed("this producer is closed; create a new one")
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._state != _NEW:
                return
            self._loop = asyncio.get_running_loop()
            _logging.install_default()  # the clients' repeated log lines, rate-limited
            connections = [
                self._spec.connection(
                    self._url, self._options, self._reports, timeout=self._timeout, index=index
                )
                for index in range(self._connection_count)
            ]
            try:
                await asyncio.wait_for(
                    asyncio.gather(*(connection.connect() for connection in connections)),
                    self._timeout,
                )
            except BaseException as exc:
                await asyncio.gather(*(_close_quietly(connection) for connection in connections))
                if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
                    raise BrokerUnavailable(
                        f"could not connect to {self._describe_servers()} within {self._timeout}s"
                    ) from exc
                if isinstance(exc, ProducerError) or not isinstance(exc, Exception):
                    raise
                raise BrokerUnavailable(
                    f"could not connect to {self._describe_servers()}: {exc}"
                ) from exc
            self._connections = connections
            self._sends = [connection.send for connection in connections]
            self._max_payload = (
                min(connection.max_message_size for connection in connections) - _RECORD_OVERHEAD
            )
            self._state = _RUNNING
            self._running = True
            if (
                _fast.Admission is not None
                and self._rate is None
                and self._on_delivery is None
                and not self._byte_bounded
            ):
                self._admit = _fast.Admission(
                    self._router,
                    self._window,
                    tuple(self._sends),
                    self._send_failed,
                    self._topics,
                    self._topic,
                    self._max_payload,
                ).admit
            if self._on_stats is not None:
                self._stats_timer = self._loop.call_later(self._stats_interval, self._report_stats)
            self._left_open_guard = self._close_if_left_open()
            await self._left_open_guard.asend(None)

    async def _close_if_left_open(self) -> AsyncGenerator[None, None]:
        """Its ``finally`` runs when the event loop shuts down its async generators (the end
        of ``asyncio.run``), or soon after the producer is dropped while its loop still runs:
        a producer left open is closed then, flushing what the loop still allows, and its
        messages that were never acknowledged are reported (log line and ResourceWarning)."""
        try:
            yield
        finally:
            if self._state == _RUNNING:
                self._left_open_guard = None  # close() must not close this generator itself
                await self._close_left_open()

    async def _close_left_open(self) -> None:
        window = self._window
        in_flight, acked_before, described = len(window.pending), window.acked_count, repr(self)
        try:
            await self.close(min(self._timeout, LEFT_OPEN_CLOSE_SECONDS))
        except ProduceError:
            pass  # counted below
        except Exception:
            logger.debug("closing a producer left open", exc_info=True)
        if in_flight:
            never_acked = in_flight - (window.acked_count - acked_before)
            _report_left_open(described, in_flight, never_acked)

    def __del__(self) -> None:
        # The guard above reports a producer left open; this covers a loop closed without
        # shutting down its async generators. (A constructor that raised left no _state.)
        if (
            getattr(self, "_state", _NEW) == _RUNNING
            and self._pending
            and (self._loop is None or self._loop.is_closed())
        ):
            _report_left_open(repr(self), len(self._pending), len(self._pending))

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            await self.close()
            return
        # Leaving on an exception: close, but let the caller's exception be the one they see.
        try:
            await self.close()
        except ProduceError as close_error:
            logger.warning("closing after an error: %s", close_error)
            exc.add_note(f"producerkit: also, on close: {close_error}")

    # ------------------------------------------------------------------ produce

    async def produce(
        self,
        value: bytes | bytearray | memoryview | str | None,
        *,
        key: bytes | str | None = None,
        headers: HeadersArgument | None = None,
        topic: str | None = None,
        partition: int | None = None,
        nonblocking: bool = False,
        msg_id: str | None = None,
        context: Any = None,
        expect: Expect | None = None,
        timestamp: float | datetime.datetime | None = None,
    ) -> Delivery | None:
        """Publish one message.

        Waits for the broker's ack and returns its Delivery, or with ``nonblocking=True`` returns
        None once the message is handed off. Raises MessageError (nothing sent) for a bad
        message, ProducerClosed after close(); a blocking produce raises the message's own error
        (ProduceTimeout, DeliveryError, ...) if it fails. ``context`` is handed to the
        producer's ``on_delivery`` callback with this message's outcome. ``expect``
        (JetStream only): a :class:`~producerkit.Expect` the stream must meet for the message to
        be stored, else it fails with :class:`~producerkit.ExpectationFailed`.

        ``value=None`` with a key is a tombstone (Kafka and ``memory://``): a record with a null
        value, which a compacted topic keeps as the deletion of that key; NATS, JetStream and
        ``null://`` refuse it (MessageError). ``headers``: a mapping, or a list of
        ``(name, value)`` pairs where a name may repeat; a value is bytes, str, or None (a null
        header value, Kafka only). ``timestamp`` (epoch seconds, or an aware datetime; kept to
        the millisecond) is the Kafka record's CreateTime instead of the produce time; NATS and
        JetStream refuse it (MessageError: they store no publisher time).
        """
        admit = self._admit
        if (
            admit is not None
            and nonblocking
            and context is None
            and expect is None
            and timestamp is None
        ):
            # The common case in one C call (the same route and admit as below), or DECLINED.
            outcome = admit(value, key, topic, partition, headers, msg_id)
            if outcome is None:
                return None
            if outcome is not _DECLINED:
                await self._hand_off(*outcome)
                return None
        if not self._running:
            await self._ensure_running()
        if expect is not None:
            headers = self._with_expectation(headers, expect)
        value, key, topic, header_pairs = self._validate(value, key, headers, topic, msg_id)
        stamp = self._checked_extras(context, timestamp, reported=not nonblocking)
        waiter = None if nonblocking else self._loop.create_future()  # type: ignore[union-attr]
        await self._route_admit_send(
            value, key, topic, partition, header_pairs, msg_id, self._slot(waiter, context), stamp
        )
        if waiter is None:
            return None
        delivery: Delivery = await waiter
        return delivery

    def _checked_extras(self, context: Any, timestamp: object, reported: bool) -> int | None:
        """The record's CreateTime (epoch ms) for ``timestamp``, after checking ``context``.
        Where the backend stores timestamps and the message's Delivery is reported (a blocking
        produce, or on_delivery), the produce time is fixed here, so that the Delivery says the
        time it was stored with. MessageError for what this producer cannot take."""
        if context is not None and self._on_delivery is None:
            raise MessageError("context= is for on_delivery: create the Producer with one")
        if timestamp is not None:
            return self._timestamp_ms(timestamp)
        if (reported or self._on_delivery is not None) and self._spec.stores_timestamps:
            return int(time.time() * 1000)
        return None

    def _slot(
        self, waiter: asyncio.Future[Delivery] | None, context: Any
    ) -> asyncio.Future[Delivery] | DeliveryNotice | None:
        """What a record carries in its future slot: the blocking caller's waiter, or with
        on_delivery a notice that tells the callback (and the waiter)."""
        if self._on_delivery is None:
            return waiter
        return DeliveryNotice(self._on_delivery, context, waiter)

    async def _route_admit_send(
        self,
        value: bytes | None,
        key: bytes | None,
        topic: str,
        partition: int | None,
        header_pairs: Headers | None,
        msg_id: str | None,
        slot: asyncio.Future[Delivery] | DeliveryNotice | None,
        stamp: int | None,
        admitted: Callable[[], object] | None = None,
    ) -> None:
        """A validated message's way into flight: learn its topic, route it, wait for the rate
        limit and for room, admit it (``admitted()`` is called then) and hand it to its
        connection. Raises only before admission; from admission on, its outcome is the
        window's."""
        num_partitions = await self._partition_count(topic)
        if partition is not None:
            _check_partition(partition, num_partitions, topic)
        partition, connection = self._router.route(topic, key, partition, num_partitions)
        if self._rate is not None:
            await self._wait_for_rate(_payload_size(value, key))
        if self._byte_bounded:
            size = message_size(value, key, header_pairs)
            if self._window.is_full(size):
                await self._wait_for_room(size)
        elif len(self._pending) >= self._limit:
            await self._wait_for_room()
        record = self._window.admit(
            value, key, topic, partition, header_pairs, msg_id, connection, slot, stamp
        )
        if admitted is not None:
            admitted()
        handed_off = self._send(record)
        if handed_off is not None:
            await self._hand_off(record, handed_off)

    async def _produce_prepared(
        self,
        value: Any,
        *,
        key: Any = None,
        headers: HeadersArgument | None = None,
        topic: str | None = None,
        partition: int | None = None,
        nonblocking: bool = False,
        msg_id: str | None = None,
        context: Any = None,
        expect: Expect | None = None,
        timestamp: float | datetime.datetime | None = None,
    ) -> Delivery | None:
        """:meth:`produce` with the value and key serialized and the trace context added to the
        headers first (see ``value_serializer`` and ``propagate_trace``)."""
        value, key, headers = self._prepared(value, key, headers, topic)
        return await Producer.produce(
            self,
            value,
            key=key,
            headers=headers,
            topic=topic,
            partition=partition,
            nonblocking=nonblocking,
            msg_id=msg_id,
            context=context,
            expect=expect,
            timestamp=timestamp,
        )

    def _timestamp_ms(self, timestamp: object) -> int:
        """``timestamp`` as epoch milliseconds; MessageError if it is not one this backend
        stores."""
        refusal = self._spec.timestamp_refusal
        if refusal is not None:
            raise MessageError(f"timestamp= is for Kafka: {refusal}")
        if isinstance(timestamp, datetime.datetime):
            if timestamp.utcoffset() is None:
                raise MessageError(
                    f"timestamp {timestamp!r} has no time zone: give an aware datetime "
                    "(tzinfo=datetime.timezone.utc, say) or epoch seconds"
                )
            return (timestamp - _EPOCH) // _MILLISECOND
        if (
            isinstance(timestamp, bool)
            or not isinstance(timestamp, (int, float))
            or not math.isfinite(timestamp)
            or not 0 <= timestamp < _MAX_TIMESTAMP
        ):
            raise MessageError(
                "timestamp must be epoch seconds (an int or float from 0, before year 10000) "
                f"or an aware datetime, got {timestamp!r}"
            )
        return round(timestamp * 1000)

    def _with_expectation(self, headers: Any, expect: object) -> Any:
        """The message's headers with ``expect``'s ``Nats-Expected-*`` headers added."""
        if not isinstance(expect, Expect):
            raise MessageError(f"expect must be a producerkit.Expect, not {type(expect).__name__}")
        if not self._spec.takes_expectations:
            raise MessageError(
                f"expect= is for JetStream (jetstream://); this producer is {self._url.scheme}://"
            )
        pairs = expect.header_pairs()
        if headers is None:
            return pairs
        given = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
        return given + list(pairs)

    def _prepared(
        self, value: Any, key: Any, headers: Any, topic: str | None
    ) -> tuple[Any, Any, Any]:
        """The value and key serialized, the trace context added to the headers."""
        value, key = self._serialize(value, key, topic)
        if self._inject_trace is not None:
            headers = self._inject_trace(headers)
        return value, key, headers

    def _serialize(self, value: Any, key: Any, topic: str | None) -> tuple[Any, Any]:
        """The value and key through their serializers; SerializationError naming the message
        if one raises (nothing is counted)."""
        for what, serializer in (("value", self._value_serializer), ("key", self._key_serializer)):
            original = value if what == "value" else key
            if serializer is None or original is None:
                continue
            try:
                serialized = serializer(original)
            except Exception as exc:
                raise SerializationError(
                    f"{what}_serializer failed on the message with key {_short(key)} to topic "
                    f"{topic or self._topic!r} (value {_short(value)}): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            if what == "value":
                value = serialized
            else:
                key = serialized
        return value, key

    def _validate(
        self,
        value: object,
        key: object,
        headers: object,
        topic: object,
        msg_id: object,
    ) -> tuple[bytes, bytes | None, str, Headers | None]:
        """The message as the producer sends it: bytes (or None: a tombstone, on a backend
        that stores one; typed bytes as a Record's VALUE is), the topic to use, headers as pairs
        (a None value only on a backend whose check_headers lets it through). Raises
        MessageError (MessageTooLarge) for anything it cannot send."""
        if value is None:
            self._check_tombstone(key)
        elif type(value) is not bytes:
            value = _to_bytes("value", value)
        if key is not None and type(key) is not bytes:
            key = _to_bytes("key", key)
        if topic is None:
            topic = self._topic
            if topic is None:
                raise MessageError("no topic: pass topic= to produce() or to the Producer")
        header_pairs = None
        if msg_id is not None and (type(msg_id) is not str or not msg_id):
            raise MessageError(f"msg_id must be a non-empty str, got {msg_id!r}")
        if headers is not None:
            header_pairs = _normalize_headers(headers)
            # The spec's check takes Headers: the backends that refuse None values say so.
            self._spec.check_headers(header_pairs)  # type: ignore[arg-type]
        size = message_size(value, key, header_pairs)
        if size > self._max_payload:
            raise MessageTooLarge(
                f"message of {size} bytes (value, key and headers) is larger than "
                f"{self._max_payload}, the most this {self._url.scheme}:// connection accepts"
            )
        return value, key, topic, header_pairs  # type: ignore[return-value]

    def _check_tombstone(self, key: object) -> None:
        """A None value is a tombstone: it needs a key, and a backend that stores it."""
        refusal = self._spec.tombstone_refusal
        if refusal is not None:
            raise MessageError(f"value is None (a Kafka tombstone), but {refusal}")
        if key is None:
            raise MessageError(
                "value is None without a key: a tombstone deletes a key from a compacted "
                "topic, so it needs the key (produce(None, key=...))"
            )

    async def _partition_count(self, topic: str) -> int | None:
        """The topic's partition count (None: unpartitioned), learned once per topic."""
        try:
            num_partitions = self._topics.get(topic, -1)
        except TypeError:  # unhashable (a list...): _prepare_topic names the problem
            num_partitions = -1
        if num_partitions == -1:
            num_partitions = await self._prepare_topic(topic)
        return num_partitions

    async def _wait_for_room(self, size: int = 0) -> None:
        await self._window.wait_for_room(size)
        if not self._running:
            raise ProducerClosed("the producer was closed while this produce waited")

    async def _wait_for_rate(self, size: int) -> None:
        assert self._rate is not None
        if not self._rate.try_acquire(size):
            await self._rate.wait_for_turn(size)
            if not self._running:
                raise ProducerClosed("the producer was closed while this produce waited")

    def _send(self, record: Record) -> Awaitable[None] | None:
        """Hand an admitted record to its connection; if that raises, the record fails."""
        try:
            return self._sends[record[CONNECTION]](record)
        except Exception as exc:
            self._send_failed(record, exc)
            return None

    def _send_failed(self, record: Record, exc: Exception) -> None:
        # Translated at the backend's edge; the message is not lost, it fails.
        self._window.failed(record, self._spec.translate_error(exc))

    async def _hand_off(self, record: Record, handed_off: Awaitable[None]) -> None:
        try:
            await handed_off
        except asyncio.CancelledError:
            # The caller went away mid hand-off; the record may or may not be out. Its outcome
            # still arrives (or its deadline fails it), so the accounting stays exact.
            raise
        except Exception as exc:
            self._send_failed(record, exc)

    async def _ensure_running(self) -> None:
        if self._state == _NEW:
            await self.start()
        if self._state != _RUNNING:
            raise ProducerClosed("produce() after close(): create a new Producer")

    async def _prepare_topic(self, topic: str) -> int | None:
        """First message to a topic: validate its name and learn its partition count (once)."""
        _check_topic_type(topic, MessageError)
        self._spec.check_topic(topic)
        task = self._topic_tasks.get(topic)
        if task is None:
            task = asyncio.ensure_future(self._prepare_on_every_connection(topic))
            self._topic_tasks[topic] = task
        try:
            count = await asyncio.wait_for(asyncio.shield(task), self._timeout)
        except TimeoutError as exc:
            self._topic_tasks.pop(topic, None)
            raise ProduceTimeout(
                f"no metadata for topic {topic!r} within {self._timeout}s"
            ) from exc
        except BaseException:
            if task.done():
                self._topic_tasks.pop(topic, None)
            raise
        self._topic_tasks.pop(topic, None)
        self._topics[topic] = count
        return count

    async def _prepare_on_every_connection(self, topic: str) -> int | None:
        """The first connection prepares the topic (creating a stream, say) and gives its
        partition count; then every other connection learns the topic too, so that each one
        watches its metadata and reports a partition count that changes."""
        first, *others = self._connections
        count = await first.prepare_topic(topic)
        await asyncio.gather(*(connection.prepare_topic(topic) for connection in others))
        return count

    # ------------------------------------------------------------------ what connections report

    def _topic_changed(self, topic: str) -> None:
        self._topics.pop(topic, None)

    def _batch_sent(self, topic: str, partition: int) -> None:
        num_partitions = self._topics.get(topic)
        if num_partitions:
            self._keyless.on_new_batch(topic, num_partitions, partition)

    def _report_stats(self) -> None:
        assert self._loop is not None and self._on_stats is not None
        try:
            self._on_stats(self.stats)
        except Exception:
            logger.exception("on_stats callback raised")
        if self._state == _RUNNING:
            self._stats_timer = self._loop.call_later(self._stats_interval, self._report_stats)

    # ------------------------------------------------------------------ flush / close

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until nothing is in flight; raise ProduceError with every failure since last time.

        With ``timeout``, raise ProduceTimeout at that deadline if messages are still in flight
        (they stay in flight and keep their own deadlines).
        """
        if timeout is not None:
            timeout = _positive_number("timeout", timeout)
        if self._connections:
            try:
                await asyncio.wait_for(self._drain(), timeout)
            except TimeoutError as exc:
                raise ProduceTimeout(
                    f"flush() timed out after {timeout}s with {self._window.in_flight} "
                    "message(s) still in flight"
                ) from exc
        self._raise_failures()

    async def _drain(self) -> None:
        await asyncio.gather(*(connection.flush() for connection in self._connections))
        await self._window.wait_empty()

    async def close(self, timeout: float | None = None) -> None:
        """Flush, then close every connection.

        Waits at most ``timeout`` seconds (default: the producer's timeout) for messages in
        flight; those still unacknowledged then fail with ProduceTimeout. Raises ProduceError if
        any message failed, so ``acked + failed == produced`` always holds after close().
        """
        if self._state in (_CLOSING, _CLOSED):
            return
        if timeout is not None:
            timeout = _positive_number("timeout", timeout)
        was_running = self._state == _RUNNING
        self._state = _CLOSING
        self._running = False
        self._admit = None
        self._window.wake_room_waiters()  # they see the state and give up
        if self._rate is not None:
            self._rate.close()
        try:
            if was_running:
                try:
                    await asyncio.wait_for(self._drain(), timeout or self._timeout)
                except TimeoutError:
                    self._window.fail_pending(
                        lambda: ProduceTimeout(
                            "not acknowledged before the close() deadline; it may still have "
                            "been stored"
                        )
                    )
            await asyncio.gather(*(_close_quietly(connection) for connection in self._connections))
            self._window.fail_pending(
                lambda: ProducerClosed("the producer closed with this message in flight")
            )
        finally:
            self._window.stop_timer()
            if self._stats_timer is not None:
                self._stats_timer.cancel()
                self._stats_timer = None
            for task in self._topic_tasks.values():
                task.cancel()
            self._state = _CLOSED
            guard, self._left_open_guard = self._left_open_guard, None
            if guard is not None:
                await guard.aclose()
        self._raise_failures()

    def purge(self, *, in_flight: bool = True) -> list[Failure]:
        """Fail at once every message not yet written to the broker and, with ``in_flight``
        (the default), every message still waiting for its ack, and return their Failures.

        For a shutdown that must not wait (SIGTERM): save the returned messages and exit. Each
        fails with :class:`~producerkit.Purged` (one sent before may still be stored); callers
        of a blocking produce get that error, ``on_error``/``on_delivery`` are told as for any
        failure, and they are not raised again by the next ``flush()``. Afterwards
        ``produced == acked + failed + in_flight`` as ever, with ``in_flight == 0`` when
        ``in_flight`` was true. The producer stays usable.
        """
        window = self._window
        unsent = [record for connection in self._connections for record in connection.take_unsent()]
        unsent_numbers = {record[SEQ] for record in unsent}
        purging = unsent + (list(window.pending.values()) if in_flight else [])
        reported_before = len(window.failures)
        purged: list[Failure] = []
        for record in purging:
            if record[SEQ] not in window.pending:
                continue  # settled already, or listed twice
            error = Purged(
                "purged before it was sent"
                if record[SEQ] in unsent_numbers
                else "purged while waiting for its ack; it may still have been stored"
            )
            window.failed(record, error)
            purged.append(failure_of(record, error))
        # Returned here, so flush() does not raise them a second time.
        del window.failures[reported_before:]
        return purged

    async def partitions_for(self, topic: str) -> frozenset[int] | None:
        """The partition numbers of ``topic`` (learned once, as the first produce does; a
        JetStream stream is created if ``create_stream`` is set), or None where topics are not
        partitioned (NATS subjects without ``partitions=N``)."""
        await self._ensure_running()
        count = await self._partition_count(topic)
        return None if count is None else frozenset(range(count))

    def _raise_failures(self) -> None:
        error = self._window.take_failures()
        if error is not None:
            raise error

    # ------------------------------------------------------------------ introspection

    @property
    def stats(self) -> Stats:
        window = self._window
        in_flight_by_connection = [0] * self._connection_count
        for record in list(window.pending.values()):
            in_flight_by_connection[record[CONNECTION]] += 1
        connections = tuple(
            ConnectionStats(
                index=index,
                produced=window.acked_on(index)
                + window.connection_failed[index]
                + in_flight_by_connection[index],
                acked=window.acked_on(index),
                failed=window.connection_failed[index],
                in_flight=in_flight_by_connection[index],
            )
            for index in range(self._connection_count)
        )
        return Stats(
            produced=window.produced,
            acked=window.acked_count,
            failed=window.failed_count,
            in_flight=len(window.pending),
            peak_in_flight=window.peak_in_flight,
            window_waits=window.waits,
            window_wait_seconds=window.wait_seconds,
            connections=connections,
            peak_bytes_in_flight=(
                self._window.peak_bytes_in_flight
                if isinstance(self._window, ByteBoundedWindow)
                else None
            ),
            rate_waits=self._rate.waits if self._rate is not None else 0,
            rate_wait_seconds=self._rate.wait_seconds if self._rate is not None else 0.0,
        )

    @property
    def backend(self) -> Connection:
        """The first connection (``producer.backend.records`` on ``memory://``)."""
        if not self._connections:
            raise ProducerClosed("the producer is not started: use `async with` or await start()")
        return self._connections[0]

    @property
    def backends(self) -> tuple[Connection, ...]:
        """Every connection, by index."""
        return tuple(self._connections)

    @property
    def topic(self) -> str | None:
        return self._topic

    @property
    def closed(self) -> bool:
        return self._state == _CLOSED

    def _describe_servers(self) -> str:
        servers = ",".join(self._url.server_strings())
        return f"{self._url.scheme}://{servers or self._url.name}"

    def __repr__(self) -> str:
        state = ("new", "running", "closing", "closed")[self._state]
        security = _security.describe(self._options)  # "tls user='alice'": never a secret
        return (
            f"<Producer {self._describe_servers()} topic={self._topic!r} "
            f"connections={self._connection_count} limit={self._limit} "
            f"{security + ' ' if security else ''}{state}>"
        )


#: Seconds a producer left open gets to flush when its event loop shuts down.
LEFT_OPEN_CLOSE_SECONDS: Final = 2.0


def _report_left_open(producer: str, in_flight: int, never_acked: int) -> None:
    outcome = (
        f"{never_acked} of them were never acknowledged"
        if never_acked
        else "they were flushed when it was dropped"
    )
    message = (
        f"{producer} was never closed (use `async with` or await close()): it had {in_flight} "
        f"message(s) in flight; {outcome}"
    )
    try:
        logger.error("%s", message)
        warnings.warn(message, ResourceWarning, stacklevel=2)
    except Exception:  # at interpreter exit, logging or warnings may be gone
        pass


# ---------------------------------------------------------------------- validation helpers


#: What ``produce(headers=...)`` takes: a mapping, or (name, value) pairs where names may repeat.
HeadersArgument = Mapping[str, bytes | str | None] | Sequence[tuple[str, bytes | str | None]]


def _payload_size(value: bytes | None, key: bytes | None) -> int:
    """The bytes of a message's value and key (a tombstone's value has none)."""
    size = 0 if value is None else len(value)
    return size if key is None else size + len(key)


def _to_bytes(what: str, data: object) -> bytes:
    if isinstance(data, str):
        try:
            return data.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates
            raise MessageError(f"{what} is not valid UTF-8 text: {exc}") from None
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise MessageError(
        f"{what} must be bytes, bytearray, memoryview or str, not {type(data).__name__}"
    )


def _trace_injector() -> Callable[[Any], Any]:
    """``(headers) -> headers`` with the current OpenTelemetry context injected as headers, for
    ``propagate_trace``; headers the caller gave win over injected ones of the same name."""
    try:
        from opentelemetry import context as otel_context
        from opentelemetry import propagate
    except ImportError as exc:
        raise MissingDependencyError(
            'propagate_trace needs OpenTelemetry: run  pip install "producerkit[otel]"'
        ) from exc
    get_current, inject = otel_context.get_current, propagate.inject
    last_context: object = None
    last_carrier: dict[str, str] = {}

    def with_trace(headers: Any) -> Any:
        nonlocal last_context, last_carrier
        context = get_current()
        if context is not last_context:  # a Context is immutable: same object, same headers
            last_carrier = {}
            inject(last_carrier, context=context)
            last_context = context
        carrier = last_carrier  # only read below
        if not carrier:
            return headers  # no active span: nothing to propagate
        if headers is None:
            return carrier
        pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
        given = {pair[0] for pair in pairs if isinstance(pair, tuple) and pair}
        return pairs + [(name, data) for name, data in carrier.items() if name not in given]

    return with_trace


def _short(obj: object) -> str:
    """A repr that names a message without printing all of it."""
    text = repr(obj)
    return text if len(text) <= 60 else text[:57] + "..."


def _normalize_headers(headers: object) -> HeaderPairs:
    pairs: Iterable[Any]
    if isinstance(headers, Mapping):
        pairs = headers.items()
    elif isinstance(headers, (list, tuple)):
        pairs = headers
    else:
        raise MessageError(
            "headers must be a mapping of str to bytes/str/None, or a list of (name, value) "
            f"pairs, not {type(headers).__name__}"
        )
    normalized = []
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise MessageError(f"headers must be (name, value) pairs, got {pair!r}")
        name, data = pair
        if not isinstance(name, str) or not name:
            raise MessageError(f"header names must be non-empty str, got {name!r}")
        if not name.isascii():
            _to_bytes(f"header name {name!r}", name)
        if isinstance(data, str):
            data = _to_bytes(f"header {name!r}", data)
        elif isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        elif data is not None and not isinstance(data, bytes):
            raise MessageError(
                f"header {name!r} must have a bytes, str or None value, not {type(data).__name__}"
            )
        normalized.append((name, data))
    return tuple(normalized)


def _check_topic_type(topic: object, error: type[ProducerError]) -> None:
    if not isinstance(topic, str) or not topic:
        raise error(f"topic must be a non-empty str, got {topic!r}")
    if not topic.isascii():  # rare: only then pay for the UTF-8 check
        try:
            topic.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates
            raise error(f"topic {topic!r} is not valid UTF-8 text") from None


def _check_partition(partition: object, num_partitions: int | None, topic: str) -> None:
    if type(partition) is not int:
        raise MessageError(f"partition must be an int, not {type(partition).__name__}")
    if num_partitions is None:
        raise MessageError(
            f"partition={partition} given but topic {topic!r} is not partitioned on this backend "
            "(NATS: create the producer with partitions=N)"
        )
    if not 0 <= partition < num_partitions:
        raise MessageError(
            f"partition {partition} is out of range for topic {topic!r} "
            f"with {num_partitions} partition(s)"
        )


#: Messages in flight at once when the producer is not told otherwise.
DEFAULT_MAX_IN_FLIGHT_MESSAGES: Final = 1000


def _window_limit(
    max_in_flight_messages: object, concurrent_task_limit: object, backend_default: int | None
) -> int:
    """``max_in_flight_messages``, or its deprecated name ``concurrent_task_limit``; else the
    backend's default for its options (a preset's), else DEFAULT_MAX_IN_FLIGHT_MESSAGES."""
    if concurrent_task_limit is not None:
        if max_in_flight_messages is not None:
            raise ConfigurationError(
                "give max_in_flight_messages only (concurrent_task_limit is its old name)"
            )
        warnings.warn(
            "concurrent_task_limit is deprecated: use max_in_flight_messages (it limits "
            "messages in flight, not tasks)",
            DeprecationWarning,
            stacklevel=3,
        )
        return _positive_int("concurrent_task_limit", concurrent_task_limit)
    if max_in_flight_messages is None:
        return backend_default or DEFAULT_MAX_IN_FLIGHT_MESSAGES
    return _positive_int("max_in_flight_messages", max_in_flight_messages)


def _positive_int(name: str, value: object) -> int:
    if type(value) is not int or value <= 0:
        raise ConfigurationError(f"{name} must be a positive int, got {value!r}")
    return value


def _fraction(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigurationError(f"{name} must be a number from 0 to 1, got {value!r}")
    return float(value)


def _positive_number(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value > 0
        or value == float("inf")
    ):
        raise ConfigurationError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


async def _close_quietly(connection: Connection) -> None:
    try:
        await asyncio.wait_for(connection.close(), connection.timeout)
    except Exception:
        logger.debug("error closing %r", connection, exc_info=True)


class _Reports:
    """What the producer's connections report into (the seam's Reports): the window settles
    each record, the producer's routing learns of topics and batches. With an ``on_outcome``
    hook the window's observed twins stand in for acked and acked_run; without one, nothing is
    added to the path of an ack."""

    __slots__ = ("acked", "acked_each", "acked_run", "batch_sent", "failed", "topic_changed")

    def __init__(
        self,
        window: InFlightWindow,
        topic_changed: Callable[[str], None],
        batch_sent: Callable[[str, int], None],
    ) -> None:
        observed = window.observed
        self.acked = window.acked_observed if observed else window.acked
        self.acked_run = window.acked_run_observed if observed else window.acked_run
        self.acked_each = window.acked_each_observed if observed else window.acked_each
        self.failed = window.failed
        self.topic_changed = topic_changed
        self.batch_sent = batch_sent
