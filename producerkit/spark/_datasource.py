"""``df.write.format("producerkit")`` and ``df.writeStream.format("producerkit")`` (Spark 4).

Spark's Python DataSource API: ``ProducerkitDataSource.writer()`` runs on the driver (in a Python
worker Spark starts), its writer is pickled to the executors, where ``write()`` gets the task's
Arrow record batches and publishes them with :func:`~producerkit.spark._worker.publish_task` (the
same code as ``publish()``), and ``commit()`` gets every task's counts back on the driver.

Columns follow Spark's Kafka sink: ``value`` (required, string/binary), and when present ``key``,
``topic``, ``partition``, ``headers``. Options: ``url`` (required), the sink's own as
``publish()`` takes them (``*_col``, ``on_error`` fail|count, ``idle_timeout``), ``report_path``
(a file each commit appends its report to, as a JSON line), every Producer setting text can
give (``ProducerOptions``; ``value_serializer`` and ``key_serializer`` by name: ``json``,
``str``, ``bytes``; with ``json`` the column may be a struct, map or array), with the Spark
defaults (``SPARK_DEFAULTS``) as ``publish()`` has them, and any backend option
(``create_stream``, ``linger_ms``, ...).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from producerkit.errors import ConfigurationError
from producerkit.spark import _exactly_once as exactly
from producerkit.spark._options import check_sink_options
from producerkit.spark._publish import (
    SINK_KEYWORDS,
    PublishReport,
    check_columns,
    make_config,
    structured_roles,
)
from producerkit.spark._worker import (
    SinkConfig,
    chunks_from_arrow,
    chunks_from_rows,
    freeze_long_lived,
    publish_task,
)

if TYPE_CHECKING:
    from producerkit.backends.base import Prepared

try:  # Arrow writers: Spark 4.0 (batch) and 4.1 (streaming); rows before that
    from pyspark.sql.datasource import DataSourceArrowWriter as _BatchBase
except ImportError:  # pragma: no cover - older Spark
    _BatchBase = DataSourceWriter  # type: ignore[misc,assignment]
try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamBase
except ImportError:  # pragma: no cover - older Spark
    _StreamBase = DataSourceStreamWriter  # type: ignore[misc,assignment]

__all__ = ["ProducerkitDataSource", "register"]

logger = logging.getLogger("producerkit.spark")

#: The Kafka sink's optional columns, used when the DataFrame has them.
_KAFKA_COLUMNS = {
    "key": "key_col",
    "topic": "topic_col",
    "partition": "partition_col",
    "headers": "headers_col",
}
#: Options Spark itself reads (streaming checkpoints, a save path); not producer options.
_SPARK_OPTIONS = frozenset({"checkpointlocation", "path", "queryname"})
_COLUMN_OPTIONS = tuple(name for name in SINK_KEYWORDS if name.endswith("_col"))
#: The options only ``format("producerkit")`` takes (the sink's keywords are taken too).
_OWN_OPTIONS = ("url", "report_path", "exactly_once_log")


@dataclass
class ProducerkitCommit(WriterCommitMessage):
    """One task's counts, sent back to the driver's ``commit()``; with ``exactly_once`` on
    Kafka, the transaction it prepared for the driver to commit."""

    partition: int
    attempt: int
    rows: int
    delivered: int
    failed: int
    errors: dict[str, int] = field(default_factory=dict)
    first_error: str | None = None
    prepared: Prepared | None = None


class ProducerkitDataSource(DataSource):
    """``format("producerkit")``: publishes a DataFrame, batch or streaming, to a producer URL."""

    @classmethod
    def name(cls) -> str:
        return "producerkit"

    def writer(self, schema: StructType, overwrite: bool) -> ProducerkitWriter:
        freeze_long_lived()
        config = self._config(schema, overwrite)
        if config.sink.exactly_once:
            config = replace(config, job=exactly.new_job())
        return ProducerkitWriter(config)

    def streamWriter(self, schema: StructType, overwrite: bool) -> ProducerkitStreamWriter:
        """Spark asks for one on the driver before each micro-batch (and again to commit it):
        with ``exactly_once``, what the commit log holds as an intent is committed first."""
        freeze_long_lived()
        config = self._config(schema, overwrite)
        if config.sink.exactly_once:
            log = exactly.CommitLog(exactly.log_directory(self.options, config.log))
            job = exactly.recover(config.sink, log)
            config = replace(config, job=job, log=str(log.directory))
        return ProducerkitStreamWriter(config)

    def _config(self, schema: StructType, overwrite: bool) -> _WriteConfig:
        if overwrite:
            raise ConfigurationError(
                'format("producerkit") appends messages; use mode("append") (the default), '
                "a message bus cannot be overwritten"
            )
        options: dict[str, Any] = {
            name: value for name, value in self.options.items() if name not in _SPARK_OPTIONS
        }
        url = options.pop("url", None)
        if not url:
            raise ConfigurationError('format("producerkit") needs .option("url", ...)')
        check_sink_options(url, options, own=_OWN_OPTIONS)
        types = {f.name: f.dataType.simpleString() for f in schema.fields}
        columns: dict[str, Any] = {
            option: column for column, option in _KAFKA_COLUMNS.items() if column in types
        }
        columns["key_col"] = columns.get("key_col")
        for name in _COLUMN_OPTIONS:
            if name in options:
                columns[name] = options.pop(name) or None  # an empty string: none
        for name in ("value_serializer", "key_serializer"):
            if name in options:
                options[name] = options[name] or None
        report_path = options.pop("report_path", None)
        log = options.pop("exactly_once_log", None) or None
        # the rest: the sink's own (on_error, idle_timeout, exactly_once), Producer settings as
        # text (the worker converts them, ProducerOptions' "text" type) and backend options
        config = make_config(url, **options, **columns)
        config = check_columns(types, config, key_given=True)
        if config.exactly_once:
            _check_once(config)
        return _WriteConfig(config, report_path, structured_roles(types, config), log=log)


#: The exactly-once configurations this process checked (``streamWriter()`` is called twice
#: per micro-batch: the check, and its warning, once).
_checked: set[str] = set()


def _check_once(config: SinkConfig) -> None:
    key = config.cache_key()
    if key not in _checked:
        exactly.check_job(config)
        _checked.add(key)


@dataclass(frozen=True)
class _WriteConfig:
    sink: SinkConfig
    report_path: str | None
    #: Value/key roles holding structs: the row-based writers turn their Rows into dicts.
    structured: tuple[str, ...] = ()
    #: The commit log's directory (streaming ``exactly_once``): the ``exactly_once_log``
    #: option as given, then as ``streamWriter()`` resolved it (else under the checkpoint).
    log: str | None = None
    #: With ``exactly_once``: the write's id (batch), or what the commit log says (streaming).
    job: exactly.Job | None = None


def _write(config: _WriteConfig, data: Iterator[Any], arrow: bool) -> ProducerkitCommit:
    from pyspark import TaskContext

    columns = config.sink.columns()
    text_as_bytes = config.sink.byte_roles()
    if arrow:
        chunks = chunks_from_arrow(data, columns, text_as_bytes)
    else:
        chunks = chunks_from_rows(
            data, columns, structured=config.structured, as_bytes=text_as_bytes
        )
    prepared = None
    if config.job is None:
        counts = publish_task(config.sink, chunks)
    else:
        counts, prepared = exactly.write_task(config.sink, chunks, config.job)
    context = TaskContext.get()
    return ProducerkitCommit(
        partition=context.partitionId() if context is not None else -1,
        attempt=context.attemptNumber() if context is not None else 0,
        rows=counts.rows,
        delivered=counts.delivered,
        failed=counts.failed,
        errors=dict(counts.errors),
        first_error=counts.first_error,
        prepared=prepared,
    )


def _handles(messages: list[Any]) -> list[Prepared]:
    """The transactions the tasks prepared (exactly_once on Kafka)."""
    return [
        message.prepared
        for message in messages
        if isinstance(message, ProducerkitCommit) and message.prepared is not None
    ]


def _commit(
    config: _WriteConfig, messages: list[Any], started: float | None, batch_id: int | None
) -> PublishReport:
    report = PublishReport.from_rows(
        (asdict(message) for message in messages if isinstance(message, ProducerkitCommit)),
        seconds=time.time() - started if started is not None else 0.0,
    )
    where = "" if batch_id is None else f" (micro-batch {batch_id})"
    logger.info("format('producerkit') published%s: %s", where, report)
    if config.report_path:
        line: Mapping[str, Any] = {"batch_id": batch_id, **report.to_dict()}
        with open(config.report_path, "a", encoding="utf-8") as file:
            file.write(json.dumps(line) + "\n")
    return report


class ProducerkitWriter(_BatchBase):
    def __init__(self, config: _WriteConfig) -> None:
        self.config = config
        self.started = time.time()

    def write(self, iterator: Iterator[Any]) -> ProducerkitCommit:
        return _write(self.config, iterator, arrow=_BatchBase is not DataSourceWriter)

    def commit(self, messages: list[Any]) -> None:
        if self.config.job is not None:
            exactly.commit_job(self.config.sink, _handles(messages))
        _commit(self.config, messages, self.started, None)

    def abort(self, messages: list[Any]) -> None:
        done = sum(1 for message in messages if message is not None)
        logger.warning("format('producerkit') write aborted after %d task(s) finished", done)
        job = self.config.job
        if job is not None and job.prefix is not None:
            ids = exactly.prepared_names(job.prefix, len(messages))
            # no SparkContext here to wait for the killed tasks: the ids once more later
            exactly.abort_job(self.config.sink, _handles(messages), ids, again_after=10.0)


class ProducerkitStreamWriter(_StreamBase):
    """Publishes each micro-batch; Spark commits the batch after every task flushed."""

    def __init__(self, config: _WriteConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[Any]) -> ProducerkitCommit:
        return _write(self.config, iterator, arrow=_StreamBase is not DataSourceStreamWriter)

    def commit(self, messages: list[Any], batchId: int) -> None:
        if self.config.job is not None:
            assert self.config.log is not None  # streamWriter() resolved it
            log = exactly.CommitLog(self.config.log)
            exactly.commit_batch(self.config.sink, log, batchId, _handles(messages))
        _commit(self.config, messages, None, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        logger.warning("format('producerkit') micro-batch %d aborted", batchId)
        handles = _handles(messages)
        if self.config.job is not None and handles:
            # the batch's prefix from a task's id: every partition's id, to abort what the
            # failed attempts left open (a replay's tasks would fence them too)
            prefix = handles[0].name.rsplit("-", 1)[0]
            ids = exactly.prepared_names(prefix, len(messages))
            exactly.abort_job(self.config.sink, handles, ids)


def register(spark: Any) -> None:
    """Register ``format("producerkit")`` with this session (Spark 4 also finds it by itself
    through the ``pyspark_producerkit`` module when producerkit is installed)."""
    spark.dataSource.register(ProducerkitDataSource)
