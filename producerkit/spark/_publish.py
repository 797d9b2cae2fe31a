"""Driver side: ``publish(df, url, ...)``, its report, and ``batch_publisher`` for foreachBatch.

``publish`` ships a :class:`~producerkit.spark._worker.SinkConfig` to the executors with
``mapInArrow``; each task publishes its rows with the worker's cached producer, flushes, and
yields one result row. The driver collects those rows: the counts come back through the job's
results, so a retried or speculative task is counted once (accumulators could count it twice).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import attrs

from producerkit._options import SPARK_DEFAULTS, ProducerOptions
from producerkit.errors import ConfigurationError
from producerkit.spark._worker import DEFAULT_IDLE_TIMEOUT, SinkConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from producerkit.serializers import Serializer

__all__ = [
    "SINK_KEYWORDS",
    "PartitionReport",
    "PublishReport",
    "batch_publisher",
    "make_config",
    "publish",
    "spark_default",
    "stream_writer",
    "task_rates",
    "with_settings",
]

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("producerkit.spark")

_STRINGS = ("string", "binary")


@attrs.frozen(slots=True)
class PartitionReport:
    """What the successful attempt of one Spark partition published."""

    partition: int
    rows: int
    delivered: int
    failed: int
    attempt: int = 0


@attrs.frozen(slots=True)
class PublishReport:
    """Delivered and failed counts of one publish, in total and per Spark partition.

    ``delivered + failed == rows`` (the DataFrame's row count). Rows an earlier, failed attempt of
    a task published are not in these counts: with ``exactly_once`` they were aborted (Kafka) or
    dropped as duplicates (JetStream, as with ``id_col``); else they may be stored twice
    (at-least-once).
    """

    delivered: int
    failed: int
    partitions: tuple[PartitionReport, ...] = ()
    errors: Mapping[str, int] = attrs.field(factory=dict)
    first_error: str | None = None
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return self.delivered + self.failed

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def retried_partitions(self) -> int:
        """Partitions whose counted attempt was not the first (an earlier attempt failed)."""
        return sum(1 for partition in self.partitions if partition.attempt > 0)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], seconds: float = 0.0) -> PublishReport:
        """Sum per-task result rows (partition, attempt, rows, delivered, failed, errors, ...)."""
        partitions = []
        errors: dict[str, int] = {}
        first_error = None
        for row in rows:
            partitions.append(
                PartitionReport(
                    int(row["partition"]),
                    int(row["rows"]),
                    int(row["delivered"]),
                    int(row["failed"]),
                    int(row["attempt"]),
                )
            )
            row_errors = row["errors"]
            if isinstance(row_errors, str):
                row_errors = json.loads(row_errors)
            for name, count in (row_errors or {}).items():
                errors[name] = errors.get(name, 0) + int(count)
            if first_error is None and row["first_error"]:
                first_error = str(row["first_error"])
        partitions.sort(key=lambda report: report.partition)
        return cls(
            delivered=sum(report.delivered for report in partitions),
            failed=sum(report.failed for report in partitions),
            partitions=tuple(partitions),
            errors=errors,
            first_error=first_error,
            seconds=seconds,
        )

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["rows"] = self.rows
        return data

    def __str__(self) -> str:
        text = (
            f"{self.delivered} delivered, {self.failed} failed over {len(self.partitions)} "
            f"partition(s) in {self.seconds:.2f}s ({self.rows_per_second:,.0f} rows/s)"
        )
        if self.errors:
            text += f"; errors: {dict(self.errors)}; first: {self.first_error}"
        return text


#: The sink's own keywords: :class:`SinkConfig`'s fields but the URL and what the Producer
#: settings give (``topic``, the serializers, ``producer_kwargs``). Every other keyword of a
#: publish is a Producer setting (:class:`~producerkit._options.ProducerOptions`) or a backend
#: option. ``on_error`` is the sink's own (``"fail"`` or ``"count"``), not the setting's callback.
SINK_KEYWORDS: Final = tuple(
    field.name
    for field in attrs.fields(SinkConfig)
    if field.name == "on_error"
    or field.name not in ("url", "producer_kwargs", *attrs.fields_dict(ProducerOptions))
)


def spark_default(name: str) -> Any:
    """The default of the Producer setting ``name`` in the Spark sink: SPARK_DEFAULTS' where it
    names one, else ProducerOptions' own."""
    if name in SPARK_DEFAULTS:
        return SPARK_DEFAULTS[name]
    return attrs.fields_dict(ProducerOptions)[name].default


def with_settings(function: F) -> F:
    """``function``, which takes the Producer settings as ``**options``, with a signature that
    names each one with its Spark default after the function's own keywords (for ``help()``,
    editors and ``inspect``; calls are unchanged). A setting the function declares itself
    (``on_error``) stays its own."""
    signature = inspect.signature(function)
    *own, rest = signature.parameters.values()
    assert rest.kind is inspect.Parameter.VAR_KEYWORD, function
    names = {parameter.name for parameter in own}
    settings = [
        inspect.Parameter(
            field.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=spark_default(field.name),
            annotation=field.type,
        )
        for field in attrs.fields(ProducerOptions)
        if field.name not in names
    ]
    function.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*own, *settings, rest]
    )
    return function


def make_config(url: str, **options: Any) -> SinkConfig:
    """Validate everything on the driver (a Producer is built, not started) and freeze it: the
    one place every way into the sink (``publish()``, ``partition_writer()``,
    ``batch_publisher()``, ``format("producerkit")``) turns its keywords into a SinkConfig.

    ``options``: the sink's own (:data:`SINK_KEYWORDS`), Producer settings (the Spark defaults,
    :data:`~producerkit._options.SPARK_DEFAULTS`, for those not given; None means the Producer's
    own default) and backend options.
    """
    sink = {name: options.pop(name) for name in SINK_KEYWORDS if name in options}
    if callable(sink.get("on_error")):
        raise ConfigurationError('the Spark sink takes on_error="fail" or "count", not a callback')
    if "idle_timeout" in sink:
        sink["idle_timeout"] = float(sink["idle_timeout"])
    if sink.get("exactly_once_timeout") is not None:
        sink["exactly_once_timeout"] = _seconds(sink["exactly_once_timeout"])
    if "exactly_once" in sink:
        sink["exactly_once"] = _flag(sink["exactly_once"], "exactly_once")
    settings = {**SPARK_DEFAULTS, **options}
    kwargs = {name: value for name, value in settings.items() if value is not None}
    if callable(kwargs.get("partitioner")):
        raise ConfigurationError("the Spark sink takes a partitioner by name (it is shipped)")
    topic = kwargs.pop("topic", None)
    value_serializer = kwargs.pop("value_serializer", None)
    key_serializer = kwargs.pop("key_serializer", None)
    config = SinkConfig(
        url=url,
        topic=topic,
        producer_kwargs=tuple(sorted(kwargs.items())),
        value_serializer=ship_serializer(value_serializer, "value_serializer"),
        key_serializer=ship_serializer(key_serializer, "key_serializer"),
        **sink,
    )
    config.check()
    return config


def _flag(value: Any, name: str) -> bool:
    """A bool, or its text as format("producerkit") options give it."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ConfigurationError(f"{name} is true or false, not {value!r}")


def _seconds(value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds > 0 or isinstance(value, bool):
        raise ConfigurationError(f"exactly_once_timeout is seconds > 0, not {value!r}")
    return seconds


def ship_serializer(serializer: str | Serializer | None, what: str) -> str | bytes | None:
    """A serializer as the executors receive it: a name as it is; a callable pickled here, the
    way Spark ships its own functions (cloudpickle: a lambda or a function of the driver's
    script travels by value, a module's function by reference), or ConfigurationError now."""
    if serializer is None or isinstance(serializer, str):
        return serializer
    if not callable(serializer):
        raise ConfigurationError(
            f"{what} must be a name ('json', 'str', 'bytes') or a callable (obj) -> bytes, "
            f"not {type(serializer).__name__}"
        )
    from pyspark import cloudpickle

    try:
        shipped: bytes = cloudpickle.dumps(serializer)  # type: ignore[no-untyped-call]
        return shipped
    except Exception as exc:
        raise ConfigurationError(
            f"{what} {serializer!r} cannot be pickled to be sent to the executors "
            f"({type(exc).__name__}: {exc}): pass a name ('json', 'str', 'bytes'), a function, "
            "or an object that pickles (serializers.avro(...) does), not one that holds a "
            "lock, a connection or a producer"
        ) from exc


def check_columns(types: Mapping[str, str], config: SinkConfig, key_given: bool) -> SinkConfig:
    """Check the columns (name -> Spark simpleString type) hold what the config names, with
    types the producer takes; the default ``key`` column is dropped if absent."""
    if config.key_col is not None and config.key_col not in types and not key_given:
        config = attrs.evolve(config, key_col=None)  # the default "key" column is optional
    for role, column in config.columns().items():
        if not isinstance(column, str):
            raise ConfigurationError(
                f"{role}_col={column!r}: a DataFrame's columns are named (positions are for "
                "partition_writer's tuples)"
            )
        if column not in types:
            raise ConfigurationError(
                f"{role}_col={column!r} is not a column of the DataFrame "
                f"(columns: {', '.join(types) or 'none'})"
            )
        dtype = types[column]
        if role in ("value", "key"):
            serializer = config.value_serializer if role == "value" else config.key_serializer
            _check_serialized(role, column, dtype, serializer)
        if role == "topic" and dtype != "string":
            raise ConfigurationError(f"the topic column {column!r} must be a string, not {dtype}")
        if role == "partition" and dtype not in ("int", "bigint", "smallint", "tinyint"):
            raise ConfigurationError(f"the partition column {column!r} must be an int, not {dtype}")
        if role == "headers" and not dtype.startswith(("array<struct<key:string", "map<string")):
            raise ConfigurationError(
                f"the headers column {column!r} is {dtype}: use array<struct<key:string,"
                "value:binary>> (as Spark's Kafka sink) or map<string,binary|string>"
            )
    return config


def _check_serialized(role: str, column: str, dtype: str, serializer: str | bytes | None) -> None:
    """The value or key column's type against its serializer: without one (or with "str") it
    must be string or binary, with "bytes" binary; "json" and a callable take any type."""
    if serializer in (None, "str") and dtype not in _STRINGS:
        raise ConfigurationError(
            f"the {role} column {column!r} is {dtype}: pass {role}_serializer='json' to send it "
            f"as JSON, or cast it to string or binary (e.g. F.to_json(...) or "
            f"F.col({column!r}).cast('string'))"
        )
    if serializer == "bytes" and dtype != "binary":
        raise ConfigurationError(
            f"{role}_serializer='bytes' takes a binary column; {column!r} is {dtype} "
            "(use 'str' for a string column, 'json' for others)"
        )


def structured_roles(types: Mapping[str, str], config: SinkConfig) -> tuple[str, ...]:
    """The value/key roles whose column holds structs (Rows to turn into dicts, row by row)."""
    return tuple(
        role
        for role, column in config.columns().items()
        if role in ("value", "key") and "struct<" in types.get(str(column), "")
    )


def check_python(spark: SparkSession) -> None:
    """Catch the usual PYSPARK_PYTHON mistake before a job fails on every executor with it."""
    conf = spark.sparkContext.getConf()
    python = conf.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON") or "python3"
    resolved = python if os.path.isabs(python) else shutil.which(python)
    if resolved is None or not os.path.exists(resolved):
        raise ConfigurationError(
            f"the executors' Python {python!r} (PYSPARK_PYTHON / spark.pyspark.python) does not "
            f"exist here; set PYSPARK_PYTHON={sys.executable} before the SparkSession is created"
        )
    master = spark.sparkContext.master or ""
    same = os.path.realpath(resolved) == os.path.realpath(sys.executable)
    if master.startswith("local") and not same:
        logger.warning(
            "Spark executors run %s but this driver runs %s: if producerkit is not installed "
            "there, tasks fail. Set PYSPARK_PYTHON=%s before creating the SparkSession.",
            resolved,
            sys.executable,
            sys.executable,
        )


def register_entry_by_value() -> None:
    """Have cloudpickle ship ``_entry``'s functions by value (see that module)."""
    from pyspark import cloudpickle

    from producerkit.spark import _entry

    cloudpickle.register_pickle_by_value(_entry)  # type: ignore[no-untyped-call]


def driver_python() -> str:
    """This driver's interpreter, as the executors' import error names it."""
    return f"{sys.executable} (Python {sys.version.split()[0]})"


def task_slots(spark: SparkSession) -> int:
    """How many tasks of one job can run at once: Spark's ``defaultParallelism`` (the executors'
    cores, unless ``spark.default.parallelism`` says otherwise) over ``spark.task.cpus``."""
    context = spark.sparkContext
    cpus_per_task = int(context.getConf().get("spark.task.cpus") or 1)
    return max(1, context.defaultParallelism // max(1, cpus_per_task))


def task_rates(
    spark: SparkSession,
    max_rate: float | None,
    max_bytes_rate: float | None,
    partitions: int | None = None,
) -> dict[str, float]:
    """A job's ``max_rate`` / ``max_bytes_rate`` as each task's producer settings: divided by the
    tasks that run at once, ``min(partitions, task_slots(spark))`` (the slots alone when the
    partition count is not known). Tasks that run at once never exceed the job's figure together;
    empty when neither is given."""
    limits = {"max_rate": max_rate, "max_bytes_rate": max_bytes_rate}
    given = {name: value for name, value in limits.items() if value is not None}
    if not given:
        return {}
    for name, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigurationError(f"{name} must be a number > 0 (per second), got {value!r}")
    tasks = task_slots(spark)
    if partitions is not None:
        tasks = max(1, min(tasks, partitions))
    rates = {name: float(value) / tasks for name, value in given.items()}
    logger.info("job rate limit %s split over %d concurrent task(s): %s each", given, tasks, rates)
    return rates


@with_settings
def publish(
    df: DataFrame,
    url: str,
    *,
    value_col: str = "value",
    key_col: str | None = "key",
    topic_col: str | None = None,
    partition_col: str | None = None,
    headers_col: str | None = None,
    id_col: str | None = None,
    on_error: Literal["fail", "count"] = "fail",
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    exactly_once: bool = False,
    exactly_once_timeout: float | None = None,
    **options: Any,
) -> PublishReport:
    """Publish every row of ``df`` from the executors and return the counts.

    Each Spark task publishes its partition with its Python worker's cached producer (built
    from the shipped configuration, never pickled), flushes, and returns its counts through the
    job's results. ``on_error="fail"`` (default) makes a task whose messages failed raise, so
    Spark retries it and the job fails if it keeps failing; ``"count"`` counts failures in the
    report instead.

    Args:
        df: a batch DataFrame (for streaming, use :func:`stream_writer`,
            ``writeStream.format("producerkit")`` or ``foreachBatch(batch_publisher(...))``).
        url: the producer URL, reachable from every executor.
        value_col: the column to publish (required): string or binary, or any type with a
            ``value_serializer``. ``key_col``: likewise with ``key_serializer``, used if
            present. ``topic_col``: a topic per row (null: ``topic``). ``partition_col``: int.
            ``headers_col``: ``array<struct<key:string,value:binary>>`` or
            ``map<string,binary>``.
        id_col: column whose value becomes ``msg_id`` (JetStream ``Nats-Msg-Id``): a retried
            task republishes the same ids and the server drops duplicates, so the publish is
            exactly-once within the stream's duplicate window. Kafka: see ``exactly_once``.
        on_error: ``"fail"`` or ``"count"`` (above).
        idle_timeout: seconds a worker keeps an unused producer before closing it.
        exactly_once: store each row once, whatever Spark retries (docs/spark.md, "Delivery
            guarantees"). ``kafka://``: each task writes its rows in a Kafka transaction with
            the transactional id ``{job}-{partition}`` (a retried or speculative attempt fences
            the earlier one) and leaves it open; this function commits them all once every
            task succeeded, and aborts them if the job fails. ``jetstream://``: without
            ``id_col``, each row's message id is ``{job}-{partition}-{row}``. Other backends
            are refused.
        exactly_once_timeout: the longest the job may take, retries included, in seconds
            (default 900, Kafka brokers' default most): on Kafka the transactions' timeout
            (the broker aborts a transaction open longer) and each task's message deadline;
            on JetStream it must not exceed the stream's duplicate window (checked here; not
            given, a warning names the window).
        **options: every setting of :class:`producerkit.Producer` for the executors'
            producers (``topic``, ``max_in_flight_messages``, ``timeout``, ``partitioner``,
            ...: :class:`~producerkit._options.ProducerOptions`), with the Producer's defaults
            except where ``SPARK_DEFAULTS`` there names another (``max_in_flight_messages``:
            10,000, and why); and backend options (``create_stream=True``, ``linger_ms=5``,
            ...). Here:

            - ``value_serializer`` turns each value into bytes on the executors: ``"json"`` (a
              struct, map or array column as a JSON object or array; compact, UTF-8),
              ``"str"``, ``"bytes"`` (see :mod:`producerkit.serializers`), or a callable
              ``(obj) -> bytes`` that can be pickled (it is shipped like Spark ships a UDF;
              e.g. ``serializers.avro(schema, schema_id)``). It gets structs and maps as dicts,
              arrays as lists. A lambda holding a lock or a connection is refused here.
              ``key_serializer``: likewise for the key column (a null key stays null).
            - ``partitioner`` is a name (a function is not shipped).
            - ``max_rate`` is the most messages per second for the whole job: each task's
              producer gets ``max_rate / min(partitions, task slots)`` (``task_rates`` in this
              module), so the tasks that run at once stay within it together.
              ``max_bytes_rate``: likewise in bytes (value + key) per second; ``rate_burst``
              is per producer.
    """
    if df.isStreaming:
        raise ConfigurationError(
            "publish() takes a batch DataFrame; for streaming use "
            "producerkit.spark.stream_writer(df, url, ...), "
            'df.writeStream.format("producerkit") or '
            ".foreachBatch(producerkit.spark.batch_publisher(url, ...))"
        )
    keywords = {
        "value_col": value_col,
        "key_col": key_col,
        "topic_col": topic_col,
        "partition_col": partition_col,
        "headers_col": headers_col,
        "id_col": id_col,
        "on_error": on_error,
        "idle_timeout": idle_timeout,
        "exactly_once": exactly_once,
        "exactly_once_timeout": exactly_once_timeout,
    }
    return run_publish(df, _config_for(df, url, {**keywords, **options}))


def _config_for(df: DataFrame, url: str, keywords: dict[str, Any]) -> SinkConfig:
    """:func:`publish`'s keywords for a publish of ``df`` as a checked SinkConfig: the job's
    rate limits split over its tasks, the columns checked against ``df``'s. The rate limits are
    popped from ``keywords``: each caller passes a dict of its own."""
    rates = _task_rates_of(df, keywords.pop("max_rate", None), keywords.pop("max_bytes_rate", None))
    config = make_config(url, **keywords, **rates)
    return check_columns(dict(df.dtypes), config, key_given=keywords.get("key_col", "key") != "key")


def _task_rates_of(
    df: DataFrame, max_rate: float | None, max_bytes_rate: float | None
) -> dict[str, float]:
    """:func:`task_rates` for a publish of ``df`` (its partition count is read only if needed,
    and not known for a streaming DataFrame: the task slots alone then)."""
    if max_rate is None and max_bytes_rate is None:
        return {}
    partitions = None if df.isStreaming else df.rdd.getNumPartitions()
    return task_rates(df.sparkSession, max_rate, max_bytes_rate, partitions)


def _publishing_frame(df: DataFrame, config: SinkConfig, job: dict[str, Any] | None) -> DataFrame:
    """``df``'s columns the config names, through ``mapInArrow`` into the tasks that publish
    them: one result row per task (``_entry.RESULT_SCHEMA``). Nothing runs until an action (a
    batch DataFrame's) or a query (a streaming one's) does."""
    from pyspark.sql import functions as F

    from producerkit.spark._entry import RESULT_SCHEMA, make_partition_function

    check_python(df.sparkSession)
    register_entry_by_value()
    selected = []
    for role, column in config.columns().items():
        expression = F.col(str(column))  # check_columns let only names through
        if role == "id":
            expression = expression.cast("string")  # ids travel as str whatever their type
        selected.append(expression.alias(str(column)))
    function = make_partition_function(config.to_dict(), driver_python(), job)
    return df.select(*selected).mapInArrow(function, RESULT_SCHEMA)


def run_publish(df: DataFrame, config: SinkConfig) -> PublishReport:
    """Run the publish job for a checked config: the one place a Spark job is started. With
    ``exactly_once``, the driver's step around it too (``_exactly_once``)."""
    from producerkit.spark import _exactly_once as exactly

    job, window = None, None
    if config.exactly_once:
        window = exactly.check_job(config)
        job = exactly.new_job()
    job_df = _publishing_frame(df, config, None if job is None else job.to_dict())
    started = time.perf_counter()
    if job is None or exactly.way_of(config) != "prepared":
        rows = job_df.collect()
    else:
        assert job.prefix is not None
        context = df.sparkSession.sparkContext
        before = exactly.last_job(context)
        try:
            rows = job_df.collect()
        except BaseException as exc:
            partitions = df.rdd.getNumPartitions()  # at least the tasks' partition ids
            exactly.wait_for_tasks(context, before)
            ids = exactly.prepared_names(job.prefix, partitions)
            # a killed task's Python worker may outlive its end by Spark's kill timeout (2 s)
            aborted = exactly.abort_job(config, [], ids, again_after=5.0)
            exc.add_note(
                "producerkit: exactly_once aborted what the job's tasks wrote"
                if aborted
                else "producerkit: exactly_once could not abort what the job's tasks wrote: "
                "the broker aborts it after exactly_once_timeout"
            )
            raise
        handles = [
            exactly.prepared_of(config).handle(json.loads(row.prepared))
            for row in rows
            if row.prepared is not None
        ]
        exactly.commit_job(config, handles)
    seconds = time.perf_counter() - started
    report = PublishReport.from_rows((row.asDict() for row in rows), seconds)
    if job is not None:
        exactly.check_duration(config, window, report)
    logger.info("published %s", report)
    return report


def batch_publisher(
    url: str,
    *,
    on_report: Callable[[int, PublishReport], object] | None = None,
    **publish_kwargs: Any,
) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function publishing each micro-batch (for Sparks without Python
    streaming writers): ``df.writeStream.foreachBatch(batch_publisher(url, topic="t")).start()``.

    Takes :func:`publish`'s keyword arguments; ``on_report(batch_id, report)`` sees each
    micro-batch's report. A micro-batch replayed after a restart publishes again: use ``id_col``
    on JetStream for exactly-once.
    """
    if make_config(url, **publish_kwargs).exactly_once:  # a bad option fails now, not per batch
        raise ConfigurationError(
            "batch_publisher does not take exactly_once: a micro-batch replayed after a restart "
            'would be published again; use df.writeStream.format("producerkit") with '
            '.option("exactly_once", "true")'
        )

    def publish_batch(batch_df: DataFrame, batch_id: int) -> None:
        report = publish(batch_df, url, **publish_kwargs)
        if on_report is not None:
            on_report(batch_id, report)

    return publish_batch


def stream_writer(df: DataFrame, url: str, **keywords: Any) -> DataStreamWriter:
    """A streaming query's writer that publishes each micro-batch at least once, with the fewest
    steps a micro-batch can take from Python: ``stream_writer(df, url, topic="t")
    .option("checkpointLocation", path).start()``.

    Takes :func:`publish`'s keywords (the columns, ``idle_timeout``, the Producer settings,
    backend options, ``max_rate``). Each micro-batch's tasks publish their rows as
    :func:`publish`'s do (the worker's cached producer, a flush before the task ends) inside one
    ``mapInArrow`` stage, and Spark's ``noop`` sink ends the query: no Python runs on the driver
    per micro-batch, which ``format("producerkit")`` (a Python data source) pays for in each
    one. A task whose messages failed raises, so the micro-batch fails and the query stops with
    that error; restarted from its checkpoint, it publishes that micro-batch again
    (at-least-once, as Spark's own Kafka sink). Not here, since each needs a commit per
    micro-batch: ``exactly_once=True`` and ``on_error="count"`` (use
    ``writeStream.format("producerkit")``).
    """
    if not df.isStreaming:
        raise ConfigurationError(
            "stream_writer() takes a streaming DataFrame; for a batch one use publish()"
        )
    config = _config_for(df, url, keywords)
    asked = {"exactly_once": config.exactly_once, "on_error": config.on_error != "fail"}
    refused = [name for name, given in asked.items() if given]
    if refused:
        raise ConfigurationError(
            f"stream_writer does not take {refused[0]}: there is no commit per micro-batch (a "
            'task whose messages failed raises); use df.writeStream.format("producerkit") with '
            f'.option("{refused[0]}", ...)'
        )
    return _publishing_frame(df, config, None).writeStream.format("noop")
