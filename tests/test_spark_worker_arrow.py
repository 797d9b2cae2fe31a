"""The Spark sink's worker without Spark: Arrow chunks reach produce_batch as Arrow arrays (no
Python object per row in the worker) and publish the same as the row path; a null value still
fails its own row only; a reused Spark worker freezes what it holds once it has a producer,
and again at its 2nd, 4th, 8th, ... task."""

from __future__ import annotations

import gc
import uuid
from typing import Any

import anyio
import pytest
from conftest import BackendCase

pa = pytest.importorskip("pyarrow")

from producerkit.backends.memory import get_store  # noqa: E402
from producerkit.spark import _worker  # noqa: E402


@pytest.fixture(autouse=True)
def _no_cached_producers() -> Any:
    yield
    _worker.close_all()


def _batch(values: list[Any], keys: list[Any] | None, text: bool) -> Any:
    kind = pa.string() if text else pa.binary()
    columns = {"value": pa.array(values, kind)}
    if keys is not None:
        columns["key"] = pa.array(keys, kind)
    return pa.RecordBatch.from_pydict(columns)


@pytest.mark.parametrize("text", [True, False])
def test_arrow_value_and_key_columns_stay_arrow_arrays(text: bool) -> None:
    config = _worker.SinkConfig(url="null://", topic="t")
    values, keys = (["a", "b"], ["k", None]) if text else ([b"a", b"b"], [b"k", None])
    batch = _batch(values, keys, text)
    (chunk,) = _worker.chunks_from_arrow([batch], config.columns(), config.byte_roles())
    for role in ("value", "key"):
        assert isinstance(chunk[role], pa.Array) and pa.types.is_binary(chunk[role].type)
    assert chunk["value"].to_pylist() == [b"a", b"b"]
    assert chunk["key"].to_pylist() == [b"k", None]


def test_a_serialized_column_is_still_plain_python() -> None:
    config = _worker.SinkConfig(url="null://", topic="t", value_serializer="str")
    (chunk,) = _worker.chunks_from_arrow(
        [_batch(["a"], ["k"], text=True)], config.columns(), config.byte_roles()
    )
    assert chunk["value"] == ["a"]  # the serializer takes it row by row
    assert isinstance(chunk["key"], pa.Array)


def test_arrow_chunks_publish_what_lists_publish() -> None:
    """The same rows through Arrow chunks and through lists: the same records, in order."""
    values = [f"v{i}-" + "x" * (i % 50) for i in range(2500)]
    keys = [None if i % 7 == 0 else f"user-{i % 13}" for i in range(2500)]
    stored = []
    for arrow in (True, False):
        name = f"spark-arrow-{uuid.uuid4().hex}"
        config = _worker.SinkConfig(url=f"memory://{name}?partitions=3", topic="t")
        batches = [_batch(values[i : i + 1000], keys[i : i + 1000], True) for i in (0, 1000, 2000)]
        if arrow:
            chunks = list(_worker.chunks_from_arrow(batches, config.columns(), config.byte_roles()))
        else:
            chunks = [
                {
                    "value": [v.encode() for v in values[i : i + 1000]],
                    "key": [k if k is None else k.encode() for k in keys[i : i + 1000]],
                }
                for i in (0, 1000, 2000)
            ]
        counts = _worker.publish_task(config, chunks)
        assert (counts.rows, counts.delivered, counts.failed) == (2500, 2500, 0)
        stored.append([(r.partition, r.key, r.value) for r in get_store(name).topic("t")])
    assert stored[0] == stored[1]
    assert sorted(value for _, _, value in stored[0]) == sorted(v.encode() for v in values)


def test_a_null_in_an_arrow_value_column_fails_that_row_only(
    backend: BackendCase, topic: str
) -> None:
    config = _worker.SinkConfig(
        url=backend.url,
        topic=topic,
        on_error="count",
        producer_kwargs=tuple(sorted({**backend.options, "timeout": 10}.items())),
    )
    batch = _batch(["a", None, "c"], ["k", "k", None], text=True)
    chunks = _worker.chunks_from_arrow([batch], config.columns(), config.byte_roles())
    counts = _worker.publish_task(config, chunks)
    assert (counts.rows, counts.delivered, counts.failed) == (3, 2, 1)
    assert counts.errors == {"MessageError": 1}
    if backend.spec.stores_records:
        stored = {r["value"]: r["key"] for r in anyio.run(backend.read, topic, 2)}
        keys = {b"a": b"k", b"c": None} if backend.spec.partitioned else {b"a": None, b"c": None}
        assert stored == keys  # NATS subjects keep no key


def test_a_failure_still_stops_a_failing_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between chunks a task asks whether a message failed at most every interval; with the
    interval at 0 it asks before every chunk, and stops at the chunk after the failure."""
    monkeypatch.setattr(_worker, "_FAILURE_CHECK_INTERVAL", 0.0)
    sent: list[int] = []
    send_chunk = _worker._send_chunk

    def counted(producer: Any, chunk: Any, tally: Any, fail_fast: bool) -> None:
        sent.append(len(chunk["value"]))
        send_chunk(producer, chunk, tally, fail_fast)
        if len(sent) == 1:  # as if a message of the first chunk failed on the broker
            failures.append(1)

    failures: list[int] = []
    monkeypatch.setattr(_worker, "_send_chunk", counted)

    class Stats:
        @property
        def failed(self) -> int:
            return len(failures)

    config = _worker.SinkConfig(url=f"memory://{uuid.uuid4().hex}", topic="t")
    entry = _worker._lease(config)
    _worker._release(entry)
    monkeypatch.setattr(type(entry.producer), "stats", property(lambda self: Stats()))
    chunks = [{"value": [b"a"]}, {"value": [b"b"]}, {"value": [b"c"]}]
    _worker.publish_task(config, chunks)
    assert sent == [1]  # the second chunk saw the failure: nothing more was sent


def test_a_reused_spark_worker_freezes_what_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """PySpark's daemon collects garbage after every task of a reused worker: once the worker
    has a producer, what it holds is frozen, and unfrozen again when the producer closes."""
    gc.unfreeze()
    config = _worker.SinkConfig(url="null://", topic="t")
    _worker.publish_task(config, [{"value": [b"a"]}])
    assert gc.get_freeze_count() == 0  # not in a Spark worker: nothing frozen
    _worker.close_all()
    gc.freeze()  # the process's own freeze is its own: closing a producer leaves it
    _worker.publish_task(config, [{"value": [b"a"]}])
    assert gc.get_freeze_count() > 0
    _worker.close_all()
    # Not unfrozen (that would leave none). Not "the same count": a frozen object freed
    # meanwhile (another test's thread ending, say) leaves the frozen set.
    assert gc.get_freeze_count() > 0
    gc.unfreeze()

    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    try:
        _worker.publish_task(config, [{"value": [b"a"]}])
        assert gc.get_freeze_count() > 0
        _worker.close_all()
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_a_reused_spark_worker_freezes_again_at_its_2nd_4th_8th_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a worker takes in after its producer is built (PySpark's pandas, pyarrow.compute)
    is frozen too: collected and frozen once more at the 2nd, 4th, 8th, ... task."""

    def frozen(held: list[list[int]]) -> list[int]:
        collected = {id(item) for item in gc.get_objects()}  # every generation but frozen
        return [item[0] for item in held if id(item) not in collected]

    gc.unfreeze()
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    config = _worker.SinkConfig(url="null://", topic="t")
    held: list[list[int]] = []  # one object per task taken in before it (a list is tracked)
    seen: dict[int, list[int]] = {}
    try:
        for task in range(1, 10):
            held.append([task])
            _worker.publish_task(config, [{"value": [b"a"]}])
            seen[task] = frozen(held)
    finally:
        _worker.close_all()
        gc.unfreeze()
    assert seen == {
        1: [1],  # the producer is built: the first freeze
        2: [1, 2],
        3: [1, 2],
        4: [1, 2, 3, 4],
        5: [1, 2, 3, 4],
        6: [1, 2, 3, 4],
        7: [1, 2, 3, 4],
        8: [1, 2, 3, 4, 5, 6, 7, 8],
        9: [1, 2, 3, 4, 5, 6, 7, 8],
    }
    assert gc.get_freeze_count() == 0  # the producer closed: all of it unfrozen


@pytest.mark.parametrize("streaming", [False, True])
def test_format_producerkit_freezes_the_driver_workers_that_plan_its_writes(
    monkeypatch: pytest.MonkeyPatch, streaming: bool
) -> None:
    """Spark asks a reused Python worker on the driver for the writer (twice per micro-batch),
    and PySpark's daemon collects garbage after each ask: the first ask freezes what it holds,
    and nothing outside a reused worker."""
    pytest.importorskip("pyspark")
    from pyspark.sql.types import BinaryType, StructField, StructType

    from producerkit.spark import ProducerkitDataSource

    schema = StructType([StructField("value", BinaryType())])
    source = ProducerkitDataSource({"url": "null://", "topic": "t"})
    ask = source.streamWriter if streaming else source.writer
    gc.unfreeze()
    try:
        ask(schema, False)
        assert gc.get_freeze_count() == 0
        monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
        ask(schema, False)
        assert gc.get_freeze_count() > 0
    finally:
        _worker._unfreeze()
        gc.unfreeze()
