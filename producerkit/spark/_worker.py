"""Executor side: one cached producer per (config, process), and the loop that publishes a task.

Everything that runs in a Spark Python worker is here, written once for every entry point:
``publish()`` (mapInArrow), the ``format("producerkit")`` batch and streaming writers, and
``batch_publisher`` for foreachBatch. They all hand :func:`publish_task` an iterator of column
chunks (:class:`Chunk`) and get back a :class:`TaskCounts`.

A producer is never pickled: the driver ships a :class:`SinkConfig` (plain data: a serializer
travels as its name, or as the bytes the driver pickled a callable to), and each worker builds a
:class:`~producerkit.SyncProducer` (producer + its own loop thread) on first use and keeps it for
the worker's later tasks. The cache key includes ``os.getpid()`` so a forked child never
touches its parent's loop thread (which does not exist in the child). A reaper thread closes
producers idle for ``idle_timeout`` seconds; ``atexit`` closes the rest.
"""

from __future__ import annotations

import atexit
import gc
import hashlib
import logging
import os
import pickle
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from producerkit._options import configurable, convert_text
from producerkit._producer import Producer
from producerkit._sync import SyncProducer
from producerkit.errors import ConfigurationError, MessageError, ProduceError, ProducerkitError
from producerkit.spark._chunks import Chunk, Column, chunks_from_arrow, chunks_from_rows

__all__ = [
    "Chunk",
    "Column",
    "SinkConfig",
    "TaskCounts",
    "chunks_from_arrow",
    "chunks_from_rows",
    "publish_task",
]

logger = logging.getLogger("producerkit.spark")

#: Seconds a cached producer may sit unused in a worker before the reaper closes it.
DEFAULT_IDLE_TIMEOUT = 60.0


@attrs.frozen(slots=True)
class SinkConfig:
    """What the driver ships to executors: plain, picklable data; never a producer."""

    url: str
    topic: str | None = None
    value_col: Column = "value"
    key_col: Column | None = "key"
    topic_col: Column | None = None
    partition_col: Column | None = None
    headers_col: Column | None = None
    id_col: Column | None = None
    on_error: Literal["fail", "count"] = "fail"
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    #: Each row stored once, whatever Spark retries (``producerkit.spark._exactly_once``):
    #: Kafka transactions the driver commits, or JetStream message ids from each row's place.
    exactly_once: bool = False
    #: The longest an exactly-once job (or micro-batch) may take, in seconds (None: 900).
    exactly_once_timeout: float | None = None
    #: Producer keyword arguments (settings and backend options), sorted by name.
    producer_kwargs: tuple[tuple[str, Any], ...] = ()
    #: A built-in serializer's name ("json", "str", "bytes"), or a callable as the bytes the
    #: driver pickled it to (see ``_publish.ship_serializer``); None: the column's own bytes.
    value_serializer: str | bytes | None = None
    key_serializer: str | bytes | None = None

    def __attrs_post_init__(self) -> None:
        if self.on_error not in ("fail", "count"):
            raise ConfigurationError(f'on_error must be "fail" or "count", got {self.on_error!r}')

    def columns(self) -> dict[str, Column]:
        """Role (value, key, topic, partition, headers, id) -> DataFrame column, for used roles."""
        roles = {
            "value": self.value_col,
            "key": self.key_col,
            "topic": self.topic_col,
            "partition": self.partition_col,
            "headers": self.headers_col,
            "id": self.id_col,
        }
        return {role: column for role, column in roles.items() if column is not None}

    def byte_roles(self) -> tuple[str, ...]:
        """The value/key roles without a serializer: their text may travel as its UTF-8 bytes
        (what the producer would send for it), which takes the producer's fast path."""
        return tuple(role for role, serializer in self._serializers().items() if serializer is None)

    def roles_taking_structures(self) -> tuple[str, ...]:
        """The value/key roles whose serializer takes structures (a Row becomes a dict for it):
        any but none, ``"str"`` and ``"bytes"``."""
        return tuple(
            role
            for role, serializer in self._serializers().items()
            if serializer is not None and serializer not in ("str", "bytes")
        )

    def _serializers(self) -> dict[str, Any]:
        return {"value": self.value_serializer, "key": self.key_serializer}

    def cache_key(self) -> str:
        # repr of a frozen attrs instance of plain values is stable; sha keeps keys short
        return hashlib.sha256(repr(self).encode()).hexdigest()[:24]

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SinkConfig:
        fields = dict(data)
        fields["producer_kwargs"] = tuple(tuple(pair) for pair in fields.get("producer_kwargs", ()))
        return cls(**fields)

    def producer_arguments(self) -> dict[str, Any]:
        kwargs = dict(self.producer_kwargs)
        for field in configurable():  # options from format("producerkit") arrive as strings
            text = kwargs.get(field.name)
            if isinstance(text, str) and field.metadata["text"] is not str:
                kwargs[field.name] = convert_text(field.name, text, f"option {field.name}")
        for name in ("value_serializer", "key_serializer"):
            shipped = getattr(self, name)
            if shipped is not None:
                kwargs[name] = _unship(name, shipped)
        return kwargs

    def check(self) -> None:
        """Raise ConfigurationError now (on the driver) for what would fail on every executor:
        first a name the sink does not take, with what it does take."""
        from producerkit.spark._options import check_sink_options

        check_sink_options(self.url, dict(self.producer_kwargs))
        Producer(self.url, topic=self.topic, **self.producer_arguments())
        if self.topic is None and self.topic_col is None:
            raise ConfigurationError("no topic: pass topic= (and/or topic_col= for one per row)")

    def make_producer(self) -> SyncProducer:
        return SyncProducer(self.url, topic=self.topic, **self.producer_arguments())


def _unship(name: str, shipped: str | bytes) -> Any:
    """A serializer as the driver shipped it: a name as it is, a pickled callable unpickled."""
    if isinstance(shipped, str):
        return shipped
    try:
        return pickle.loads(shipped)
    except Exception as exc:
        raise ConfigurationError(
            f"the {name} could not be unpickled in this Python worker: {type(exc).__name__}: "
            f"{exc}. A function defined in a module travels by reference: the executors must "
            "be able to import that module (install it there, or SparkContext.addPyFile); one "
            "defined in the driver's script or inside a function travels by value."
        ) from exc


@attrs.frozen(slots=True)
class TaskCounts:
    """What one task (one attempt at a Spark partition) published."""

    rows: int = 0
    delivered: int = 0
    failed: int = 0
    errors: Mapping[str, int] = attrs.field(factory=dict)
    first_error: str | None = None


#: How often (seconds) a task with ``on_error="fail"`` asks its producer whether a message
#: failed, between chunks: each ask is a hop to the producer's loop and a Stats snapshot (which
#: counts the records in flight one by one). Asked before every chunk, that was 4-5% of the
#: worker's CPU; a task that failed is retried whole, so sending on for half a second more only
#: adds rows that the retry sends again anyway.
_FAILURE_CHECK_INTERVAL = 0.5


# ---------------------------------------------------------------------- the producer cache


class _Entry:
    def __init__(self, producer: SyncProducer) -> None:
        self.producer = producer
        self.pid = os.getpid()
        self.lock = threading.Lock()  # held for a whole task: a task's counts are its own
        self.last_used = time.monotonic()


_cache: dict[str, _Entry] = {}
_cache_lock = threading.Lock()
_reaper_pid: int | None = None
#: The process in which :func:`freeze_long_lived` froze objects (None: none).
_frozen_in: int | None = None
#: Calls of :func:`freeze_long_lived` in ``_frozen_in`` since its first freeze, that one's
#: included.
_calls_since_freeze = 0
_atexit_registered = False


def _lease(config: SinkConfig) -> _Entry:
    """The cached producer for ``config`` in this process (built on first use), locked."""
    key = f"{os.getpid()}:{config.cache_key()}"
    with _cache_lock:
        _drop_forked_entries()
        entry = _cache.get(key)
        if entry is None:
            producer = config.make_producer()
            try:
                producer.start()
            except BaseException:
                _close_quietly(producer)
                raise
            entry = _cache[key] = _Entry(producer)
            _start_housekeeping(config.idle_timeout)
        freeze_long_lived()
    entry.lock.acquire()
    return entry


def freeze_long_lived() -> None:
    """In a reused Spark Python worker, exempt what it holds now from the garbage collector (a
    collection, then ``gc.freeze``): at the first call in the process, then at the 2nd, 4th,
    8th, ... Called by each task as it leases a producer, and by ``format("producerkit")`` each
    time Spark asks the driver's Python workers for its writer (twice per micro-batch).

    PySpark's daemon runs a full ``gc.collect()`` in a reused worker after every task, and a
    full collection visits everything the worker holds: pyspark's, pandas', pyarrow's and the
    producer's objects (docs/performance.md has what that cost). Frozen, they are left out of
    the later collections, which visit only what later tasks allocate; the freezes after the
    first take in what the worker imports or keeps later. A frozen object is still freed when
    nothing refers to it; one that becomes garbage in a cycle is kept until
    :func:`_close_quietly` unfreezes all as a cached producer closes: a bounded amount, a freeze
    coming at each doubling of the calls. Nothing is done outside a reused worker
    (``SPARK_REUSE_WORKER``, set by Spark for its daemon's workers).
    """
    global _frozen_in, _calls_since_freeze
    if not os.environ.get("SPARK_REUSE_WORKER"):
        return
    if _frozen_in != os.getpid():
        _frozen_in, _calls_since_freeze = os.getpid(), 0
    _calls_since_freeze += 1
    if _calls_since_freeze & (_calls_since_freeze - 1) == 0:  # 1, 2, 4, 8, ...
        gc.collect()
        gc.freeze()


def _unfreeze() -> None:
    """Undo :func:`freeze_long_lived` in this process (nothing if it froze nothing here)."""
    global _frozen_in
    if _frozen_in == os.getpid():
        _frozen_in = None
        gc.unfreeze()


def _release(entry: _Entry) -> None:
    entry.last_used = time.monotonic()
    entry.lock.release()


def _discard(entry: _Entry) -> None:
    with _cache_lock:
        for key, cached in list(_cache.items()):
            if cached is entry:
                del _cache[key]


def _drop_forked_entries() -> None:
    """Forget producers inherited through fork(): their loop threads exist only in the parent."""
    pid = os.getpid()
    for key, entry in list(_cache.items()):
        if entry.pid != pid:
            del _cache[key]


def _start_housekeeping(idle_timeout: float) -> None:
    global _reaper_pid, _atexit_registered
    if not _atexit_registered:
        atexit.register(close_all)
        _atexit_registered = True
    if _reaper_pid == os.getpid():
        return
    _reaper_pid = os.getpid()
    interval = max(0.5, min(idle_timeout / 2, 10.0))
    threading.Thread(
        target=_reap, args=(idle_timeout, interval), name="producerkit-spark-reaper", daemon=True
    ).start()


def _reap(idle_timeout: float, interval: float) -> None:
    while True:
        time.sleep(interval)
        now = time.monotonic()
        idle: list[_Entry] = []
        with _cache_lock:
            for key, entry in list(_cache.items()):
                if now - entry.last_used >= idle_timeout and entry.lock.acquire(blocking=False):
                    del _cache[key]
                    idle.append(entry)
        for entry in idle:
            _close_quietly(entry.producer)


def close_all() -> None:
    """Close every producer this process cached (at exit; also handy in tests)."""
    with _cache_lock:
        entries = [entry for entry in _cache.values() if entry.pid == os.getpid()]
        _cache.clear()
    for entry in entries:
        _close_quietly(entry.producer, timeout=5.0)


def _close_quietly(producer: SyncProducer, timeout: float | None = None) -> None:
    try:
        producer.close(timeout)
    except Exception:
        logger.debug("error closing a cached producer", exc_info=True)
    finally:
        _unfreeze()  # the closed producer's cycles may be collected (freeze_long_lived)


# ---------------------------------------------------------------------- publishing one task


class _Tally:
    def __init__(self) -> None:
        self.rows = 0
        self.failed = 0
        self.errors: dict[str, int] = {}
        self.first_error: str | None = None

    def fail(self, exc: BaseException, count: int = 1) -> None:
        self.failed += count
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + count
        if self.first_error is None:
            self.first_error = f"{name}: {exc}"

    def counts(self) -> TaskCounts:
        return TaskCounts(
            self.rows, self.rows - self.failed, self.failed, dict(self.errors), self.first_error
        )


def _send_chunk(producer: SyncProducer, chunk: Chunk, tally: _Tally, fail_fast: bool) -> None:
    """Produce every row of ``chunk``: as one batch (one hop to the producer's loop, whose
    window bounds what is in flight) where every row has a value and the topic is the same;
    else, or where a row is refused, row by row, each refused row counted."""
    values = chunk["value"]
    if chunk.get("topic") is None and not _has_null(values):
        headers, ids = chunk.get("headers"), chunk.get("id")
        try:
            producer.produce_batch(
                values,
                keys=chunk.get("key"),
                partitions=chunk.get("partition"),
                headers=None if headers is None else [_headers(item) for item in headers],
                msg_ids=None if ids is None else [_msg_id(item) for item in ids],
            )
        except MessageError:
            pass  # nothing of it was admitted: row by row, to count each row refused
        else:
            tally.rows += len(values)
            return
    _send_rows(producer, chunk, tally, fail_fast)


def _has_null(values: Sequence[Any]) -> bool:
    """Whether a value column (a list, or an Arrow array) holds a null."""
    if isinstance(values, list):
        return None in values
    return bool(values.null_count)  # type: ignore[attr-defined]


def _as_list(column: Sequence[Any] | None) -> Sequence[Any] | None:
    """A column as Python values, indexable row by row (an Arrow array's items are Arrow
    scalars): the row-by-row path only."""
    if column is None or isinstance(column, list):
        return column
    return column.to_pylist()  # type: ignore[attr-defined,no-any-return]


def _send_rows(producer: SyncProducer, chunk: Chunk, tally: _Tally, fail_fast: bool) -> None:
    values = _as_list(chunk["value"])
    assert values is not None
    count = len(values)
    keys = _as_list(chunk.get("key"))
    topics = chunk.get("topic")
    partitions = chunk.get("partition")
    headers = chunk.get("headers")
    ids = chunk.get("id")
    produce = producer.produce
    for i in range(count):
        tally.rows += 1
        try:
            value = values[i]
            if value is None:
                raise MessageError("the value column is null (producerkit sends no tombstones)")
            produce(
                value,
                key=keys[i] if keys is not None else None,
                topic=topics[i] if topics is not None else None,
                partition=partitions[i] if partitions is not None else None,
                # pairs, not a dict: Kafka headers may repeat a name; produce() takes both
                headers=_headers(headers[i]) if headers is not None else None,
                msg_id=_msg_id(ids[i]) if ids is not None else None,
                nonblocking=True,
            )
        except ProducerkitError as exc:  # this message only (MessageError, closed, ...)
            tally.fail(exc)
            if fail_fast:
                raise


def _headers(value: Any) -> list[tuple[str, Any]] | None:
    """Spark's Kafka sink shape (list of {key, value} structs) or a map, as (name, value) pairs."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return list(value.items())
    pairs = []
    for item in value:
        if isinstance(item, Mapping):
            pairs.append((item["key"], item["value"] if item["value"] is not None else b""))
        else:
            name, data = item
            pairs.append((name, data if data is not None else b""))
    return pairs


def _msg_id(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def publish_task(config: SinkConfig, chunks: Iterable[Chunk]) -> TaskCounts:
    """Publish every row of one task, flush, and return its counts.

    With ``on_error="fail"`` a failed message raises ProduceError (so Spark retries the task);
    with ``"count"`` failures are counted and the task succeeds. While one chunk is being
    produced on the producer's loop, the next one is converted here (double buffering).
    """
    fail_fast = config.on_error == "fail"
    tally = _Tally()
    entry = _lease(config)
    sync = entry.producer
    keep = True
    try:
        _send_chunks(sync, chunks, tally, fail_fast)
        keep = _flush_counting(entry, tally)
    except BaseException:
        # the task dies mid-way: flush what was sent so the next task starts clean
        try:
            sync.flush()
        except Exception:
            keep = False
            _discard(entry)
            _close_quietly(sync, timeout=1.0)
        raise
    finally:
        if keep:
            _release(entry)
    counts = tally.counts()
    if fail_fast and counts.failed:
        raise ProduceError(
            [], f"{counts.failed} of {counts.rows} message(s) failed; first: {counts.first_error}"
        )
    return counts


def _send_chunks(
    sync: SyncProducer, chunks: Iterable[Chunk], tally: _Tally, fail_fast: bool
) -> None:
    """Produce each chunk; with ``fail_fast``, stop at the first chunk after a message failed
    (asked of the producer between chunks, at most every ``_FAILURE_CHECK_INTERVAL`` seconds:
    a Stats snapshot per 10,000-row chunk cost more than the rest of the worker's own code)."""
    failed_before = sync.stats.failed if fail_fast else 0
    checked = time.monotonic()
    for chunk in chunks:
        if not len(chunk["value"]):
            continue
        if fail_fast and time.monotonic() - checked >= _FAILURE_CHECK_INTERVAL:
            if sync.stats.failed > failed_before:
                break  # a message already failed: stop sending, flush reports it below
            checked = time.monotonic()
        _send_chunk(sync, chunk, tally, fail_fast)


def _flush_counting(entry: _Entry, tally: _Tally) -> bool:
    """Flush, counting each failure; whether the cached producer may be kept. A flush that
    itself times out closes the producer (failing what is left) and raises if nothing failed."""
    sync = entry.producer
    try:
        sync.flush()
    except ProduceError as exc:
        for failure in exc.failures:
            tally.fail(failure.exception)
    except ProducerkitError as exc:
        _discard(entry)
        try:
            sync.close(timeout=1.0)
        except ProduceError as close_exc:
            for failure in close_exc.failures:
                tally.fail(failure.exception)
        else:
            raise exc from None
        return False
    return True
