"""Structured Streaming from a rate source to JetStream with writeStream.format("producerkit").

    python spark_examples/streaming_rate.py [SECONDS]

Each micro-batch is published and flushed before Spark commits it. The rate source's ``value``
is a stable sequence number, so it is the message id: if the query restarts from its checkpoint
and replays a batch, JetStream drops the duplicates. Runs for SECONDS (default 10), then compares
the stream's message count with the sum of the per-batch reports.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from _jetstream import stream_messages  # sets PYSPARK_PYTHON before pyspark loads
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from producerkit.brokers import start_nats


def main(seconds: float) -> None:
    with start_nats(jetstream=True) as broker, tempfile.TemporaryDirectory() as tmp:
        url = f"jetstream://{broker.host_port}"
        report_path = Path(tmp) / "batches.jsonl"
        spark = SparkSession.builder.master("local[2]")
        spark = spark.config("spark.ui.showConsoleProgress", "false")
        spark = spark.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        ticks = (
            spark.readStream.format("rate").option("rowsPerSecond", 2000).load()
            .select(
                F.to_json(F.struct("timestamp", "value")).alias("value"),
                F.col("value").alias("tick"),
            )
        )
        query = (
            ticks.writeStream.format("producerkit")
            .option("url", url)
            .option("topic", "ticks")
            .option("id_col", "tick")
            .option("create_stream", "true")
            .option("report_path", str(report_path))
            .option("checkpointLocation", str(Path(tmp) / "checkpoint"))
            .trigger(processingTime="1 second")
            .start()
        )
        time.sleep(seconds)
        query.stop()
        batches = [json.loads(line) for line in report_path.read_text().splitlines()]
        delivered = sum(batch["delivered"] for batch in batches)
        stored = asyncio.run(stream_messages(url, "ticks"))
        print(f"{len(batches)} micro-batches, {delivered} delivered; the stream holds {stored}")
        spark.stop()
        assert stored == delivered


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0)
