"""SyncProducer: the Producer's API, blocking, for scripts, threads and Spark executors.

A facade over an anyio blocking portal: the producer runs on an event loop of its own, in the
portal's thread, so it works the same whether or not the calling thread runs a loop (notebooks),
and any number of threads may share one. It holds no message and no count of its own:

- ``produce()`` validates in the calling thread (``MessageRules.message``), so bad input raises
  there, at the call, against the producer's own partition counts (where it knows none for the
  topic, the first message or the first after the broker reported the topic changed, the call
  asks the loop, as an async produce would), then
  hands the message to the producer's loop (``Producer.submit_threadsafe``), where it counts in
  flight at once; while the window is full that blocks the calling thread until it has drained
  to its resume point. A nonblocking produce returns then; a blocking one waits for its ack.
- ``start()``, ``flush()``, ``close()`` and ``stats`` run on the loop through the portal.
- ``atomic_batch()`` is the producer's own, held open on the loop by one task (the portal's
  ``wrap_async_context_manager``: a Kafka transaction's lock is that task's), ended there when
  the ``with`` block ends; each ``batch.produce()`` is one call across (SyncAtomicBatch).

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
import warnings
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from producerkit import _fork
from producerkit._message import HeadersArgument, check_partition
from producerkit._options import is_positive_seconds
from producerkit._producer import Producer
from producerkit._topics import UNKNOWN
from producerkit._types import Delivery, Stats
from producerkit.errors import (
    ConfigurationError,
    LoopThreadError,
    ProducerClosed,
    ProducerkitError,
    ProduceTimeout,
)

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from anyio.from_thread import BlockingPortal
    from anyio.streams.memory import MemoryObjectReceiveStream

    from producerkit._atomic import AtomicBatch
    from producerkit.backends.base import Prepared
    from producerkit.jetstream import Expect

__all__ = ["SyncAtomicBatch", "SyncProducer"]

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

_get_ident = threading.get_ident


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
        self._timeout = self._producer.timeout
        self._loop = _LoopThread(self._producer, loop_backend_options)
        self._finalizer = weakref.finalize(self, self._loop.abandon)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Connect. Raises BrokerUnavailable within ``timeout`` if it cannot."""
        self._loop.call("start()", self._producer.start, wait=self._producer.timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Same as :meth:`Producer.flush`."""
        wait = timeout if timeout is not None else 2 * self._producer.timeout
        self._loop.call("flush()", self._producer.flush, timeout, wait=wait)

    def close(self, timeout: float | None = None) -> None:
        """Flush and close, cancel what the clients left running, stop the loop thread.

        Waits at most ``timeout`` seconds (default: the producer's timeout) for messages in
        flight; those left then fail. Raises ProduceError if any message failed.
        """
        self._finalizer.detach()
        self._loop.close(timeout)

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
        headers: HeadersArgument | None = None,
        topic: str | None = None,
        partition: int | None = None,
        nonblocking: bool = False,
        msg_id: str | None = None,
        context: Any = None,
        expect: Expect | None = None,
        timestamp: float | datetime.datetime | None = None,
    ) -> Delivery | None:
        """Same as :meth:`Producer.produce`, blocking the calling thread.

        With ``nonblocking=True`` returns once the message is handed to the producer's loop
        (waiting first while the window is full). Raises MessageError here for a bad message,
        ProducerClosed after close(), LoopThreadError on the producer's own loop thread.
        """
        loop = self._loop
        if _get_ident() == loop.thread_id:
            raise LoopThreadError(_on_loop_thread("produce()"))
        if loop.closing:
            loop.check_not_forked()
            raise ProducerClosed("produce() after close(): create a new SyncProducer")
        producer = self._producer
        message = producer.rules.message(
            value, key, headers, topic, partition, msg_id,
            context=context, expect=expect, timestamp=timestamp, reported=not nonblocking,
        )  # fmt: skip
        # The producer's count, read, never copied: it forgets one when the topic changes.
        partitions = producer._topics.counts.get(message.topic, UNKNOWN)
        if partitions == UNKNOWN:
            partitions = self._learn(message.topic)
        if message.partition is not None:
            check_partition(message.partition, partitions, message.topic)
        timeout = self._timeout
        if nonblocking:
            producer.submit_threadsafe(message, context=context, timeout=timeout + _LOOP_MARGIN)
            return None
        waiter: concurrent.futures.Future[Delivery] = concurrent.futures.Future()
        producer.submit_threadsafe(
            message, waiter=waiter, context=context, timeout=timeout + _LOOP_MARGIN
        )
        try:
            return waiter.result(timeout + _LOOP_MARGIN)
        except TimeoutError as exc:
            raise ProduceTimeout(
                f"no answer from the producer's loop within {timeout + _LOOP_MARGIN}s"
            ) from exc

    def produce_batch(
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
        """Same as :meth:`Producer.produce_batch`, blocking the calling thread until every
        message is handed off (waiting while the window is full): one hop to the producer's
        loop for the whole batch. A bad message raises here, naming its index."""
        self._loop.call(
            "produce_batch()",
            functools.partial(
                self._producer.produce_batch,
                values,
                keys=keys,
                headers=headers,
                topic=topic,
                partitions=partitions,
                msg_ids=msg_ids,
                timestamps=timestamps,
                contexts=contexts,
            ),
            # No limit: each message in flight ends by its deadline, so room always comes.
            wait=None,
        )

    def atomic_batch(
        self, topic: str | None = None, *, prepare: bool = False
    ) -> AbstractContextManager[SyncAtomicBatch]:
        """:meth:`Producer.atomic_batch` from blocking code (docs/atomic.md)::

            with producer.atomic_batch() as batch:
                batch.produce(b"order", key="user-1")

        stores the block's messages all together when it ends, or none of them (the block
        raised, or an AtomicBatchError raised at its end says why). With ``prepare`` (Kafka),
        the transaction is left open at the end for another process to commit:
        ``batch.prepared`` (see :func:`producerkit.transactions.commit_prepared_sync`). The
        batch is opened and ended on the producer's loop, and the block waits meanwhile;
        raises LoopThreadError on the producer's own loop thread, ProducerClosed after
        close()."""
        loop = self._loop
        if _get_ident() == loop.thread_id:
            raise LoopThreadError(_on_loop_thread("atomic_batch()"))
        if loop.stopped:
            loop.check_not_forked()
            raise ProducerClosed("atomic_batch() after close(): create a new SyncProducer")
        return _sync_batch(loop, _opened_batch(self._producer, topic, prepare))

    def prepare_transaction(
        self, batches: Iterable[Mapping[str, Any]], *, topic: str | None = None
    ) -> Prepared | None:
        """Write every batch of ``batches`` in one Kafka transaction and leave it open, as
        ``Producer.atomic_batch(topic, prepare=True)`` does: its handle, for another process to
        commit (:func:`producerkit.transactions.commit_prepared`), or None if there was no
        message. Each batch holds ``AtomicBatch.produce_batch``'s arguments (``values``,
        ``keys``, ``headers``, ``topic``). The calling thread draws the next batch while the
        loop writes the one before. If drawing a batch raises, the transaction is aborted and
        that error raised here; an AtomicBatchError says why the transaction was not prepared.
        The transaction's messages count in flight until it is prepared: the producer's
        ``max_in_flight_messages`` must hold them all, and its ``timeout`` the whole writing.
        """
        import anyio

        loop = self._loop
        if _get_ident() == loop.thread_id:
            raise LoopThreadError(_on_loop_thread("prepare_transaction()"))
        if loop.stopped:
            loop.check_not_forked()
            raise ProducerClosed("prepare_transaction() after close(): create a new SyncProducer")
        send, receive = anyio.create_memory_object_stream[Any](1)
        future = loop.portal.start_task_soon(_write_prepared, self._producer, receive, topic)
        failure: BaseException | None = None
        try:
            for batch in batches:
                try:
                    loop.portal.call(send.send, batch)
                except anyio.BrokenResourceError:
                    break  # the transaction ended early: its error comes with the result
        except BaseException as exc:  # drawing a batch raised: abort, then raise it
            failure = exc
            with contextlib.suppress(anyio.BrokenResourceError):
                loop.portal.call(send.send, _Abort(exc))
        finally:
            loop.portal.call(send.aclose)
        try:
            prepared: Prepared | None = future.result()
        except BaseException:
            if failure is None:
                raise
        if failure is not None:
            raise failure
        return prepared

    def _learn(self, topic: str) -> int | None:
        """The topic's partition count, asked of the producer on its loop (which starts the
        producer first); the producer learns it, as it would for an async produce."""
        partitions = self._loop.call(
            "produce()", self._producer.partitions_for, topic, wait=self._producer.timeout
        )
        return None if partitions is None else len(partitions)

    # ------------------------------------------------------------------ introspection

    @property
    def stats(self) -> Stats:
        """The producer's counters, read on its loop (one consistent snapshot)."""
        return self._loop.stats()

    @property
    def producer(self) -> Producer:
        """The asynchronous producer underneath (its methods must run on this producer's loop)."""
        return self._producer

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The producer's event loop (running in its own thread until close())."""
        return self._loop.loop

    def __repr__(self) -> str:
        return f"<Sync{repr(self._producer)[1:]}"


class SyncAtomicBatch:
    """An atomic batch of a :class:`SyncProducer` (``with producer.atomic_batch() as
    batch``): each method blocks the calling thread while the producer's loop runs the async
    batch's own (a JetStream atomic batch, or a Kafka transaction); it holds nothing else."""

    def __init__(self, loop: _LoopThread, batch: AtomicBatch) -> None:
        self._loop = loop
        self._batch = batch

    def produce(
        self,
        value: bytes | bytearray | memoryview | str,
        *,
        key: bytes | str | None = None,
        headers: Any = None,
        topic: str | None = None,
    ) -> None:
        """Add a message to the batch (the batch's ``produce``: its MessageError for a bad
        message, AtomicBatchError where the batch cannot take it)."""
        call = functools.partial(self._batch.produce, value, key=key, headers=headers, topic=topic)
        self._loop.call("atomic_batch().produce()", call, wait=None)

    def produce_batch(
        self, values: Any, *, keys: Any = None, headers: Any = None, topic: str | None = None
    ) -> None:
        """Add many messages at once (``AtomicBatch.produce_batch``'s columns)."""
        call = functools.partial(
            self._batch.produce_batch, values, keys=keys, headers=headers, topic=topic
        )
        self._loop.call("atomic_batch().produce_batch()", call, wait=None)

    @property
    def id(self) -> str:
        """The batch's id, as its backend names it (see ``AtomicBatch.id``)."""
        return self._batch.id

    @property
    def prepared(self) -> Prepared | None:
        """With ``prepare=True``, once the block ended: the transaction left open (else None)."""
        prepared: Prepared | None = self._batch.prepared
        return prepared

    def __len__(self) -> int:
        """Messages produced into the batch so far."""
        return len(self._batch)


@contextlib.contextmanager
def _sync_batch(
    loop: _LoopThread,
    opened: contextlib.AbstractAsyncContextManager[AtomicBatch],
) -> Iterator[SyncAtomicBatch]:
    with loop.portal.wrap_async_context_manager(opened) as batch:
        yield SyncAtomicBatch(loop, batch)


@contextlib.asynccontextmanager
async def _opened_batch(
    producer: Producer, topic: str | None, prepare: bool
) -> AsyncIterator[AtomicBatch]:
    """The producer's atomic batch, made and held open on its loop (its locks need the loop)."""
    async with producer.atomic_batch(topic, prepare=prepare) as batch:
        yield batch


def _on_loop_thread(call: str) -> str:
    return (
        f"SyncProducer.{call} was called on the producer's own loop thread (from an on_error "
        "or on_outcome callback?), where it could only deadlock: call it from another thread, "
        "or use the asynchronous .producer there"
    )


class _LoopThread:
    """The producer's loop in an anyio blocking portal's thread, and every call across: the
    state a SyncProducer's finalizer may still need, without the SyncProducer itself."""

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
        self._lock = threading.Lock()
        self.closing = False
        self.stopped = False
        self.forked_from: int | None = None  # the parent's pid, in a forked child
        _fork.watch(self)

    def call(
        self,
        name: str,
        function: Callable[..., Coroutine[Any, Any, T]],
        *args: Any,
        wait: float | None,
    ) -> T:
        """Run ``function(*args)`` on the loop and wait at most ``wait`` plus a margin (None:
        as long as it takes, for a call that always ends by itself)."""
        if _get_ident() == self.thread_id:
            raise LoopThreadError(_on_loop_thread(name))
        if self.stopped:
            self.check_not_forked()
            raise ProducerClosed(f"{name} after close(): create a new SyncProducer")
        future = self.portal.start_task_soon(function, *args)
        limit = None if wait is None else wait + _LOOP_MARGIN
        try:
            result: T = future.result(limit)
        except concurrent.futures.CancelledError:
            raise ProducerClosed(f"the producer closed during {name}") from None
        except TimeoutError as exc:
            if not future.cancel():
                raise  # the call's own ProduceTimeout
            raise ProduceTimeout(f"no answer from the producer's loop within {limit}s") from exc
        return result

    def check_not_forked(self) -> None:
        _fork.check(self.forked_from, "SyncProducer")

    def retire_after_fork(self, parent: int) -> None:
        """In a child process right after ``fork()``: the loop thread is gone; every later
        call raises ProducerForked, and nothing waits for the missing thread."""
        self.forked_from = parent
        self.closing = self.stopped = True

    def stats(self) -> Stats:
        if self.stopped or _get_ident() == self.thread_id:
            return self.producer.stats
        try:
            return self._ask_loop(lambda: self.producer.stats, _LOOP_MARGIN)
        except (RuntimeError, TimeoutError):  # the loop stopped, or does not answer
            return self.producer.stats

    def _ask_loop(self, function: Callable[[], T], wait: float) -> T:
        """``function()`` run on the loop as a callback, its result within ``wait`` seconds:
        RuntimeError if the loop is closed, TimeoutError if it does not answer."""
        answer: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(lambda: answer.set_result(function()))
        return answer.result(wait)

    # ------------------------------------------------------------------ close

    def close(self, timeout: float | None) -> None:
        self.check_not_forked()
        if _get_ident() == self.thread_id:
            raise LoopThreadError(_on_loop_thread("close()"))
        if timeout is not None and not is_positive_seconds(timeout):
            raise ConfigurationError(
                f"timeout must be a positive number of seconds, got {timeout!r}"
            )
        budget = self.producer.timeout if timeout is None else float(timeout)
        with self._lock:
            if self.closing:
                return
            self.closing = True
        loop_answers = True
        try:
            self.call("close()", self._close_on_loop, budget, wait=budget + _LEFTOVER_GRACE)
        except ProduceTimeout:
            loop_answers = self._loop_answers()
            raise
        finally:
            self._stop(loop_answers)

    async def _close_on_loop(self, budget: float) -> None:
        try:
            await self.producer.close(budget)
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
        if self.closing:  # closed already, or in a forked child: nothing to wait for
            return
        in_flight = self.producer.stats.in_flight
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
            self.close(min(self.producer.timeout, _ABANDONED_FLUSH))
        except ProducerkitError as exc:
            logger.warning("closing the unclosed SyncProducer: %s", exc)


def _adopt_loop_thread() -> tuple[asyncio.AbstractEventLoop, int, frozenset[asyncio.Task[Any]]]:
    """On the portal's thread: its loop, its thread id, and the portal's own tasks."""
    threading.current_thread().name = "producerkit-loop"
    return asyncio.get_running_loop(), _get_ident(), frozenset(asyncio.all_tasks())


class _Abort(NamedTuple):
    """What ``prepare_transaction`` sends the loop when drawing a batch raised."""

    error: BaseException


async def _write_prepared(
    producer: Producer, receive: MemoryObjectReceiveStream[Any], topic: str | None
) -> Prepared | None:
    """``SyncProducer.prepare_transaction`` on the loop: one task holds the transaction open
    (its lock is this task's) and writes each batch the calling thread sends."""
    async with receive:
        async with producer.atomic_batch(topic, prepare=True) as batch:
            async for item in receive:
                if isinstance(item, _Abort):
                    raise item.error
                await batch.produce_batch(**item)
        prepared: Prepared | None = batch.prepared
        return prepared
