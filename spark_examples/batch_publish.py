"""Publish a 100,000-row DataFrame to Kafka (Tansu) from the Spark executors with publish().

    python spark_examples/batch_publish.py

Starts a local Tansu broker, a local[2] Spark session, publishes, and reads the topic back with
aiokafka to show the report's count is what the broker holds.
"""

from __future__ import annotations

import asyncio
import os
import sys

from aiokafka import AIOKafkaConsumer

from producerkit.testing.brokers import start_kafka

# Executors must run a Python that has producerkit: this one.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from producerkit.spark import publish


async def count_records(url: str, topic: str, expected: int) -> int:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=url.removeprefix("kafka://"), auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        seen = 0
        for _ in range(60):
            batches = await consumer.getmany(timeout_ms=500, max_records=50_000)
            seen += sum(len(messages) for messages in batches.values())
            if seen >= expected and not batches:
                break
        return seen
    finally:
        await consumer.stop()


def main() -> None:
    with start_kafka() as kafka:
        spark = SparkSession.builder.master("local[2]")
        spark = spark.config("spark.ui.showConsoleProgress", "false")
        spark = spark.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        orders = spark.range(100_000, numPartitions=4).select(
            F.format_string("customer-%d", F.col("id") % 1000).alias("key"),
            F.to_json(F.struct(F.col("id").alias("order"), (F.col("id") % 97).alias("amount")))
            .alias("value"),
        )
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
