"""Publish a 100,000-row DataFrame to Kafka (Tansu) from the Spark executors with publish().

    python spark_examples/batch_publish.py

Starts a local Tansu broker, a local[2] Spark session, publishes, and reads the topic back with
aiokafka to show the report's count is what the broker holds.
"""

from __future__ import annotations

import asyncio

from _kafka import count_records, orders_frame  # sets PYSPARK_PYTHON before pyspark loads
from pyspark.sql import SparkSession

from producerkit.spark import publish
from producerkit.testing.brokers import start_kafka


def main() -> None:
    with start_kafka() as kafka:
        spark = SparkSession.builder.master("local[2]")
        spark = spark.config("spark.ui.showConsoleProgress", "false")
        spark = spark.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        orders = orders_frame(spark)
        report = publish(orders, kafka.url, topic="orders", linger_ms=5)
        print("report:", report)
        for partition in report.partitions:
            print(f"  spark partition {partition.partition}: {partition.delivered} delivered")
        stored = asyncio.run(count_records(kafka.url, "orders", report.delivered))
        print(f"read back {stored} records; report says {report.delivered} delivered")
        spark.stop()
        assert stored == report.delivered == 100_000


if __name__ == "__main__":
    main()
