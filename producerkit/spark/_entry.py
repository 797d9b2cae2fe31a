"""The function Spark runs in ``mapInArrow``, shipped by value so a bad executor Python says so.

The driver registers this module with cloudpickle's ``register_pickle_by_value``: the function
arrives on the executor without naming producerkit, imports it itself, and if that import fails
raises an error that names the executor's interpreter and the fix (``PYSPARK_PYTHON``), instead
of Spark's bare ``ModuleNotFoundError`` from deep inside unpickling. Only the standard library and
plain data may be used at module level here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: mapInArrow output: one row per task, collected by the driver (never accumulators).
RESULT_SCHEMA = (
    "partition int, attempt int, rows long, delivered long, failed long, "
    "errors string, first_error string"
)


def make_partition_function(config: dict[str, Any], driver: str) -> Any:
    """The mapInArrow function for one publish: plain data in, a closure out."""

    def publish_partition(batches: Iterator[Any]) -> Iterator[Any]:
        import json
        import sys

        try:
            from producerkit.spark._worker import SinkConfig, chunks_from_arrow, publish_task
        except ImportError as exc:
            raise RuntimeError(
                f"producerkit cannot be imported by this Spark executor's Python "
                f"({sys.executable}, Python {sys.version.split()[0]}): {exc}. The driver runs "
                f"{driver}. Install producerkit into the executors' Python, or point "
                "PYSPARK_PYTHON (or spark.pyspark.python) at a Python that has it."
            ) from exc
        import pyarrow as pa
        from pyspark import TaskContext

        sink = SinkConfig.from_dict(config)
        counts = publish_task(sink, chunks_from_arrow(batches, sink.columns()))
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
                ]
            ),
        )

    return publish_partition
