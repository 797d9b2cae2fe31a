"""The asynchronous Producer: its settings, its lifecycle, and ``produce()``.

``produce()`` validates its arguments into a Message (``_message``) and submits it through the
one way into flight (``_submit``: topic, route, rate limit, room, admission, send); messages
from other threads are handed to the loop (``_handoff``) and submitted the same way. The window
(``_window``) owns the accounting and the deadlines; the connections (``backends``) report every
outcome back to it.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from producerkit import _fork, _logging, _security, serializers
from producerkit._atomic import AtomicBatch, OpenBatches
from producerkit._batch import columns_of
from producerkit._byte_window import ByteBoundedWindow
from producerkit._connections import (
    close_connections,
    describe_servers,
    open_connections,
    unwritten,
)
from producerkit._core import ProducerCore, active, produce_door
from producerkit._handoff import Handoff
from producerkit._lifecycle import LeftOpenGuard, StatsTimer, report_left_open
from producerkit._message import RECORD_OVERHEAD, HeadersArgument, MessageRules
from producerkit._options import (
    ProducerOptions,
    check_option_names,
    is_positive_seconds,
    producer_accepts,
)
from producerkit._rate import RateLimit
from producerkit._record import Message, Record
from producerkit._routing import new_router
from producerkit._spool import FailureReports
from producerkit._submit import Submitter
from producerkit._topics import Topics
from producerkit._types import Delivery, DeliveryCallback, Failure, Outcome, Stats
from producerkit._urls import parse_url
from producerkit._window import InFlightWindow
from producerkit.backends import Connection, spec_for
from producerkit.backends.base import AtomicParts
from producerkit.errors import (
    ConfigurationError,
    ProduceError,
    ProducerClosed,
    ProduceTimeout,
)

if TYPE_CHECKING:
    import concurrent.futures

    from producerkit import partitioners
    from producerkit.backends.base import AtomicWrites
    from producerkit.jetstream import Expect
    from producerkit.serializers import Serializer

__all__ = ["Producer"]

logger = logging.getLogger("producerkit.producer")

_NEW: Final = 0
_RUNNING: Final = 1
_CLOSING: Final = 2
_CLOSED: Final = 3

#: Messages in flight at once when the producer is not told otherwise.
DEFAULT_MAX_IN_FLIGHT_MESSAGES: Final = 1000


class Producer(ProducerCore):  # type: ignore[misc]
    """Publishes messages to Kafka, NATS, JetStream, memory or nowhere, with the same calls.

    ``async with Producer(url, topic=...) as producer:`` connects, and on leaving flushes and
    closes. ``await producer.produce(value, key=...)`` returns the broker's ack, a
    :class:`~producerkit.Delivery`; with ``nonblocking=True`` it returns once the message is
    handed off, its outcome counted in :attr:`stats` and reported by :meth:`flush`. ``url``:
    ``kafka://host:port[,...]``, ``jetstream://``, ``nats://``, ``memory://[name]`` or
    ``null://``, its query parameters backend options. Every keyword is a setting of
    :class:`~producerkit.ProducerOptions`; ``**options`` are backend options (``linger_ms``,
    ``acks``, ``create_stream``, ...). Callbacks run on the event loop; what they raise is logged.
    """

    def __init__(
        self,
        url: str,
        *,
        topic: str | None = None,
        max_in_flight_messages: int | None = None,
        timeout: float = 30.0,
        connections: int = 1,
        partitioner: str | partitioners.KeyPartitioner = "xxhash",
        keyless: str | partitioners.KeylessPartitioner | None = None,
        on_error: Callable[[Failure], object] | None = None,
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
        spool: str | None = None,
        **options: Any,
    ) -> None:
        # Every keyword but url and options is a setting (tests/test_options.py checks it).
        keywords = dict(locals())
        del keywords["self"], keywords["url"], keywords["options"]
        self.settings = ProducerOptions(**keywords)
        self._url = parse_url(url)
        self._spec = spec = spec_for(self._url.scheme)
        given = {**self._url.options, **options}
        check_option_names(
            given, self._url.scheme, producer_accepts(self._url.scheme, spec.options)
        )
        # Keywords beat URL query options, then the URL's user:password@, then the environment.
        self._options = spec.checked_options(
            _security.merge_credentials(self._url.username, self._url.password, given, spec.options)
        )
        self._limit = (
            max_in_flight_messages
            or spec.default_window(self._options)
            or DEFAULT_MAX_IN_FLIGHT_MESSAGES
        )
        self._timeout = float(timeout)
        self._rules = MessageRules(
            spec,
            self._url.scheme,
            topic,
            value_serializer=serializers.resolve(value_serializer, "value_serializer"),
            key_serializer=serializers.resolve(key_serializer, "key_serializer"),
            propagate_trace=propagate_trace,
            takes_context=on_delivery is not None,
        )
        # Imported here, not at module level: ``import producerkit`` needs no hashing library.
        from producerkit import partitioners

        key_partitioner = partitioners.resolve(partitioner)
        self._keyless = partitioners.resolve_keyless(keyless or spec.default_keyless)
        core = active()  # the core's hot path: C where it was built (see _core)
        self._router = new_router(
            core,
            key_partitioner,
            partitioners.modulo_hash(key_partitioner),
            self._keyless,
            connections,
        )
        self._rate: RateLimit | None = None
        if max_rate is not None or max_bytes_rate is not None:
            self._rate = RateLimit(max_rate, max_bytes_rate, rate_burst)
        # Untracking pays only where records wait for a batch's ack (not on null://).
        untrack = spec.holds_records
        self._failures = FailureReports(spool, on_error)
        if on_error is not None or spool is not None:
            on_error = self._failures.report
        if max_in_flight_bytes is None:
            self._window: InFlightWindow = InFlightWindow(
                self._limit, self._timeout, connections, on_error, on_outcome,
                untrack=untrack, resume_at=resume_at, unwritten=self._unwritten,
                on_delivery=on_delivery, core=core,
            )  # fmt: skip
        else:
            self._window = ByteBoundedWindow(
                self._limit, self._timeout, connections, on_error, on_outcome,
                byte_limit=max_in_flight_bytes, untrack=untrack, resume_at=resume_at,
                unwritten=self._unwritten, on_delivery=on_delivery, core=core,
            )  # fmt: skip
        self._topics = Topics(self._rules, self._timeout)
        self._reports = _Reports(self._window, self._topics.forget, self._batch_sent)
        self._submitter = Submitter(
            core, self._window, self._router, self._topics, self._rate, spec.translate_error
        )
        self._state = _NEW
        self._running = False  # the hot path's one-attribute view of _state == _RUNNING
        self._start_lock: asyncio.Lock | None = None
        self._connections: list[Connection] = []
        self._atomic_writes: AtomicWrites | None = None  # the backend's, once a batch is asked
        self._open_batches: OpenBatches | None = None  # atomic batches open, once one is
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handoff: Handoff | None = None
        self._forked_from: int | None = None  # the parent's pid, in a forked child
        #: The core's Admission while running (produce()'s plain messages), else None.
        self._admission = None
        self._stats_timer = (
            None if on_stats is None else StatsTimer(on_stats, lambda: self.stats, stats_interval)
        )
        self._left_open = LeftOpenGuard(
            self.close, lambda: self.stats, lambda: repr(self), self._timeout
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect every connection. Raises BrokerUnavailable within ``timeout`` if it cannot."""
        if self._state == _RUNNING:
            return
        self._check_not_forked()
        if self._state != _NEW:
            raise ProducerClosed("this producer is closed; create a new one")
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._state != _NEW:
                return
            self._loop = loop = asyncio.get_running_loop()
            _logging.install_default()  # the clients' repeated log lines, rate-limited
            self._failures.open()
            self._connections = await open_connections(
                self._spec,
                self._url,
                self._options,
                self._reports,
                timeout=self._timeout,
                count=self.settings.connections,
            )
            self._topics.connections = self._connections
            self._rules.max_payload = (
                min(connection.max_message_size for connection in self._connections)
                - RECORD_OVERHEAD
            )
            self._submitter.connections = self._connections
            self._submitter.sends = [connection.send for connection in self._connections]
            self._window.on_full = self._flush_connections
            self._submitter.open = True
            self._admission = self._submitter.admission(
                self._rules,
                takes_all=self._rate is None and self.settings.max_in_flight_bytes is None,
            )
            self._handoff = Handoff(loop, self._window, self._submitter.submit_handed)
            self._state = _RUNNING
            self._running = True
            if self._stats_timer is not None:
                self._stats_timer.start(loop)
            await self._left_open.start()
            _fork.watch(self)

    def __del__(self) -> None:
        # The guard above reports a producer left open; this covers a loop closed without
        # shutting down its async generators. (A constructor that raised left no _state.)
        if (
            getattr(self, "_state", _NEW) == _RUNNING
            and self._window.in_flight
            and (self._loop is None or self._loop.is_closed())
        ):
            in_flight = self._window.in_flight
            report_left_open(repr(self), in_flight, in_flight)

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
        None once the message is handed off. (On a running producer, a plain nonblocking call
        returns an awaitable that has already finished rather than a coroutine: awaiting it is
        the same, and a task can be made of it.) Raises MessageError (nothing sent) for a bad
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
        # A plain nonblocking message of a running producer went through its core's door
        # (_core.produce_door) unless the Admission declined it: here, the checked path.
        if not self._running:
            await self._ensure_running()
        message = self._rules.message(
            value, key, headers, topic, partition, msg_id,
            context=context, expect=expect, timestamp=timestamp, reported=not nonblocking,
        )  # fmt: skip
        waiter = None if nonblocking else self._loop.create_future()  # type: ignore[union-attr]
        waiting = self._submitter.submit(message, waiter, context)
        if waiting is not None:
            await waiting
        if waiter is None:
            return None
        delivery: Delivery = await waiter
        return delivery

    if not TYPE_CHECKING:
        # The class holds produce() behind the cores' doors.
        produce = produce_door(produce)

    async def produce_batch(
        self,
        values: Any,
        *,
        keys: Any = None,
        headers: Any = None,
        topic: str | None = None,
        partitions: Any = None,
        msg_ids: Any = None,
        timestamps: Any = None,
        contexts: Any = None,
    ) -> None:
        """As many ``produce(..., nonblocking=True)`` calls, in order (the same serializers,
        trace context, routing, window, rate limit and outcomes), at a fraction of their cost,
        after what other threads handed over before. Each argument but ``topic`` is a column,
        one item per message: a list, a tuple, or an Arrow array (binary or string for values,
        keys and msg_ids). Returns once all are handed off; a bad message's MessageError (a
        serializer's: SerializationError) names its index, before any is admitted."""
        if not self._running:
            await self._ensure_running()
        if self._handoff is not None:
            await self._handoff.drained()
        columns = columns_of(
            values, keys=keys, headers=headers, partitions=partitions, msg_ids=msg_ids,
            timestamps=timestamps, contexts=contexts,
        )  # fmt: skip
        await self._submitter.submit_batch(columns, topic, self._rules, self._admission)

    def atomic_batch(self, topic: str | None = None, *, prepare: bool = False) -> AtomicBatch:
        """``async with producer.atomic_batch() as batch: await batch.produce(...)``: messages
        stored all together when the block ends, or none of them: a JetStream atomic batch (a
        stream created with ``allow_atomic=True``), a Kafka transaction, or ``memory://``'s
        (for tests; docs/atomic.md; see :class:`~producerkit.AtomicBatchError`). ``prepare``
        (Kafka): leave the transaction open for another process to commit (``batch.prepared``)."""
        make_writes = self._spec.atomic_writes
        if make_writes is None:
            refusal = self._spec.atomic_batch_refusal
            raise ConfigurationError(f"atomic_batch is JetStream's and Kafka's: {refusal}")
        if self._atomic_writes is None:
            parts = AtomicParts(self._url, self._options, self._timeout, self._reports,
                                lambda: self._connections, self.partitions_for)  # fmt: skip
            self._atomic_writes = make_writes(parts)
        if prepare and (no_prepare := self._atomic_writes.prepare_refusal) is not None:
            raise ConfigurationError(f"atomic_batch(prepare=True) is Kafka's: {no_prepare}")
        if self._open_batches is None:
            self._open_batches = OpenBatches()
        return AtomicBatch(self._ensure_running, self._atomic_writes, self._submitter,
                           self._reports, self._rules, topic, self._timeout, self._open_batches,
                           prepare=prepare, admission=lambda: self._admission)  # fmt: skip

    def _flush_connections(self) -> None:
        """Every connection starts sending what waits (a full window: none will come)."""
        for connection in self._connections:
            connection.flush()

    @property
    def rules(self) -> MessageRules:
        """This producer's validation: ``rules.message(value, key, headers, topic, ...)`` is
        the Message ``produce()`` would send, or its MessageError, without I/O, in any thread
        (what facades that validate in their caller's thread, such as SyncProducer, use)."""
        return self._rules

    def submit_threadsafe(
        self,
        message: Message,
        *,
        waiter: concurrent.futures.Future[Delivery] | None = None,
        context: Any = None,
        timeout: float,
    ) -> None:
        """Hand a validated message over to this producer's loop from another thread: it is
        counted in flight at once (``waiter`` gets its Delivery or its error). Blocks while the
        window is full, at most ``timeout`` seconds (then ProduceTimeout); ProducerClosed once
        the producer is closed."""
        handoff = self._handoff
        if handoff is None or not self._running:
            self._check_not_forked()
            raise ProducerClosed("the producer is not running: start() it, or create a new one")
        handoff.put(message, waiter, context, timeout)

    async def _ensure_running(self) -> None:
        if self._state == _NEW:
            await self.start()
        if self._state != _RUNNING:
            self._check_not_forked()
            raise ProducerClosed("produce() after close(): create a new Producer")

    def _check_not_forked(self) -> None:
        _fork.check(self._forked_from, "Producer")

    def retire_after_fork(self, parent: int) -> None:
        """In a child process right after ``fork()``: stop for good without touching a
        connection (they are the parent's); every later call raises ProducerForked."""
        self._forked_from = parent
        self._state = _CLOSED
        self._running = False
        self._admission = None
        self._submitter.open = self._submitter.closing = False
        self._handoff = None
        self._connections = []
        self._left_open.forget()

    async def partitions_for(self, topic: str) -> frozenset[int] | None:
        """The partition numbers of ``topic`` (learned once, as the first produce does; a
        JetStream stream is created if ``create_stream`` is set), or None where topics are not
        partitioned (NATS subjects without ``partitions=N``)."""
        await self._ensure_running()
        count = await self._topics.learn(topic)
        return None if count is None else frozenset(range(count))

    # ------------------------------------------------------------------ what connections report

    def _unwritten(self, records: list[Record]) -> set[int]:
        return unwritten(self._connections, records)

    def _batch_sent(self, topic: str, partition: int) -> None:
        num_partitions = self._topics.counts.get(topic)
        if num_partitions:
            self._keyless.on_new_batch(topic, num_partitions, partition)

    # ------------------------------------------------------------------ flush / close

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until nothing is in flight; raise ProduceError with every failure since last time.

        With ``timeout``, raise ProduceTimeout at that deadline if messages are still in flight
        (they stay in flight and keep their own deadlines). Inside an atomic batch's block (in
        the task that opened it), the batch's messages count as acked only at its commit, when
        the block ends: ``flush()`` waits until they were written (on Kafka, answered by the
        broker), and every other message settled.
        """
        timeout = _checked_timeout(timeout)
        self._check_not_forked()
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
        if self._handoff is not None:
            await self._handoff.drained()
        self._flush_connections()
        mine = [] if self._open_batches is None else self._open_batches.of_this_task()
        if not mine:
            await self._window.wait_empty()
        else:  # inside atomic batches: theirs settle when their blocks end, after this flush
            for batch, _ in mine:
                await batch.written()
            window, pending = self._window, self._window.pending
            await window.wait_until(
                lambda: (
                    window.in_flight
                    <= sum(record.seq in pending for _, records in mine for record in records)
                )
            )
        self._failures.sync()

    async def close(self, timeout: float | None = None) -> None:
        """Flush, then close every connection.

        Waits at most ``timeout`` seconds (default: the producer's timeout) for messages in
        flight; those still unacknowledged then fail with ProduceTimeout. Raises ProduceError if
        any message failed, so ``acked + failed == produced`` always holds after close().
        """
        self._check_not_forked()
        if self._state in (_CLOSING, _CLOSED):
            return
        timeout = _checked_timeout(timeout)
        was_running = self._state == _RUNNING
        self._state = _CLOSING
        self._running = False
        self._submitter.open = False
        self._submitter.closing = True
        self._admission = None
        if self._handoff is not None:
            self._handoff.close()
        self._window.wake_room_waiters()  # they see the state and give up
        if self._rate is not None:
            self._rate.close()
        try:
            if was_running:
                try:
                    await asyncio.wait_for(self._drain(), timeout or self._timeout)
                except TimeoutError:
                    if self._handoff is not None:
                        self._handoff.abandon(
                            ProducerClosed("the producer closed before this message was sent")
                        )
                    self._window.fail_pending(
                        lambda stored: ProduceTimeout(
                            "not acknowledged before the close() deadline; "
                            + ("it may still have been stored" if stored else "never sent")
                        )
                    )
            await close_connections(self._connections)
            if self._atomic_writes is not None:
                await self._atomic_writes.close()
            self._window.fail_pending(
                lambda stored: ProducerClosed("the producer closed with this message in flight")
            )
        finally:
            self._window.stop_timer()
            if self._stats_timer is not None:
                self._stats_timer.stop()
            self._topics.cancel()
            self._failures.close()
            self._state = _CLOSED
            self._submitter.closing = False
            await self._left_open.stop()
        self._raise_failures()

    def purge(self, *, in_flight: bool = True) -> list[Failure]:
        """Fail at once every message not yet written to the broker and, with ``in_flight``
        (the default), every one waiting for its ack, with :class:`~producerkit.Purged`; return
        their Failures (``possibly_stored`` for those written), which ``flush()`` does not raise
        again. For a shutdown that must not wait (SIGTERM): save them and exit (or give the
        producer a ``spool``). Blocking callers, ``on_error`` and ``on_delivery`` are told as
        for any failure; the accounting holds; the producer stays usable."""
        # What a connection holds unwritten fails "not stored"; it drops a failed record
        # before it writes (see Connection.unwritten).
        records = list(self._window.pending.values())
        never_written = unwritten(self._connections, records)
        unsent = [record for record in records if record.seq in never_written]
        return self._window.purge(unsent, in_flight)

    def _raise_failures(self) -> None:
        error = self._window.take_failures()
        if error is not None:
            raise error

    # ------------------------------------------------------------------ introspection

    @property
    def stats(self) -> Stats:
        rate = self._rate
        return self._window.stats(
            self.settings.connections,
            rate.waits if rate is not None else 0,
            rate.wait_seconds if rate is not None else 0.0,
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
        return self.settings.topic

    @property
    def timeout(self) -> float:
        """Seconds each message may stay unacknowledged (the ``timeout`` setting)."""
        return self._timeout

    @property
    def closed(self) -> bool:
        return self._state == _CLOSED

    def __repr__(self) -> str:
        state = ("new", "running", "closing", "closed")[self._state]
        security = _security.describe(self._options)  # "tls user='alice'": never a secret
        return (
            f"<Producer {describe_servers(self._url)} topic={self.settings.topic!r} "
            f"connections={self.settings.connections} limit={self._limit} "
            f"{security + ' ' if security else ''}{state}>"
        )


def _checked_timeout(timeout: float | None) -> float | None:
    if timeout is not None and not is_positive_seconds(timeout):
        raise ConfigurationError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return None if timeout is None else float(timeout)


class _Reports:
    """What the producer's connections report into (the seam's Reports): the window settles
    each record, the producer's routing learns of topics and batches."""

    __slots__ = (
        "_window",
        "acked",
        "acked_each",
        "acked_run",
        "batch_sent",
        "failed",
        "pending",
        "topic_changed",
    )

    def __init__(
        self,
        window: InFlightWindow,
        topic_changed: Callable[[str], None],
        batch_sent: Callable[[str, int], None],
    ) -> None:
        self.acked = window.acked
        self.acked_run = window.acked_run
        self.acked_each = window.acked_each
        self.failed = window.failed
        self.pending = window.pending
        self._window = window
        self.topic_changed = topic_changed
        self.batch_sent = batch_sent

    @property
    def failed_count(self) -> int:
        return self._window.failed_count
