"""df.write.format("producerkit"): Spark's Python DataSource API, with the Kafka sink's columns.

    python spark_examples/format_producerkit.py

Starts a local NATS server with JetStream and a local[2] Spark session; writes 100,000 rows to a
JetStream stream with ``id_col`` (so a retried task cannot store a row twice), then compares
the stream's message count with the report the writer's commit() saved. No registration call is
needed on Spark 4: installing producerkit installs the ``pyspark_producerkit`` module Spark
scans for data sources. (``producerkit.spark.register(spark)`` does it explicitly.)
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from _jetstream import stream_messages  # sets PYSPARK_PYTHON before pyspark loads
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from producerkit.testing.brokers import start_nats


def main() -> None:
    with start_nats(jetstream=True) as broker, tempfile.TemporaryDirectory() as tmp:
        url = f"jetstream://{broker.host_port}"
        report_path = Path(tmp) / "report.jsonl"
        spark = SparkSession.builder.master("local[2]")
        spark = spark.config("spark.ui.showConsoleProgress", "false")
        spark = spark.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        events = spark.range(100_000, numPartitions=4).select(
            F.col("id").cast("string").alias("key"),
            F.concat(F.lit("event "), F.col("id")).alias("value"),
            F.array(F.struct(F.lit("source").alias("key"), F.lit(b"spark").alias("value")))
            .alias("headers"),
            F.col("id").alias("event_id"),
        )
        (
            events.write.format("producerkit")
            .option("url", url)
            .option("topic", "events")
            .option("id_col", "event_id")          # -> Nats-Msg-Id: exactly-once on retries
            .option("create_stream", "true")       # a backend option
            .option("report_path", str(report_path))
            .mode("append")
            .save()
        )
        report = json.loads(report_path.read_text().splitlines()[-1])
        stored = asyncio.run(stream_messages(url, "events"))
        print(f"report: {report['delivered']} delivered, {report['failed']} failed; "
              f"the stream holds {stored} messages")
        spark.stop()
        assert stored == report["delivered"] == 100_000


if __name__ == "__main__":
    main()
