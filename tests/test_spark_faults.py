"""Spark under faults: publish() to JetStream with ``id_col`` while the broker is killed with -9
and restarted (file storage) in the middle of the job. The tasks whose messages failed are
retried by Spark, and the msg ids make the retries idempotent: exactly the rows are stored,
each once."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import read_jetstream

pytestmark = [pytest.mark.spark, pytest.mark.brokers]

pyspark = pytest.importorskip("pyspark")


def _pause_once_at(row: int, reached: str, resume: str) -> Any:
    """A UDF that passes values through, but on its task's first attempt stops at ``row``: it
    creates the file ``reached`` and waits (two minutes at most) until ``resume`` exists."""
    from pyspark.sql import functions as F

    def check(value: str, number: int) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if number == row and context is not None and context.attemptNumber() == 0:
            Path(reached).touch()
            deadline = time.monotonic() + 120
            while not os.path.exists(resume) and time.monotonic() < deadline:
                time.sleep(0.02)
        return value

    return F.udf(check, "string")


def test_a_broker_killed_mid_job_stores_exactly_the_rows_once(
    spark: Any, private_nats_broker: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    import producerkit.spark as pks

    broker = private_nats_broker
    faults = broker.faults
    subject = f"spark{uuid.uuid4().hex[:8]}"
    rows, timeout = 40_000, 3.0
    # The fault comes at deterministic points of the job, not at times: the first task stops at
    # its row 2,500 (on its first attempt) until the broker has been killed, then goes on
    # publishing into the dead broker; the broker is restarted once a task has failed. (A
    # producer rides out an outage shorter than its timeout: it reconnects and sends again
    # within the deadline, and nothing fails. Restarted at a time, the broker could be back
    # before a busy machine's Spark had produced anything into the outage: no retry.)
    reached, resume = str(tmp_path / "reached"), str(tmp_path / "resume")
    df = spark.range(rows, numPartitions=8).select(
        _pause_once_at(2_500, reached, resume)(
            F.concat(F.lit("v-"), F.col("id"), F.lit("-"), F.repeat(F.lit("x"), 200)),
            F.col("id"),
        ).alias("value"),
        F.col("id"),
    )
    killed, task_failed = threading.Event(), threading.Event()
    tracker = spark.sparkContext.statusTracker()

    def failed_tasks() -> int:
        stages = (tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds())
        return sum(stage.numFailedTasks for stage in stages if stage is not None)

    def kill_then_restart() -> None:
        deadline = time.monotonic() + 120
        while not os.path.exists(reached):
            if time.monotonic() > deadline:
                return  # the job never got there: the asserts below say so
            time.sleep(0.02)
        faults.kill()
        killed.set()
        Path(resume).touch()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if failed_tasks():
                task_failed.set()
                break
            time.sleep(0.05)
        faults.restart()

    fault = threading.Thread(target=kill_then_restart, daemon=True)
    fault.start()
    try:
        report = pks.publish(
            df,
            broker.faulty_jetstream_url,
            topic=subject,
            id_col="id",
            create_stream=True,
            stream_storage="file",
            timeout=timeout,
        )
    finally:
        Path(resume).touch()  # whatever happened, no task waits any more
        fault.join(120)
    assert killed.is_set(), "the job never reached the row it stops at"
    assert task_failed.is_set(), "no task failed within 90 s of the kill"
    assert report.delivered == rows
    stored = anyio.run(read_jetstream, broker.jetstream_url, subject, rows)
    ids = [int(record["headers"]["Nats-Msg-Id"]) for record in stored]
    assert len(ids) == rows, f"{len(ids) - len(set(ids))} duplicates, {rows - len(set(ids))} lost"
    assert sorted(ids) == list(range(rows))
    assert report.retried_partitions >= 1  # the kill failed some messages: Spark retried
