"""Spark under faults: publish() to JetStream with ``id_col`` while the broker is killed with -9
and restarted (file storage) in the middle of the job. The tasks whose messages failed are
retried by Spark, and the msg ids make the retries idempotent: exactly the rows are stored,
each once."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import anyio
import pytest
from conftest import read_jetstream

pytestmark = [pytest.mark.spark, pytest.mark.brokers]

pyspark = pytest.importorskip("pyspark")


def test_a_broker_killed_mid_job_stores_exactly_the_rows_once(
    spark: Any, private_nats_broker: Any
) -> None:
    from pyspark.sql import functions as F

    import producerkit.spark as pks

    broker = private_nats_broker
    faults = broker.faults
    subject = f"spark{uuid.uuid4().hex[:8]}"
    rows = 40_000
    # Slow enough that the kill lands mid-job: 8 partitions published one after another.
    df = spark.range(rows, numPartitions=8).select(
        F.concat(F.lit("v-"), F.col("id"), F.lit("-"), F.repeat(F.lit("x"), 200)).alias("value"),
        F.col("id"),
    )
    killed = threading.Event()

    def kill_then_restart() -> None:
        time.sleep(2.0)
        faults.kill()
        killed.set()
        time.sleep(2.0)
        faults.restart()

    fault = threading.Thread(target=kill_then_restart, daemon=True)
    fault.start()
    report = pks.publish(
        df,
        broker.faulty_jetstream_url,
        topic=subject,
        id_col="id",
        create_stream=True,
        stream_storage="file",
        timeout=3.0,
        max_rate=12_000.0,
    )
    fault.join()
    assert killed.is_set()
    assert report.delivered == rows
    stored = anyio.run(read_jetstream, broker.jetstream_url, subject, rows)
    ids = [int(record["headers"]["Nats-Msg-Id"]) for record in stored]
    assert len(ids) == rows, f"{len(ids) - len(set(ids))} duplicates, {rows - len(set(ids))} lost"
    assert sorted(ids) == list(range(rows))
    assert report.retried_partitions >= 1  # the kill failed some messages: Spark retried
