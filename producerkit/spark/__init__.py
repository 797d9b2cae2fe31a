"""producerkit for PySpark: publish a DataFrame from the executors, batch or streaming.

::

    from producerkit.spark import publish

    report = publish(df, "kafka://broker:9092", topic="orders", key_col="id")
    print(report.delivered, report.failed)

    df.write.format("producerkit").option("url", url).option("topic", "orders").save()
    df.writeStream.format("producerkit").option("url", url).option("topic", "orders").start()
    stream_writer(df, url, topic="orders").option("checkpointLocation", path).start()
    df.writeStream.foreachBatch(batch_publisher(url, topic="orders")).start()   # older Sparks
    df.foreachPartition(partition_writer(url, topic="orders"))   # beside per-partition code

Delivery guarantees: at-least-once by default (a retried task publishes its rows again).
``exactly_once=True`` (``.option("exactly_once", "true")``) stores each row once whatever Spark
retries: on ``kafka://`` each task writes its rows in a transaction the driver commits once the
job (the micro-batch) succeeded; on ``jetstream://`` each row's ``Nats-Msg-Id`` comes from its
place, and the server drops a retry's duplicates within the stream's duplicate window (as with
``id_col``). See docs/spark.md, "Delivery guarantees".

``import producerkit`` never imports this package; this package imports pyspark lazily too, except
for the DataSource classes (``register``, ``ProducerkitDataSource``), which subclass pyspark's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from producerkit.spark._partition import PartitionCounters, partition_writer, read_report
from producerkit.spark._publish import (
    PartitionReport,
    PublishReport,
    batch_publisher,
    publish,
    stream_writer,
)
from producerkit.spark._worker import close_all

if TYPE_CHECKING:
    from producerkit.spark._datasource import ProducerkitDataSource

__all__ = [
    "PartitionCounters",
    "PartitionReport",
    "ProducerkitDataSource",
    "PublishReport",
    "batch_publisher",
    "close_all",
    "partition_writer",
    "publish",
    "read_report",
    "register",
    "stream_writer",
]


def register(spark: Any) -> None:
    """Register ``format("producerkit")`` with ``spark`` (Spark 4 also registers it by itself
    when producerkit is installed, through the ``pyspark_producerkit`` module)."""
    from producerkit.spark._datasource import register as _register

    _register(spark)


def __getattr__(name: str) -> Any:
    if name == "ProducerkitDataSource":
        from producerkit.spark._datasource import ProducerkitDataSource

        return ProducerkitDataSource
    raise AttributeError(f"module 'producerkit.spark' has no attribute {name!r}")
