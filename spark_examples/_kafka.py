"""What the Kafka examples share: Spark's Python set to this interpreter, their orders
DataFrame, and a count of the records a topic holds (read with a plain aiokafka consumer, not
producerkit)."""

from __future__ import annotations

import os
import sys
from typing import Any

from aiokafka import AIOKafkaConsumer

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


async def count_records(url: str, topic: str, expected: int) -> int:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=url.removeprefix("kafka://"),
        auto_offset_reset="earliest",
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


def orders_frame(spark: Any) -> Any:
    """100,000 orders in 4 partitions: key ``customer-N``, value a JSON object (a string)."""
    from pyspark.sql import functions as F

    return spark.range(100_000, numPartitions=4).select(
        F.format_string("customer-%d", F.col("id") % 1000).alias("key"),
        F.to_json(F.struct(F.col("id").alias("order"), (F.col("id") % 97).alias("amount"))).alias(
            "value"
        ),
    )
