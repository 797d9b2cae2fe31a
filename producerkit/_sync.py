"""SyncProducer: the Producer's API, blocking, for scripts, threads and Spark executors.

The producer runs on an event loop of its own, in a thread started by an anyio blocking portal
(asyncio backend), so it works the same whether or not the calling thread runs a loop
(notebooks), and any number of threads may share one.

Every produce is validated in the calling thread, so bad input raises there, at the call (the
first message to a topic asks the loop for its partition count once). It is then appended to a
buffer that the loop admits into the producer's window in batches: the loop is woken once when
the buffer goes non-empty, never once per message, and a nonblocking produce returns at once.
A buffered message counts as produced and in flight. The buffer and the window together hold at
most the window's limit: a produce that finds them full blocks its thread until the window has
drained to half (the window's own low-water mark) and the buffer has been admitted. A blocking
produce goes through the same buffer (so one thread's messages keep their order) and waits for
its ack; ``flush()`` and ``close()`` admit everything buffered first.

A call that would wait on the loop, made on the loop's own thread (from an ``on_error`` or
``on_outcome`` callback), could only deadlock: it raises LoopThreadError at once. ``close()``
cancels whatever the clients left running on the loop before stopping it. A SyncProducer
garbage-collected or left at interpreter exit without ``close()`` is flushed and closed within
a bounded wait, with a ResourceWarning and a log line counting the messages still in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import functools
import logging
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from producerkit import _fast
from producerkit._producer import Producer, _check_partition, _positive_number
from producerkit._types import Delivery, Stats
from producerkit.errors import (
    ConfigurationError,
    LoopThreadError,
    ProducerClosed,
    ProducerError,
    ProduceTimeout,
)

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from anyio.from_thread import BlockingPortal

    from producerkit.jetstream import Expect

__all__ = ["SyncProducer"]

logger = logging.getLogger("producerkit.producer")

T = TypeVar("T")

#: Seconds beyond the producer's own deadlines that a blocking call waits for the loop thread.
_LOOP_MARGIN = 5.0
#: Most seconds an unclosed SyncProducer spends flushing when it is collected or at exit.
_ABANDONED_FLUSH = 5.0
#: Seconds close() gives the tasks the clients left running to finish once cancelled.
_LEFTOVER_GRACE = 1.0

#: The options anyio's asyncio backend takes (it ignores any other name).
_LOOP_OPTIONS = frozenset({"debug", "loop_factory", "use_uvloop"})

_DECLINED = _fast.DECLINED
_get_ident = threading.get_ident

#: A buffered message, validated: ``(value, key, topic, partition, headers, msg_id)``; a blocking
#: produce's has a 7th field, the future its caller waits on.
Buffered = tuple[Any, ...]


class SyncProducer:
    """Blocking twin of :class:`~producerkit.Producer`; takes the same arguments.

    ``with SyncProducer(url, topic=...) as producer: producer.produce(b"v", nonblocking=True)``

    Args:
        url: as for :class:`~producerkit.Producer`.
        loop_backend_options: options of anyio's asyncio backend for the producer's loop, e.g.
            ``{"use_uvloop": True}`` (needs uvloop installed) or ``{"debug": True}``.
        **kwargs: every :class:`~producerkit.Producer` setting and backend option.
    """

    def __init__(
        self, url: str, *, loop_backend_options: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self._producer = Producer(url, **kwargs)  # validates everything before a thread starts
        self._timeout: float = self._producer._timeout
        self._topics = self._producer._topics
        producer = self._producer
        # Serializers and trace context run here, in the caller's thread (and its context).
        self._prepared = bool(
            producer._value_serializer or producer._key_serializer or producer._inject_trace
        )
        self._bridge = _LoopBridge(producer, loop_backend_options)
        self._finalizer = weakref.finalize(self, self._bridge.abandon)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Connect. Raises BrokerUnavailable within ``timeout`` if it cannot."""
        self._bridge.call("start()", self._producer.start, wait=self._timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Same as :meth:`Producer.flush`, after admitting every buffered message."""
        bridge = self._bridge
        wait = timeout if timeout is not None else 2 * self._timeout
        bridge.call("flush()", bridge.flush, timeout, wait=wait)

    def close(self, timeout: float | None = None) -> None:
        """Flush and close, cancel what the clients left running, stop the loop thread.

        Waits at most ``timeout`` seconds (default: the producer's timeout) for buffered and
        in-flight messages; those left then fail. Raises ProduceError if any message failed.
        """
        self._finalizer.detach()
        self._bridge.close(timeout)

    def __enter__(self) -> SyncProducer:
        self.start()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as close_error:
            exc.add_note(f"producerkit: also, on close: {close_error}")

    # ------------------------------------------------------------------ produce

    def produce(
        self,
        value: bytes | bytearray | memoryview | str | None,
        *,
        key: bytes | str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        topic: str | None = None,
        partition: int | None = None,
        nonblocking: bool = False,
        msg_id: str | None = None,
        context: Any = None,
        expect: Expect | None = None,
        timestamp: float | datetime.datetime | None = None,
    ) -> Delivery | None:
        """Same as :meth:`Producer.produce`, blocking the calling thread.

        With ``nonblocking=True`` returns once the message is buffered (waiting first if the
        buffer and the window are full). Raises MessageError here for a bad message,
        ProducerClosed after close(), LoopThreadError on the producer's own loop thread.
        """
        bridge = self._bridge
        if _get_ident() == bridge.thread_id:
            raise LoopThreadError(_on_loop_thread("produce()"))
        producer = self._producer
        if not producer._running:
            self._start_for_produce()
        if self._prepared:
            value, key, headers = producer._prepared(value, key, headers, topic)
        if expect is not None:
            headers = producer._with_expectation(headers, expect)
        value, key, topic, header_pairs = producer._validate(value, key, headers, topic, msg_id)
        stamp = producer._checked_extras(context, timestamp, reported=not nonblocking)
        if partition is not None or type(topic) is not str or topic not in self._topics:
            bridge.check_route(topic, partition)
        if nonblocking:
            if context is None and stamp is None:  # what the C admission takes as it is
                item: Buffered = (value, key, topic, partition, header_pairs, msg_id)
            else:
                item = (value, key, topic, partition, header_pairs, msg_id, None, context, stamp)
            bridge.put(item, self._timeout)
            return None
        # the buffer and the window may each take a whole timeout before the ack
        wait = 2 * self._timeout
        delivered: concurrent.futures.Future[Delivery] = concurrent.futures.Future()
        item = (value, key, topic, partition, header_pairs, msg_id, delivered, context, stamp)
        bridge.put(item, wait)
        try:
            return delivered.result(wait + _LOOP_MARGIN)
        except TimeoutError as exc:
            if not delivered.cancel():
                raise  # the message's own ProduceTimeout
            raise ProduceTimeout(
                f"no answer from the producer's loop within {wait + _LOOP_MARGIN}s"
            ) from exc
        except concurrent.futures.CancelledError:
            raise ProducerClosed("the producer closed before this message was sent") from None

    def _start_for_produce(self) -> None:
        if self._bridge.closing:
            raise ProducerClosed("produce() after close(): create a new SyncProducer")
        self.start()

    # ------------------------------------------------------------------ introspection

    @property
    def stats(self) -> Stats:
        """The producer's counters, buffered messages counted as produced and in flight."""
        return self._bridge.stats()

    @property
    def producer(self) -> Producer:
        """The asynchronous producer underneath (its methods must run on this producer's loop)."""
        return self._producer

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The producer's event loop (running in its own thread until close())."""
        return self._bridge.loop

    def __repr__(self) -> str:
        return f"<Sync{repr(self._producer)[1:]}"


def _on_loop_thread(call: str) -> str:
    return (
        f"SyncProducer.{call} was called on the producer's own loop thread (from an on_error "
        "or on_outcome callback?), where it could only deadlock: call it from another thread, "
        "or use the asynchronous .producer there"
    )


class _LoopBridge:
    """The loop thread (an anyio blocking portal), the buffer of produces not yet admitted, and
    every call across: the state a SyncProducer's finalizer may still need, without the
    SyncProducer itself."""

    def __init__(self, producer: Producer, backend_options: Mapping[str, Any] | None) -> None:
        # Imported here: ``import producerkit`` does not pay for anyio's thread machinery.
        from anyio.from_thread import start_blocking_portal

        if backend_options is not None and (
            not isinstance(backend_options, Mapping) or not set(backend_options) <= _LOOP_OPTIONS
        ):
            raise ConfigurationError(
                f"loop_backend_options must be a mapping of {sorted(_LOOP_OPTIONS)}, "
                f"got {backend_options!r}"
            )
        self.producer = producer
        window = producer._window
        self.window = window
        self.pending = window.pending
        self.limit = window.limit
        self._portal_context: AbstractContextManager[BlockingPortal] = start_blocking_portal(
            "asyncio", dict(backend_options or {})
        )
        try:
            self.portal = self._portal_context.__enter__()
        except Exception as exc:  # an unknown option, uvloop not installed, ...
            raise ConfigurationError(
                f"cannot start the producer's loop with loop_backend_options={backend_options!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self.loop, self.thread_id, self._portal_tasks = self.portal.call(_adopt_loop_thread)
        self.buffer: deque[Buffered] = deque()
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)
        self.room_wanted = 0  # threads waiting in put() for the buffer and window to drain
        self.draining = False  # a drainer runs or is scheduled
        self.drainer: asyncio.Task[None] | None = None
        self.closing = False
        self.stopped = False

    # ------------------------------------------------------------------ calls across

    def call(
        self, name: str, function: Callable[..., Coroutine[Any, Any, T]], *args: Any, wait: float
    ) -> T:
        """Run ``function(*args)`` on the loop and wait at most ``wait`` plus a margin."""
        if _get_ident() == self.thread_id:
            raise LoopThreadError(_on_loop_thread(name))
        if self.stopped:
            raise ProducerClosed(f"{name} after close(): create a new SyncProducer")
        future = self.portal.start_task_soon(function, *args)
        limit = wait + _LOOP_MARGIN
        try:
            result: T = future.result(limit)
        except concurrent.futures.CancelledError:
            raise ProducerClosed(f"the producer closed during {name}") from None
        except TimeoutError as exc:
            if not future.cancel():
                raise  # the call's own ProduceTimeout
            raise ProduceTimeout(f"no answer from the producer's loop within {limit}s") from exc
        return result

    def check_route(self, topic: object, partition: object) -> None:
        """Raise MessageError for a topic the producer refuses or a partition out of its range
        (the first message to a topic learns its partition count on the loop)."""
        producer = self.producer
        try:
            count = producer._topics.get(topic, -1)  # type: ignore[call-overload]
        except TypeError:  # unhashable: _partition_count names the problem
            count = -1
        if count == -1:
            count = self.call("produce()", producer._partition_count, topic, wait=producer._timeout)
        if partition is not None:
            _check_partition(partition, count, topic)  # type: ignore[arg-type]

    def put(self, item: Buffered, wait: float) -> None:
        """Buffer one message for the loop, after waiting (at most ``wait`` plus a margin) while
        the buffer and the window hold the window's limit."""
        with self.lock:
            if self.closing:
                raise ProducerClosed("produce() after close(): create a new SyncProducer")
            if len(self.buffer) + len(self.pending) >= self.limit:
                self._wait_for_room(wait)
            self.buffer.append(item)
            if self.draining:
                return
            self.draining = True
        self.loop.call_soon_threadsafe(self._start_draining)

    def _wait_for_room(self, wait: float) -> None:
        """With the lock held: block until the drainer reports room (see :meth:`_drain`)."""
        deadline = time.monotonic() + wait + _LOOP_MARGIN
        self.room_wanted += 1
        try:
            while len(self.buffer) + len(self.pending) >= self.limit:
                if self.closing:
                    raise ProducerClosed("the producer was closed while this produce waited")
                if not self.draining:
                    self.draining = True
                    self.loop.call_soon_threadsafe(self._start_draining)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ProduceTimeout(
                        f"no room in the producer's window within {wait + _LOOP_MARGIN}s"
                    )
                self.room.wait(remaining)
        finally:
            self.room_wanted -= 1

    def stats(self) -> Stats:
        """The counters, read on the loop so that buffer and window are seen at one moment."""
        if self.stopped or _get_ident() == self.thread_id:
            return self.snapshot()
        try:
            return self._ask_loop(self.snapshot, _LOOP_MARGIN)
        except (RuntimeError, TimeoutError):  # the loop stopped, or does not answer
            return self.snapshot()

    def _ask_loop(self, function: Callable[[], T], wait: float) -> T:
        """``function()`` run on the loop as a callback, its result within ``wait`` seconds:
        RuntimeError if the loop is closed, TimeoutError if it does not answer."""
        answer: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(lambda: answer.set_result(function()))
        return answer.result(wait)

    def snapshot(self) -> Stats:
        stats = self.producer.stats
        buffered = len(self.buffer)
        if not buffered:
            return stats
        return attrs.evolve(
            stats, produced=stats.produced + buffered, in_flight=stats.in_flight + buffered
        )

    # ------------------------------------------------------------------ on the loop

    def _start_draining(self) -> None:
        self.drainer = self.loop.create_task(self._drain())

    async def _drain(self) -> None:
        """Admit the buffer into the window until it is empty; then, while a thread waits for
        room and the window is full, wait for the window to drain to half, and wake them."""
        try:
            while True:
                await self._admit_buffered()
                with self.lock:
                    if self.buffer:
                        continue
                    if not self.room_wanted or len(self.pending) < self.limit:
                        self.draining = False
                        self.room.notify_all()
                        return
                try:
                    await self.producer._wait_for_room()
                except ProducerClosed:
                    with self.lock:
                        self.draining = False
                        self.room.notify_all()
                    return
        except BaseException:
            with self.lock:
                self.draining = False
                self.room.notify_all()
            raise

    async def _admit_buffered(self) -> None:
        """One pass over what the buffer holds now, each message through the producer's C
        admission where it takes it, else :meth:`_admit_one`; then the loop runs."""
        buffer = self.buffer
        producer = self.producer
        for _ in range(len(buffer)):
            item = buffer[0]
            admit = producer._admit
            if admit is not None and len(item) == 6:
                outcome = admit(*item)
                if outcome is None:
                    buffer.popleft()
                    continue
                if outcome is not _DECLINED:
                    buffer.popleft()
                    await producer._hand_off(*outcome)
                    continue
            await self._admit_one(item)
        await asyncio.sleep(0)

    async def _admit_one(self, item: Buffered) -> None:
        """The producer's own way into flight for a validated message (route, rate, room,
        admit, send). It leaves the buffer when the window admits it; if it cannot be admitted
        it fails (a blocking produce's caller gets the error instead)."""
        producer = self.producer
        value, key, topic, partition, headers, msg_id = item[:6]
        delivered, context, stamp = item[6:] if len(item) > 6 else (None, None, None)
        future = None
        if delivered is not None:
            future = self.loop.create_future()
            future.add_done_callback(functools.partial(_pass_on, delivered))
        admitted = False

        def leave_buffer() -> None:
            nonlocal admitted
            admitted = True
            self.buffer.popleft()

        try:
            if not producer._running:
                raise ProducerClosed("the producer closed before this message was sent")
            await producer._route_admit_send(
                value,
                key,
                topic,
                partition,
                headers,
                msg_id,
                producer._slot(future, context),
                stamp,
                leave_buffer,
            )
        except Exception as exc:
            if admitted:
                raise
            self.buffer.popleft()
            self._fail(item, exc)

    def _fail(self, item: Buffered, exc: Exception) -> None:
        """A buffered message that cannot be admitted: a blocking produce raises ``exc``; a
        nonblocking one is admitted and failed at once, so the window counts it, reports it to
        on_error (and on_delivery) and in flush() (it was counted in flight: the window stays
        within its limit)."""
        delivered, context, stamp = item[6:] if len(item) > 6 else (None, None, None)
        if delivered is not None:
            _settle(delivered, exc)
            return
        value, key, topic, partition, headers, msg_id = item[:6]
        slot = self.producer._slot(None, context)
        record = self.window.admit(value, key, topic, partition, headers, msg_id, 0, slot, stamp)
        self.window.failed(record, exc)

    async def _admitted(self) -> None:
        """Wait until the drainer has admitted the buffer (or given up)."""
        while self.drainer is not None and not self.drainer.done():
            await asyncio.wait((self.drainer,))

    async def flush(self, timeout: float | None) -> None:
        if timeout is not None:
            timeout = _positive_number("timeout", timeout)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await asyncio.wait_for(self._admitted(), timeout)
        except TimeoutError as exc:
            raise ProduceTimeout(
                f"flush() timed out after {timeout}s with {len(self.buffer)} message(s) not "
                "yet admitted"
            ) from exc
        if timeout is not None:
            timeout = max(timeout - (loop.time() - started), 0.001)
        await self.producer.flush(timeout)

    # ------------------------------------------------------------------ close

    def close(self, timeout: float | None) -> None:
        if _get_ident() == self.thread_id:
            raise LoopThreadError(_on_loop_thread("close()"))
        budget = self.producer._timeout if timeout is None else _positive_number("timeout", timeout)
        with self.lock:
            if self.closing:
                return
            self.closing = True
            self.room.notify_all()  # waiting produces give up
        loop_answers = True
        try:
            self.call("close()", self._close_on_loop, budget, wait=budget + _LEFTOVER_GRACE)
        except ProduceTimeout:
            loop_answers = self._loop_answers()
            raise
        finally:
            self._stop(loop_answers)

    async def _close_on_loop(self, budget: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        with contextlib.suppress(TimeoutError):  # what is still buffered fails below
            await asyncio.wait_for(self._admitted(), budget)
        if self.drainer is not None and not self.drainer.done():
            self.drainer.cancel()
            await asyncio.wait((self.drainer,))
        while self.buffer:
            self._fail(
                self.buffer.popleft(),
                ProducerClosed("the producer closed before this message was sent"),
            )
        try:
            await self.producer.close(max(deadline - loop.time(), 0.001))
        finally:
            await self._cancel_leftovers()

    async def _cancel_leftovers(self) -> None:
        """Cancel every task still on the loop but the portal's own and this one (the clients'
        readers and senders), and give them a moment to finish."""
        current = asyncio.current_task()
        leftovers = [
            task
            for task in asyncio.all_tasks()
            if task is not current and task not in self._portal_tasks
        ]
        for task in leftovers:
            task.cancel()
        if leftovers:
            _, still = await asyncio.wait(leftovers, timeout=_LEFTOVER_GRACE)
            if still:
                logger.warning("%d task(s) left running on the closed producer's loop", len(still))

    def _loop_answers(self) -> bool:
        try:
            self._ask_loop(lambda: None, _LEFTOVER_GRACE)
        except (RuntimeError, TimeoutError):
            return False
        return True

    def _stop(self, loop_answers: bool) -> None:
        """Stop the portal and join its thread; a loop that no longer answers is left to die
        with the process (its thread is a daemon) rather than hang the caller."""
        self.stopped = True
        if not loop_answers:
            logger.warning("the producer's loop did not answer: its thread is left behind")
            return
        self._portal_context.__exit__(None, None, None)

    def abandon(self) -> None:
        """The SyncProducer was garbage-collected, or the interpreter is exiting, unclosed:
        flush and close within a bounded wait, and say so."""
        if self.closing:
            return
        in_flight = len(self.buffer) + len(self.pending)
        message = (
            f"unclosed SyncProducer with {in_flight} message(s) in flight: closing it "
            f"(waiting at most {_ABANDONED_FLUSH}s); call close() or use `with`"
        )
        warnings.warn(message, ResourceWarning, stacklevel=2)
        if in_flight:
            logger.warning(message)
        if _get_ident() == self.thread_id:  # collected on its own loop: close without waiting
            self.closing = True
            self.loop.create_task(self._close_on_loop(_ABANDONED_FLUSH))
            return
        try:
            self.close(min(self.producer._timeout, _ABANDONED_FLUSH))
        except ProducerError as exc:
            logger.warning("closing the unclosed SyncProducer: %s", exc)


def _adopt_loop_thread() -> tuple[asyncio.AbstractEventLoop, int, frozenset[asyncio.Task[Any]]]:
    """On the portal's thread: its loop, its thread id, and the portal's own tasks."""
    threading.current_thread().name = "producerkit-loop"
    return asyncio.get_running_loop(), _get_ident(), frozenset(asyncio.all_tasks())


def _pass_on(
    delivered: concurrent.futures.Future[Delivery], done: asyncio.Future[Delivery]
) -> None:
    """A blocking produce's outcome, from the loop's future to its caller's."""
    if done.cancelled():
        _settle(delivered, ProducerClosed("the producer closed before this message was acked"))
        return
    exc = done.exception()
    _settle(delivered, exc if exc is not None else done.result())


def _settle(delivered: concurrent.futures.Future[Delivery], outcome: object) -> None:
    try:
        if isinstance(outcome, BaseException):
            delivered.set_exception(outcome)
        else:
            delivered.set_result(outcome)  # type: ignore[arg-type]
    except concurrent.futures.InvalidStateError:
        pass  # its caller gave up waiting
