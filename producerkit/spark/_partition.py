"""``partition_writer``: a function for ``df.foreachPartition`` that publishes the partition's rows.

For jobs that already have their own per-partition code. On the driver, :func:`partition_writer`
checks everything and returns a closure of plain data (``_entry.make_partition_writer``); on the
executor, :func:`write_rows` turns the rows into chunks and publishes them with the worker's
cached producer through :func:`~producerkit.spark._worker.publish_task`, the code every other
entry point runs. The counts reach the driver through :class:`PartitionCounters` (Spark
accumulators) and/or ``report_path`` (one JSON line per task, summed by :func:`read_report`).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from producerkit.errors import ConfigurationError
from producerkit.spark._publish import (
    PublishReport,
    check_python,
    driver_python,
    make_config,
    register_entry_by_value,
    task_rates,
    with_settings,
)
from producerkit.spark._worker import (
    DEFAULT_IDLE_TIMEOUT,
    Column,
    SinkConfig,
    TaskCounts,
    chunks_from_rows,
    publish_task,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["PartitionCounters", "partition_writer", "read_report", "write_rows"]


class PartitionCounters:
    """Rows, delivered and failed of every ``partition_writer`` task, as Spark accumulators.

    Create it on the driver and pass it as ``counters=``; read it after the action. Spark applies
    an action's accumulator updates once per partition (a failed attempt's are dropped, a
    retried or speculative partition counts once), so after ``df.foreachPartition(...)`` they
    are the successful attempts' counts. Used inside a transformation instead (``mapPartitions``
    that is recomputed), a partition may be counted more than once.
    """

    def __init__(self, spark: SparkSession) -> None:
        context = spark.sparkContext
        self._accumulators = tuple(context.accumulator(0) for _ in range(3))

    @property
    def rows(self) -> int:
        return int(self._accumulators[0].value)

    @property
    def delivered(self) -> int:
        return int(self._accumulators[1].value)

    @property
    def failed(self) -> int:
        return int(self._accumulators[2].value)

    def __repr__(self) -> str:
        return (
            f"PartitionCounters(rows={self.rows}, delivered={self.delivered}, failed={self.failed})"
        )


@with_settings
def partition_writer(
    url: str,
    *,
    value_col: Column = "value",
    key_col: Column | None = "key",
    topic_col: Column | None = None,
    partition_col: Column | None = None,
    headers_col: Column | None = None,
    id_col: Column | None = None,
    on_error: Literal["fail", "count"] = "fail",
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    exactly_once: bool = False,
    exactly_once_timeout: float | None = None,
    counters: PartitionCounters | None = None,
    report_path: str | None = None,
    **options: Any,
) -> Callable[[Iterable[Any]], None]:
    """A function for ``df.foreachPartition(...)`` / ``rdd.foreachPartition(...)`` publishing
    each row of the partition, with :func:`~producerkit.spark.publish`'s arguments.

    Rows may be Spark Rows or dicts (columns by name) or tuples (columns by position:
    ``value_col=1, key_col=0``); the default ``key`` column is used when the rows have one. Each
    task publishes with its Python worker's cached producer, flushes before the partition ends,
    and with ``on_error="fail"`` raises if a message failed, so Spark retries the task (with
    ``id_col`` on JetStream a retry is deduplicated: exactly-once, as with ``publish()``).

    The function holds plain data only (never a producer) and pickles with cloudpickle.
    Everything is checked here, on the driver, except the columns, which are checked against
    each partition's first row.

    Args:
        counters: a :class:`PartitionCounters` the successful tasks add their counts to.
        exactly_once: refused (ConfigurationError): see :func:`~producerkit.spark.publish`.
        report_path: a file each successful task appends its counts to, as one JSON line
            (a path every executor can write, e.g. a shared filesystem; local modes share the
            driver's); :func:`read_report` sums it.
        **options: as :func:`~producerkit.spark.publish`'s: every Producer setting (with the
            Spark defaults) and backend options. ``max_rate``: most messages per second for
            the whole job, divided over the task slots
            (:func:`~producerkit.spark._publish.task_rates`; the partition count is not known
            here, so a job of fewer partitions than slots runs below it). Needs an active
            SparkSession. ``max_bytes_rate``: likewise in bytes per second.
    """
    if exactly_once:
        raise ConfigurationError(
            "partition_writer does not take exactly_once: foreachPartition has no driver step "
            "to commit the tasks' transactions; use publish(..., exactly_once=True)"
        )
    del exactly_once_timeout  # declared as every way into the sink declares it
    spark = _active_session()
    if spark is not None:
        check_python(spark)
    max_rate, max_bytes_rate = options.pop("max_rate", None), options.pop("max_bytes_rate", None)
    if max_rate is not None or max_bytes_rate is not None:
        if spark is None:
            raise ConfigurationError(
                "max_rate and max_bytes_rate are per job and split over its tasks: create the "
                "SparkSession before partition_writer(...)"
            )
        options.update(task_rates(spark, max_rate, max_bytes_rate))
    config = make_config(
        url,
        value_col=value_col,
        key_col=key_col,
        topic_col=topic_col,
        partition_col=partition_col,
        headers_col=headers_col,
        id_col=id_col,
        on_error=on_error,
        idle_timeout=idle_timeout,
        **options,
    )
    write = {
        "sink": config.to_dict(),
        "key_given": key_col != "key",
        "counters": counters._accumulators if counters is not None else None,
        "report_path": os.path.abspath(report_path) if report_path is not None else None,
    }
    from producerkit.spark._entry import make_partition_writer

    register_entry_by_value()
    function: Callable[[Iterable[Any]], None] = make_partition_writer(write, driver_python())
    return function


def _active_session() -> SparkSession | None:
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


# ---------------------------------------------------------------------- on the executor

_NO_ROWS = object()


def write_rows(write: Mapping[str, Any], rows: Iterable[Any]) -> TaskCounts:
    """Publish one partition's rows as ``partition_writer`` configured (``write``), then add the
    counts to its accumulators and report file."""
    started = time.time()  # wall clock: read_report compares the tasks' times across workers
    sink = SinkConfig.from_dict(write["sink"])
    iterator = iter(rows)
    first = next(iterator, _NO_ROWS)
    if first is _NO_ROWS:
        counts = TaskCounts()
    else:
        columns = _row_columns(first, sink.columns(), bool(write["key_given"]))
        chunks = chunks_from_rows(
            itertools.chain([first], iterator),
            columns,
            structured=sink.roles_taking_structures(),
            as_bytes=sink.byte_roles(),
        )
        counts = publish_task(sink, chunks)
    if write["counters"] is not None:
        for accumulator, count in zip(
            write["counters"], (counts.rows, counts.delivered, counts.failed), strict=True
        ):
            accumulator.add(count)
    if write["report_path"] is not None:
        _append_report(write["report_path"], counts, started, time.time())
    return counts


def _row_columns(row: Any, columns: Mapping[str, Column], key_given: bool) -> dict[str, Column]:
    """The columns a partition's rows are read by, checked against its first row: names for a
    Row or a dict, positions for a tuple or a Row; the default ``key`` dropped if absent."""
    names = row.keys() if isinstance(row, Mapping) else getattr(row, "__fields__", None)
    size = None if isinstance(row, Mapping) else len(row)
    used: dict[str, Column] = {}
    for role, column in columns.items():
        if isinstance(column, int):
            found = size is not None and -size <= column < size
        else:
            found = names is not None and column in names
        if not found and role == "key" and not key_given:
            continue
        if not found:
            shape = f"fields {list(names)}" if names is not None else f"a tuple of {size}"
            raise ConfigurationError(
                f"{role}_col={column!r} is not in the partition's rows ({shape}): name a field "
                "of a Row or dict, or give a position for tuples (value_col=1, key_col=0)"
            )
        used[role] = column
    return used


def _append_report(path: str, counts: TaskCounts, started: float, ended: float) -> None:
    """One JSON line for this task, written with one O_APPEND write (tasks write concurrently);
    ``started`` and ``ended`` are the task's wall-clock times (``time.time()``)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    line = {
        "stage": context.stageId() if context is not None else -1,
        "partition": context.partitionId() if context is not None else -1,
        "attempt": context.attemptNumber() if context is not None else 0,
        "rows": counts.rows,
        "delivered": counts.delivered,
        "failed": counts.failed,
        "errors": dict(counts.errors),
        "first_error": counts.first_error,
        "started": started,
        "ended": ended,
    }
    data = (json.dumps(line) + "\n").encode()
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, data)
    finally:
        os.close(descriptor)


def read_report(path: str) -> PublishReport:
    """The report of the last ``foreachPartition`` job that appended to ``path`` (its highest
    Spark stage): each partition counted once (its first successful attempt in the file).

    Its ``seconds`` run from the first of the job's tasks to start to the last to end (wall
    clock, so across machines as far as their clocks agree); 0 for a file without times."""
    with open(path, encoding="utf-8") as file:
        lines = [json.loads(line) for line in file if line.strip()]
    if not lines:
        return PublishReport(delivered=0, failed=0)
    stage = max(line["stage"] for line in lines)
    job = [line for line in lines if line["stage"] == stage]
    first: dict[int, Mapping[str, Any]] = {}
    for line in job:
        first.setdefault(line["partition"], line)
    timed = [line for line in job if "started" in line and "ended" in line]
    seconds = 0.0
    if timed:
        seconds = max(line["ended"] for line in timed) - min(line["started"] for line in timed)
    return PublishReport.from_rows(first.values(), max(seconds, 0.0))
