"""Publish 100,000 rows to Kafka (Tansu) from df.foreachPartition, beside a job's own code.

    python spark_examples/foreach_partition.py

Starts a local Tansu broker and a local[2] Spark session; each partition runs its own code (here
it only counts the rows it saw, in an accumulator) and publishes its rows with the function
``partition_writer`` returns. The counts come back through ``PartitionCounters`` and a report
file, and the topic is read back with aiokafka to show they are what the broker holds.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterable
from typing import Any

from _kafka import count_records, orders_frame  # sets PYSPARK_PYTHON before pyspark loads
from pyspark.sql import SparkSession

from producerkit.spark import PartitionCounters, partition_writer, read_report
from producerkit.testing.brokers import start_kafka


def main() -> None:
    with start_kafka() as kafka, tempfile.TemporaryDirectory() as scratch:
        spark = SparkSession.builder.master("local[2]")
        spark = spark.config("spark.ui.showConsoleProgress", "false").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        orders = orders_frame(spark)
        seen_by_own_code = spark.sparkContext.accumulator(0)
        counters = PartitionCounters(spark)
        report_path = os.path.join(scratch, "orders.jsonl")
        publish_rows = partition_writer(
            kafka.url, topic="orders", linger_ms=5, counters=counters, report_path=report_path
        )

        def per_partition(rows: Iterable[Any]) -> None:
            rows = list(rows)
            seen_by_own_code.add(len(rows))  # the job's own per-partition work
            publish_rows(rows)

        orders.foreachPartition(per_partition)
        print("counters:", counters, "; own code saw", seen_by_own_code.value, "rows")
        print("report file:", read_report(report_path))
        stored = asyncio.run(count_records(kafka.url, "orders", counters.delivered))
        print(f"read back {stored} records; the counters say {counters.delivered} delivered")
        spark.stop()
        assert stored == counters.delivered == read_report(report_path).delivered == 100_000


if __name__ == "__main__":
    main()
