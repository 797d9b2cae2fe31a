"""``read_report``: what ``partition_writer``'s report file sums to, with no Spark session (the
tasks' lines are written by ``write_rows`` as an executor does, or by hand)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pyspark")  # _append_report asks pyspark's TaskContext for the task

from producerkit.spark._partition import read_report, write_rows
from producerkit.spark._publish import make_config


def test_a_task_written_report_has_its_duration(tmp_path: Path) -> None:
    """spark_examples/foreach_partition.py printed "in 0.00s (0 rows/s)": the report file
    carried no times, and read_report gave from_rows no duration."""
    path = tmp_path / "report.jsonl"
    config = make_config(f"memory://{uuid.uuid4().hex}", topic="orders")
    write = {
        "sink": config.to_dict(),
        "key_given": False,
        "counters": None,
        "report_path": str(path),
    }
    started = time.time()
    counts = write_rows(write, ({"value": b"%d" % i} for i in range(2_000)))
    took = time.time() - started
    assert counts.delivered == 2_000
    report = read_report(str(path))
    assert report.delivered == 2_000
    assert 0 < report.seconds <= took
    assert report.rows_per_second == pytest.approx(2_000 / report.seconds)
    assert " in 0.00s " not in str(report)


def test_the_duration_spans_the_jobs_tasks(tmp_path: Path) -> None:
    """From the first task's start to the last one's end, over the last job (stage) only; a
    retried partition counted once; a file written before the times were recorded gives 0."""

    def line(stage: int, partition: int, attempt: int, started: float, ended: float) -> str:
        task = {"stage": stage, "partition": partition, "attempt": attempt, "rows": 10}
        task |= {"delivered": 10, "failed": 0, "errors": {}, "first_error": None}
        return json.dumps(task | {"started": started, "ended": ended}) + "\n"

    path = tmp_path / "report.jsonl"
    path.write_text(
        line(1, 0, 0, 10.0, 90.0)  # an earlier job
        + line(2, 0, 0, 100.0, 101.5)
        + line(2, 1, 1, 100.5, 102.0)
        + line(2, 1, 2, 101.0, 102.5)  # a speculative copy of partition 1, not counted twice
    )
    report = read_report(str(path))
    assert (report.delivered, len(report.partitions)) == (20, 2)
    assert report.seconds == pytest.approx(2.5)
    assert report.rows_per_second == pytest.approx(8.0)

    old = {"stage": 0, "partition": 0, "attempt": 0, "rows": 1, "delivered": 1, "failed": 0}
    path.write_text(json.dumps(old | {"errors": {}, "first_error": None}) + "\n")
    assert read_report(str(path)).seconds == 0.0
