"""The mock cluster's ``read_committed`` view judged by Apache Kafka.

One deterministic transactional workload (:func:`workload`) runs three times: on librdkafka's
mock cluster (``kafka_cluster``), whose ``read(topic, isolation_level="read_committed")`` is
the transaction view's model of Kafka, and on Apache Kafka with transactions v2
(``apache_kafka``) and before KIP-890 (``apache_kafka_tv0``), read by a real ``read_committed``
consumer. Its steps, each awaited before the next so that every partition's order is the same
on every cluster:

- plain: idempotent messages, no transaction;
- committed: an atomic batch over every partition, committed;
- aborted: an atomic batch written (flushed) and then aborted by its block raising;
- interleaved: plain messages written between a committed batch's writes;
- fencing: a second producer of the same transactional id initializes it while the first has
  a transaction open; the first goes on writing and commits, and writes one more batch;
- prepared: transactions written whole and left open (``atomic_batch(prepare=True)``), then
  committed, aborted by their handle, or aborted as left open by another client;
- Spark: the exactly-once sink's own task step (``_exactly_once._prepare``: one transactional
  id per output partition) with a retried task (the first attempt prepared and lost, the second
  fencing it), a task whose input fails (aborted) and then succeeds, and a speculative attempt
  that fences the attempt the driver commits (refused on Kafka; the job's ids then aborted);
- open at the end: a prepared transaction over some partitions never ended, followed by plain
  messages and a committed batch everywhere: Kafka's last stable offset holds back everything
  after it in its partitions.

What is compared, per partition, in offset order: each record's key, value and headers.
Offsets are not compared: Kafka writes a control record (a commit or abort marker) at an
offset of its own in each partition a transaction touched, the mock's markers are not in its
read log, and a write Kafka refuses takes no offset. Timestamps are not compared either.

What the clusters legitimately differ in, and how it is checked:

- the mock does not fence: the first producer's writes after the second initialized the id
  are stored (and its commit accepted) where Kafka refuses them. The view calls those batches
  ``fenced`` and serves none of them; so ``read_committed`` agrees, ``read_uncommitted`` of
  the mock holds exactly the view's fenced records more than Kafka's, and the producer sees its
  batch fail ``"fenced"`` on Kafka only (:data:`FENCED_ON_KAFKA_ONLY`);
- with transactions v2 the first producer's writes are refused at its first one after the
  fence (its epoch is old), on Kafka before KIP-890 only once the coordinator wrote the abort
  marker: either way none is stored.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from conftest import TRANSACTIONS_ON_THE_FAST_PATH

import producerkit as pk
from producerkit import transactions
from producerkit.spark import _exactly_once as exactly_once
from producerkit.spark._worker import SinkConfig
from producerkit.testing.apache_kafka import ApacheKafka
from producerkit.testing.kafka_cluster import KafkaCluster

pytestmark = TRANSACTIONS_ON_THE_FAST_PATH

PARTITIONS = 4
#: Keys spread over every partition (the default partitioner: the same on every cluster).
KEYS = [b"k%d" % index for index in range(8)]
#: The steps whose producer-side outcome differs because the mock does not fence: "ok" on the
#: mock, "fenced" on Kafka.
FENCED_ON_KAFKA_ONLY = frozenset(
    {
        "fencing: the first producer's commit",
        "fencing: the first producer again",
        "spark: stale commit",
    }
)

#: A record as compared: key, value, headers.
Record = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


# ---------------------------------------------------------------------- the workload


@dataclass
class Run:
    """One cluster's run of :func:`workload`: each step's outcome (``"ok"`` or the
    AtomicBatchError's kind), and what each isolation level reads, by partition. On the mock,
    also the records of the batches the view calls fenced, and the view's last stable
    offsets."""

    outcomes: dict[str, str]
    committed: dict[int, list[Record]]
    uncommitted: dict[int, list[Record]]
    fenced: dict[int, list[Record]] = field(default_factory=dict)
    last_stable_offsets: dict[int, int] = field(default_factory=dict)
    #: Transactional writes and ends under a producer id and epoch no InitProducerId granted
    #: their transactional id, as ``(transactional id, producer id, epoch)``.
    not_granted: set[tuple[str, int, int]] = field(default_factory=set)


async def workload(url: str, topic: str) -> dict[str, str]:
    """The transactional workload (see the module docstring) on the cluster at ``url``, into
    ``topic`` (``PARTITIONS`` partitions): each step's outcome, by name."""
    outcomes: dict[str, str] = {}
    prefix = f"vk-{uuid.uuid4().hex[:8]}"

    @contextlib.asynccontextmanager
    async def step(name: str) -> AsyncIterator[None]:
        try:
            yield
        except pk.AtomicBatchError as exc:
            outcomes[name] = str(exc.kind)
        else:
            outcomes[name] = "ok"

    def producer(name: str | None = None) -> pk.Producer:
        options: dict[str, Any] = {} if name is None else {"transactional_id": f"{prefix}-{name}"}
        return pk.Producer(url, topic=topic, timeout=20.0, **options)

    async def write(target: Any, label: str, keys: list[bytes] = KEYS) -> None:
        for key in keys:
            headers = [("step", label.encode())]
            await target.produce(b"%s-%s" % (label.encode(), key), key=key, headers=headers)

    async with producer() as plain, producer("a") as a:
        await write(plain, "plain-1")
        async with step("committed"), a.atomic_batch() as batch:
            await write(batch, "committed")
        async with step("aborted"):
            with contextlib.suppress(RuntimeError):
                async with a.atomic_batch() as batch:
                    await write(batch, "aborted")
                    await a.flush()  # in the log before the abort
                    raise RuntimeError("the application fails mid-batch")
        async with step("interleaved"), a.atomic_batch() as batch:
            await write(batch, "interleaved-txn-1")
            await a.flush()
            await write(plain, "interleaved-plain")  # acked, between the two writes
            await write(batch, "interleaved-txn-2")

        # Fencing: b2 initializes b's id while b has a transaction open.
        async with producer("b") as b1, producer("b") as b2:
            async with step("fencing: the first producer's commit"), b1.atomic_batch() as batch:
                await write(batch, "fenced-before", KEYS[:4])
                await b1.flush()
                async with step("fencing: the second producer"), b2.atomic_batch() as second:
                    await write(second, "fencing-second")
                await write(batch, "fenced-after")
            async with step("fencing: the first producer again"), b1.atomic_batch() as batch:
                await write(batch, "fenced-again")
            async with step("fencing: the second producer again"), b2.atomic_batch() as second:
                await write(second, "fencing-second-again")
        await write(plain, "plain-2")

        # Prepared transactions, ended by another client.
        prepared: dict[str, Any] = {}
        for name in ("commit", "abort", "left-open"):
            async with producer(f"p-{name}") as writer:
                async with step(f"prepared {name}"), writer.atomic_batch(prepare=True) as batch:
                    await write(batch, f"prepared-{name}")
                prepared[name] = batch.prepared  # type: ignore[union-attr]
        async with step("commit_prepared"):
            await transactions.commit_prepared(url, prepared["commit"])
        async with step("abort_prepared"):
            await transactions.abort_prepared(url, prepared["abort"])
        async with step("abort_open"):
            await transactions.abort_open(url, [prepared["left-open"].transactional_id])

        for name, outcome in (await anyio.to_thread.run_sync(_spark, url, topic, prefix)).items():
            outcomes[f"spark: {name}"] = outcome
        await write(plain, "plain-3")

        # Left open at the end, in the partitions of two keys: what follows there is held back.
        async with (
            producer("open") as writer,
            step("open"),
            writer.atomic_batch(prepare=True) as batch,
        ):
            await write(batch, "open", KEYS[:2])
        await write(plain, "plain-after-open")
        async with step("committed after open"), a.atomic_batch() as batch:
            await write(batch, "committed-after-open")
    return outcomes


def _spark(url: str, topic: str, prefix: str) -> dict[str, str]:
    """The exactly-once sink's steps as Spark would run them, without Spark: each task's
    transaction written and prepared by ``_exactly_once._prepare`` under the transactional id
    ``{job}-{partition}``, and ended by the driver's ``commit_job`` / ``abort_job``."""
    config = SinkConfig(url, topic=topic, exactly_once=True, exactly_once_timeout=60.0)
    outcomes: dict[str, str] = {}

    def task(job: str, partition: int, attempt: str, fail: bool = False) -> Any:
        def chunks() -> Iterator[dict[str, list[bytes]]]:
            for half in (KEYS[:4], KEYS[4:]):
                values = [b"spark-%s-%d-%s-%s" % (job.encode(), partition, attempt.encode(), k)
                          for k in half]  # fmt: skip
                yield {"value": values, "key": list(half)}
                if fail:
                    raise RuntimeError("the task's input failed")

        try:
            # a first attempt takes its id only if it is new, as in a Spark batch job
            transactional_id = f"{prefix}-{job}-{partition}"
            first = attempt == "1"
            _, handle = exactly_once._prepare(config, chunks(), transactional_id, fresh=first)
        except RuntimeError:
            outcomes[f"task {partition} attempt {attempt}"] = "input failed"
            return None
        outcomes[f"task {partition} attempt {attempt}"] = "ok"
        return handle

    # Job 1: task 0's first attempt prepares and is lost; its retry fences it. Task 1's first
    # attempt fails on its input; its retry succeeds. The driver commits the retries.
    task("j1", 0, "1")
    retried = task("j1", 0, "2")
    task("j1", 1, "1", fail=True)
    succeeded = task("j1", 1, "2")
    try:
        exactly_once.commit_job(config, [retried, succeeded])
        outcomes["commit"] = "ok"
    except pk.AtomicBatchError as exc:
        outcomes["commit"] = str(exc.kind)
    # Job 2: the driver has task 0's first attempt's handle; a speculative second attempt
    # fenced it meanwhile, so its commit is refused (Kafka) and the job fails: its ids are
    # initialized again. (The mock takes the commit; the same abort then ends what the
    # speculative attempt left open there, as it does on Kafka.)
    stale = task("j2", 0, "1")
    task("j2", 0, "speculative")
    try:
        exactly_once.commit_job(config, [stale])
        outcomes["stale commit"] = "ok"
    except pk.AtomicBatchError as exc:
        outcomes["stale commit"] = str(exc.kind)
    exactly_once.abort_job(config, [], [f"{prefix}-j2-0"])
    return outcomes


# ---------------------------------------------------------------------- the runs


def _by_partition(records: list[tuple[int, Record]]) -> dict[int, list[Record]]:
    found: dict[int, list[Record]] = {partition: [] for partition in range(PARTITIONS)}
    for partition, record in records:
        found[partition].append(record)
    return found


def _record(key: Any, value: Any, headers: Any) -> Record:
    return key, value, tuple((name, raw) for name, raw in headers)


_RUNS: dict[str, Run] = {}


@pytest.fixture
def mock_run(kafka_cluster: KafkaCluster) -> Run:
    """The workload on the mock cluster, read through its transaction view (once a session)."""
    if "mock" not in _RUNS:
        topic = f"vk-{uuid.uuid4().hex[:12]}"
        kafka_cluster.create_topic(topic, partitions=PARTITIONS, replication=3)
        outcomes = anyio.run(workload, kafka_cluster.url, topic)

        def read(isolation: Any) -> dict[int, list[Record]]:
            records = kafka_cluster.read(topic, 30.0, isolation_level=isolation)
            return _by_partition(
                [(r.partition, _record(r.key, r.value, r.headers)) for r in records]
            )

        view = kafka_cluster.transactions.view(topic)
        _RUNS["mock"] = Run(
            outcomes,
            read("read_committed"),
            read("read_uncommitted"),
            _fenced(kafka_cluster, topic, view),
            dict(view.last_stable_offsets),
            _not_granted(kafka_cluster, topic),
        )
    return _RUNS["mock"]


def _not_granted(cluster: KafkaCluster, topic: str) -> set[tuple[str, int, int]]:
    log = cluster.transactions
    ids = {produce.transactional_id for produce in log.produces(topic)}
    used = {(p.transactional_id, p.producer_id, p.epoch) for p in log.produces(topic)}
    used |= {(e.transactional_id, e.producer_id, e.epoch) for t in ids for e in log.ends(t)}
    granted = {(i.transactional_id, i.producer_id, i.epoch) for t in ids for i in log.inits(t)}
    return used - granted


def _fenced(cluster: KafkaCluster, topic: str, view: Any) -> dict[int, list[Record]]:
    """The records of the batches the view calls fenced, by partition, in offset order."""
    spans = [
        (batch.partition, batch.base_offset, batch.base_offset + batch.record_count)
        for batch, state in view.batches
        if state == "fenced" and batch.base_offset is not None
    ]
    records = cluster.read(topic, 30.0)
    return _by_partition(
        [
            (r.partition, _record(r.key, r.value, r.headers))
            for r in records
            if any(p == r.partition and start <= r.offset < end for p, start, end in spans)
        ]
    )


@pytest.fixture(params=["apache_kafka", "apache_kafka_tv0"])
def kafka_run(request: pytest.FixtureRequest) -> tuple[str, Run]:
    """The workload on Apache Kafka (transactions v2, and before KIP-890), read by real
    consumers (once a session each)."""
    name = request.param
    if name not in _RUNS:
        kafka: ApacheKafka = request.getfixturevalue(name)
        topic = f"vk-{uuid.uuid4().hex[:12]}"
        kafka.create_topic(topic, partitions=PARTITIONS)
        outcomes = anyio.run(workload, kafka.url, topic)
        _RUNS[name] = Run(
            outcomes, _read_settled(kafka, topic), _read(kafka, topic, "read_uncommitted")
        )
    return name, _RUNS[name]


def _read(kafka: ApacheKafka, topic: str, isolation: str) -> dict[int, list[Record]]:
    records = kafka.read(topic, isolation=isolation, timeout=30.0)
    return _by_partition(
        [(r["partition"], _record(r["key"], r["value"], r["headers"])) for r in records]
    )


def _read_settled(kafka: ApacheKafka, topic: str) -> dict[int, list[Record]]:
    """``read_committed`` to each partition's last stable offset, once two reads agree: a
    commit's markers are written after its EndTxn was answered, so the LSO may still move."""
    last = _read(kafka, topic, "read_committed")
    for _ in range(20):
        time.sleep(0.25)
        now = _read(kafka, topic, "read_committed")
        if now == last:
            return now
        last = now
    return last


# ---------------------------------------------------------------------- the comparisons


def _differences(mine: dict[int, list[Record]], theirs: dict[int, list[Record]]) -> list[str]:
    """Per partition, where two reads part (empty: the same records in the same order)."""
    found = []
    for partition in range(PARTITIONS):
        a, b = mine[partition], theirs[partition]
        if a == b:
            continue
        same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        at = min(len(a), len(b)) if same is None else same
        found.append(
            f"partition {partition}: {len(a)} against {len(b)} records, first apart at {at}: "
            f"{a[at : at + 2]} against {b[at : at + 2]}"
        )
    return found


def test_read_committed_is_the_same_record_for_record(
    mock_run: Run, kafka_run: tuple[str, Run]
) -> None:
    """The view serves what a real ``read_committed`` consumer is served, partition by
    partition: committed batches, plain messages, nothing aborted, fenced or open, and nothing
    past an open transaction's first record in its partitions."""
    name, kafka = kafka_run
    assert _differences(mock_run.committed, kafka.committed) == [], name
    served = {value for records in kafka.committed.values() for _, value, _ in records}
    for label in (b"aborted-", b"fenced-", b"prepared-abort", b"prepared-left-open", b"open-"):
        assert not any(value and value.startswith(label) for value in served), label
    assert any(value and value.startswith(b"prepared-commit") for value in served)
    # The open transaction holds back its partitions, and those only.
    assert 0 < len(mock_run.last_stable_offsets) < PARTITIONS
    for partition, records in kafka.committed.items():
        held = partition in mock_run.last_stable_offsets
        after = any(value and value.startswith(b"committed-after-open") for _, value, _ in records)
        assert after is not held, partition


def test_read_uncommitted_differs_by_the_fenced_writes_only(
    mock_run: Run, kafka_run: tuple[str, Run]
) -> None:
    """Every record Kafka stores the mock stores, in the same order; the mock stores besides
    exactly what the view calls fenced (the first producer's writes after the second
    initialized its id), which Kafka refused."""
    name, kafka = kafka_run
    assert any(mock_run.fenced.values())
    kept = {
        partition: [record for record in records if record not in mock_run.fenced[partition]]
        for partition, records in mock_run.uncommitted.items()
    }
    assert _differences(kept, kafka.uncommitted) == [], name
    fenced = {value for records in mock_run.fenced.values() for _, value, _ in records}
    assert all(value and value.startswith(b"fenced-") for value in fenced)


def test_the_producer_sees_the_same_outcomes_but_fencing(
    mock_run: Run, kafka_run: tuple[str, Run]
) -> None:
    """Every step ends the same on the mock and on Kafka, but those the mock does not fence:
    there they succeed, on Kafka they fail ``"fenced"``."""
    name, kafka = kafka_run
    assert set(mock_run.outcomes) == set(kafka.outcomes)
    apart = {
        step: (mock_run.outcomes[step], kafka.outcomes[step])
        for step in mock_run.outcomes
        if mock_run.outcomes[step] != kafka.outcomes[step]
    }
    assert apart == dict.fromkeys(FENCED_ON_KAFKA_ONLY, ("ok", "fenced")), name


def test_the_mock_speaks_transactions_v1(mock_run: Run) -> None:
    """On the mock every transactional write and EndTxn is under a producer id and epoch an
    InitProducerId granted: no EndTxn v5 bumps an epoch there (the mock finalizes no
    ``transaction.version``), so what the view cannot read of transactions v2 never arises."""
    assert mock_run.not_granted == set()
