"""Structured Streaming from a rate source to JetStream with writeStream.format("producerkit").

    python spark_examples/streaming_rate.py [SECONDS]

Each micro-batch is published and flushed before Spark commits it. The rate source's ``value``
is a stable sequence number, so it is the message id: if the query restarts from its checkpoint
and replays a batch, JetStream drops the duplicates.

The query publishes for SECONDS (default 10) once its first rows are committed (starting Spark's
Python workers can take longer than that on a busy machine), and is then stopped. A stop that
cuts a micro-batch short leaves rows published that no report counts, so the example then
restarts the query from its checkpoint with ``availableNow``: Spark replays the cut batch (its
duplicates are dropped) and commits it, as any restart would. Finally it compares the stream's
message count with the sum of the per-batch reports.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _jetstream import stream_messages  # sets PYSPARK_PYTHON before pyspark loads
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from producerkit.testing.brokers import start_nats

#: Seconds the first committed rows may take: the first micro-batch starts Spark's Python workers.
STARTUP_TIMEOUT = 180.0


def start_query(spark: SparkSession, url: str, tmp: Path, **trigger: Any) -> StreamingQuery:
    ticks = (
        spark.readStream.format("rate").option("rowsPerSecond", 2000).load()
        .select(
            F.to_json(F.struct("timestamp", "value")).alias("value"),
            F.col("value").alias("tick"),
        )
    )
    return (
        ticks.writeStream.format("producerkit")
        .option("url", url)
        .option("topic", "ticks")
        .option("id_col", "tick")
        .option("create_stream", "true")
        .option("report_path", str(tmp / "batches.jsonl"))
        .option("checkpointLocation", str(tmp / "checkpoint"))
        .trigger(**trigger)
        .start()
    )


def wait_for_rows(query: StreamingQuery, timeout: float) -> None:
    """Until a micro-batch with rows has been committed (or the query failed)."""
    deadline = time.monotonic() + timeout
    while not any(progress["numInputRows"] for progress in query.recentProgress):
        if not query.isActive:
            raise RuntimeError(f"the query stopped before publishing: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no micro-batch committed within {timeout:.0f}s")
        time.sleep(0.1)


def stop_between_batches(query: StreamingQuery, patience: float = 10.0) -> None:
    """Stop while no trigger runs, if one comes within ``patience`` seconds (batches may run
    back to back on a busy machine); a stop during a batch cancels it."""
    deadline = time.monotonic() + patience
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.01)
    query.stop()


def main(seconds: float) -> None:
    with start_nats(jetstream=True) as broker, tempfile.TemporaryDirectory() as tmp:
        url = f"jetstream://{broker.host_port}"
        spark = SparkSession.builder.master("local[2]")
        spark = spark.config("spark.ui.showConsoleProgress", "false")
        spark = spark.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        try:  # Spark (and its Python workers' connections) stops before the broker does
            query = start_query(spark, url, Path(tmp), processingTime="1 second")
            try:
                wait_for_rows(query, STARTUP_TIMEOUT)
                time.sleep(seconds)
            finally:
                stop_between_batches(query)
            # Commit what the stop may have cut short: the checkpoint's last batch is replayed.
            start_query(spark, url, Path(tmp), availableNow=True).awaitTermination()
            reports = [json.loads(line) for line in (Path(tmp) / "batches.jsonl").open()]
            # A batch is reported again if the stop came between its report and its commit.
            batches = {report["batch_id"]: report for report in reports}
            delivered = sum(batch["delivered"] for batch in batches.values())
            stored = asyncio.run(stream_messages(url, "ticks"))
            print(f"{len(batches)} micro-batches, {delivered} delivered; the stream holds {stored}")
        finally:
            spark.stop()
        assert stored == delivered, f"the stream holds {stored}, the reports say {delivered}"


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0)
