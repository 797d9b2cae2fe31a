"""The functions Spark runs on the executors (``mapInArrow``'s for ``publish()``, and
``partition_writer``'s for ``foreachPartition``), shipped by value so a bad executor Python says so.

The driver registers this module with cloudpickle's ``register_pickle_by_value``: the function
arrives on the executor without naming producerkit, imports it itself, and if that import fails
raises an error that names the executor's interpreter and the fix (``PYSPARK_PYTHON``), instead
of Spark's bare ``ModuleNotFoundError`` from deep inside unpickling. Only the standard library and
plain data may be used at module level here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

#: mapInArrow output: one row per task, collected by the driver (never accumulators).
RESULT_SCHEMA = (
    "partition int, attempt int, rows long, delivered long, failed long, "
    "errors string, first_error string, prepared string"
)


def make_partition_function(
    config: dict[str, Any], driver: str, job: dict[str, Any] | None = None
) -> Any:
    """The mapInArrow function for one publish: plain data in, a closure out. With ``job``
    (exactly_once), each task writes through ``_exactly_once`` and returns its prepared
    transaction (Kafka) as JSON in ``prepared``."""

    def publish_partition(batches: Iterator[Any]) -> Iterator[Any]:
        import json

        worker = _import_producerkit("producerkit.spark._worker", driver)
        import pyarrow as pa
        from pyspark import TaskContext

        sink = worker.SinkConfig.from_dict(config)
        chunks = worker.chunks_from_arrow(batches, sink.columns(), sink.byte_roles())
        prepared = None
        if job is None:
            counts = worker.publish_task(sink, chunks)
        else:
            exactly = _import_producerkit("producerkit.spark._exactly_once", driver)
            counts, prepared = exactly.write_task(sink, chunks, exactly.Job.from_dict(job))
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else -1
        attempt = context.attemptNumber() if context is not None else 0
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "partition": partition,
                    "attempt": attempt,
                    "rows": counts.rows,
                    "delivered": counts.delivered,
                    "failed": counts.failed,
                    "errors": json.dumps(dict(counts.errors)),
                    "first_error": counts.first_error,
                    "prepared": None if prepared is None else json.dumps(list(prepared)),
                }
            ],
            schema=pa.schema(
                [
                    ("partition", pa.int32()),
                    ("attempt", pa.int32()),
                    ("rows", pa.int64()),
                    ("delivered", pa.int64()),
                    ("failed", pa.int64()),
                    ("errors", pa.string()),
                    ("first_error", pa.string()),
                    ("prepared", pa.string()),
                ]
            ),
        )

    return publish_partition


def make_partition_writer(write: dict[str, Any], driver: str) -> Any:
    """The ``foreachPartition`` function of one ``partition_writer``: plain data (and Spark's
    own accumulators) in, a closure out; it never holds a producer."""

    def write_partition(rows: Iterable[Any]) -> None:
        partition = _import_producerkit("producerkit.spark._partition", driver)
        partition.write_rows(write, rows)

    return write_partition


def _import_producerkit(module: str, driver: str) -> Any:
    """``module`` imported in this executor, or an error naming its Python and the fix."""
    import importlib
    import sys

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise RuntimeError(
            f"producerkit cannot be imported by this Spark executor's Python "
            f"({sys.executable}, Python {sys.version.split()[0]}): {exc}. The driver runs "
            f"{driver}. Install producerkit into the executors' Python, or point "
            "PYSPARK_PYTHON (or spark.pyspark.python) at a Python that has it."
        ) from exc
