"""Lets Spark 4 find ``format("producerkit")`` by itself.

When a Python data source is first used, Spark imports every top-level module named
``pyspark_*`` and registers its ``DefaultSource`` under ``DefaultSource.name()``; this module is
that hook, installed with producerkit. Spark 3.x has no Python data sources: use
``producerkit.spark.publish`` or ``batch_publisher`` there.
"""

from producerkit.spark._datasource import ProducerkitDataSource as DefaultSource

__all__ = ["DefaultSource"]
