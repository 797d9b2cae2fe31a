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
import hashlib
import logging
import os
import pickle
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs

from producerkit._options import configurable, convert_text
from producerkit._producer import Producer
from producerkit._sync import SyncProducer
from producerkit.errors import ConfigurationError, MessageError, ProduceError, ProducerError

__all__ = ["Chunk", "Column", "SinkConfig", "TaskCounts", "publish_task"]

logger = logging.getLogger("producerkit.spark")

#: A column by name (a DataFrame's, a Row's, a dict's) or by position (a tuple's, a Row's;
#: only ``partition_writer`` takes positions: a DataFrame's columns are named).
Column = str | int

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
        """Raise ConfigurationError now (on the driver) for what would fail on every executor."""
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


#: One chunk of rows, column-wise: role -> list of Python values (bytes/str/int/None/...). A
#: value or key column that a serializer turns into bytes may hold anything it takes: structs
#: and maps as dicts, arrays as lists (plain Python, never Spark Rows).
Chunk = Mapping[str, Sequence[Any]]


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
    entry.lock.acquire()
    return entry


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
    if chunk.get("topic") is None and None not in values:
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


def _send_rows(producer: SyncProducer, chunk: Chunk, tally: _Tally, fail_fast: bool) -> None:
    values = chunk["value"]
    count = len(values)
    keys = chunk.get("key")
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
        except ProducerError as exc:  # this message only (MessageError, closed, ...)
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
    """Produce each chunk; with ``fail_fast``, stop at the first chunk after a message failed."""
    failed_before = sync.stats.failed
    for chunk in chunks:
        if not len(chunk["value"]):
            continue
        if fail_fast and sync.stats.failed > failed_before:
            break  # a message already failed: stop sending, flush reports it below
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
    except ProducerError as exc:
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


#: The roles whose values a serializer may take as structures: their maps become dicts.
_SERIALIZED_ROLES = ("value", "key")


def chunks_from_arrow(
    batches: Iterable[Any], columns: Mapping[str, Column], as_bytes: Iterable[str] = ()
) -> Iterator[Chunk]:
    """Arrow record batches -> chunks: each used column as one Python list (one C call each).

    Structs arrive as dicts, arrays as lists; maps in the value and key columns as dicts (Arrow's
    default is a list of pairs, which JSON would write as an array), elsewhere (headers) as pairs.
    A string column of an ``as_bytes`` role arrives as its UTF-8 bytes (Arrow's cast to binary
    keeps the buffers: no decoding, and bytes take the producer's fast path).
    """
    binary = frozenset(as_bytes)
    for batch in batches:
        yield {
            role: _pylist(batch.column(name), role in _SERIALIZED_ROLES, role in binary)
            for role, name in columns.items()
        }


def _pylist(column: Any, maps_as_dicts: bool, text_as_bytes: bool = False) -> list[Any]:
    if text_as_bytes:
        import pyarrow as pa

        if pa.types.is_string(column.type):
            return column.cast(pa.binary()).to_pylist()  # type: ignore[no-any-return]
        if pa.types.is_large_string(column.type):
            return column.cast(pa.large_binary()).to_pylist()  # type: ignore[no-any-return]
    if not (maps_as_dicts and _has_map(column.type)):
        return column.to_pylist()  # type: ignore[no-any-return]
    try:
        return column.to_pylist(maps_as_pydicts="strict")  # type: ignore[no-any-return]
    except TypeError:  # pyarrow < 20 has no maps_as_pydicts
        return [_maps_as_dicts(value, column.type) for value in column.to_pylist()]


def _children(arrow_type: Any) -> list[Any]:
    """The types directly inside an Arrow type (struct fields, list items, map keys/items)."""
    import pyarrow as pa

    if pa.types.is_struct(arrow_type):
        return [arrow_type.field(i).type for i in range(arrow_type.num_fields)]
    if pa.types.is_map(arrow_type):
        return [arrow_type.key_type, arrow_type.item_type]
    lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    if any(is_list(arrow_type) for is_list in lists):
        return [arrow_type.value_type]
    return []


def _has_map(arrow_type: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_map(arrow_type) or any(map(_has_map, _children(arrow_type)))


def _maps_as_dicts(value: Any, arrow_type: Any) -> Any:
    """``to_pylist()``'s value of ``arrow_type`` with every map's (key, item) pairs as a dict."""
    import pyarrow as pa

    if value is None or not _has_map(arrow_type):
        return value
    if pa.types.is_map(arrow_type):
        key_type, item_type = arrow_type.key_type, arrow_type.item_type
        return {
            _maps_as_dicts(key, key_type): _maps_as_dicts(item, item_type) for key, item in value
        }
    if pa.types.is_struct(arrow_type):
        fields = [arrow_type.field(i) for i in range(arrow_type.num_fields)]
        return {field.name: _maps_as_dicts(value[field.name], field.type) for field in fields}
    (item_type,) = _children(arrow_type)
    return [_maps_as_dicts(item, item_type) for item in value]


def chunks_from_rows(
    rows: Iterable[Any],
    columns: Mapping[str, Column],
    size: int = 10_000,
    structured: Iterable[str] = (),
    as_bytes: Iterable[str] = (),
) -> Iterator[Chunk]:
    """Rows -> chunks of ``size`` rows (the row-based writers of Sparks without Arrow ones, and
    ``partition_writer``): Spark Rows, dicts or tuples, each column read as ``row[column]``.
    The ``structured`` roles' values hold structs: each becomes plain Python (a Row a dict,
    recursively), as :func:`chunks_from_arrow` gives; other columns pay nothing. The text of
    the ``as_bytes`` roles is encoded to UTF-8 here, a chunk at a time."""
    names = list(columns.items())
    plain = frozenset(structured)
    encoded = [role for role in as_bytes if role in columns]
    buffer: dict[str, list[Any]] = {role: [] for role, _ in names}
    filled = 0
    for row in rows:
        for role, name in names:
            value = row[name]
            buffer[role].append(_plain(value) if role in plain and value is not None else value)
        filled += 1
        if filled == size:
            yield _encode_text(buffer, encoded)
            buffer = {role: [] for role, _ in names}
            filled = 0
    if filled:
        yield _encode_text(buffer, encoded)


def _encode_text(chunk: dict[str, list[Any]], roles: Iterable[str]) -> dict[str, list[Any]]:
    """Each ``roles`` column's str values as their UTF-8 bytes (what the producer would send);
    text that cannot be encoded (a lone surrogate) stays, for the producer to refuse that row."""
    for role in roles:
        try:
            chunk[role] = [value.encode() if type(value) is str else value for value in chunk[role]]
        except UnicodeEncodeError:
            chunk[role] = [_utf8_or_text(value) for value in chunk[role]]
    return chunk


def _utf8_or_text(value: Any) -> Any:
    if type(value) is not str:
        return value
    try:
        return value.encode()
    except UnicodeEncodeError:
        return value


def _plain(value: Any) -> Any:
    """A Spark value as plain Python: Rows (structs) as dicts, inside lists and dicts too."""
    as_dict = getattr(value, "asDict", None)
    if as_dict is not None:  # a pyspark Row; its asDict(recursive=True) handles what is inside
        return as_dict(recursive=True)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {name: _plain(item) for name, item in value.items()}
    return value
