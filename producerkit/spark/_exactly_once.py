"""``exactly_once=True``: each row stored once, whatever Spark retries (docs/spark.md).

**Kafka: a two-phase commit.** Each task writes its rows in a Kafka transaction it does not
commit (``SyncProducer.prepare_transaction``), with the transactional id ``{job}-{partition}``:
one per *output partition*, not per attempt, so a retried or speculative attempt's producer
id, initialized again, fences the earlier attempt and aborts what it left open. The task hands its
:class:`~producerkit.transactions.PreparedTransaction` to the driver with its counts; once every
task succeeded the driver commits them all, and if the job fails it aborts those it got and
initializes every id of the job (which aborts what the others left open).

A failed attempt's Python worker may live on after Spark started the retry (its input cut at
a batch boundary reads as its end); one whose producer was slow to take its transactional id (a
coordinator being elected) would take it after the retry did, abort the retry's prepared
transaction and leave one of its own open. So in a batch job, whose ids are new, a first
attempt takes its id only if no producer initialized it before (``fresh_transactional_id``):
such a late first attempt fails instead. Retries and speculative attempts take the id
whatever came before.

- ``publish()`` and ``df.write.format("producerkit")``: ``{job}`` is fresh per write
  (``pk-`` and 16 hex digits); the driver step is ``publish()``'s own, or the writer's
  ``commit()`` / ``abort()``.
- Streaming: ``{job}`` is ``pk-{query id}-{batch id}``, read by each task from Spark's local
  properties: a micro-batch replayed after a restart writes with the same ids as its first run,
  so it fences that run's tasks. Before committing a micro-batch, the driver records the
  handles in a :class:`CommitLog` (``intent``), commits them, then marks the batch ``done``; the
  writer Spark makes before each micro-batch (``streamWriter()``, on the driver, before any task
  of the batch runs) first commits every batch the log holds as an intent (a driver that died
  between the two steps), so a replay's tasks never fence a transaction that should have been
  committed. A replayed batch the log holds as done writes nothing; one that was partly
  committed (a handle refused, e.g. fenced by a speculative attempt) writes only its other
  partitions.

**JetStream: message ids.** Without ``id_col``, each row's message id (``msg_id``) is
``{job}-{partition}-{row}``, its position in its partition (the job as above), so a retried
task or a replayed micro-batch repeats the ids and the server drops the duplicates within the
stream's duplicate window; the driver reads that window up front (:func:`check_window`).

Everything that needs the network on the driver runs on an event loop of its own, in a thread,
so a notebook's running loop does not matter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import attrs

from producerkit._options import ProducerOptions
from producerkit._urls import parse_url
from producerkit.backends import spec_for
from producerkit.errors import AtomicBatchError, ConfigurationError
from producerkit.spark._worker import SinkConfig, TaskCounts, publish_task

if TYPE_CHECKING:
    from producerkit.backends.base import BackendSpec, Prepared, PreparedBatches
    from producerkit.spark._chunks import Chunk
    from producerkit.spark._publish import PublishReport

__all__ = [
    "DEFAULT_TIMEOUT",
    "CommitLog",
    "Job",
    "abort_job",
    "check_duration",
    "check_job",
    "commit_batch",
    "commit_job",
    "last_job",
    "new_job",
    "recover",
    "wait_for_tasks",
    "write_task",
]

logger = logging.getLogger("producerkit.spark")

T = TypeVar("T")

#: ``exactly_once_timeout``'s default, in seconds: Kafka brokers' default most
#: (``transaction.max.timeout.ms``, 15 minutes).
DEFAULT_TIMEOUT: Final = 900.0
#: The in-flight window of an exactly-once task's producer: a transaction's messages count in
#: flight until it is prepared, so the window must hold a whole partition.
_WHOLE_PARTITION: Final = 2**31 - 1
#: Commits (and aborts) the driver has on the way at once.
_CONCURRENT_ENDS: Final = 16
#: Micro-batches a CommitLog keeps (Spark keeps 100 of its own by default).
_KEPT_BATCHES: Final = 100
#: Spark's local properties of a streaming task.
_QUERY_ID, _BATCH_ID = "sql.streaming.queryId", "streaming.sql.batchId"


@attrs.frozen(slots=True)
class Job:
    """Which exactly-once write a task belongs to: plain data, shipped to the executors.

    ``prefix``: the write's id (``publish()``, ``save()``); None for a streaming query, whose
    tasks read the query id and batch id from Spark. ``skip``: streaming batch id -> the
    partitions already committed (None: the whole batch), as the commit log says when Spark
    asks for the writer: a replay of them writes nothing."""

    prefix: str | None = None
    skip: Mapping[int, tuple[int, ...] | None] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "skip": [[b, p] for b, p in self.skip.items()]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Job:
        skip = {int(b): None if p is None else tuple(p) for b, p in data.get("skip", ())}
        return cls(data.get("prefix"), skip)


def new_job() -> Job:
    """A fresh id for one batch write."""
    return Job(prefix=f"pk-{uuid.uuid4().hex[:16]}")


def prepared_names(prefix: str, partitions: int) -> list[str]:
    """The names a job's tasks prepare under, one per output partition."""
    return [f"{prefix}-{partition}" for partition in range(partitions)]


# ---------------------------------------------------------------------- checks, on the driver


def way_of(config: SinkConfig) -> Literal["prepared", "ids"]:
    """How a write is made exactly once on ``config.url``'s backend: ``"prepared"``, each task's
    rows in an atomic batch it prepares and the driver ends (Kafka transactions), or ``"ids"``,
    each row with an id the broker drops a second time within its duplicate window
    (JetStream). ConfigurationError for a backend with neither."""
    spec = _spec_of(config)
    if spec.prepared is not None:
        return "prepared"
    if spec.duplicate_window is not None:
        return "ids"
    raise ConfigurationError(
        f"exactly_once is for kafka:// (transactions) and jetstream:// (message ids), not "
        f"{parse_url(config.url).scheme}://"
    )


def prepared_of(config: SinkConfig) -> PreparedBatches:
    """The prepared batches of ``config.url``'s backend (``way_of`` said ``"prepared"``)."""
    prepared = _spec_of(config).prepared
    assert prepared is not None
    return prepared


def _spec_of(config: SinkConfig) -> BackendSpec:
    return spec_for(parse_url(config.url).scheme)


def timeout_of(config: SinkConfig) -> float:
    """The longest an exactly-once job (a micro-batch) may take, in seconds."""
    if config.exactly_once_timeout is not None:
        return config.exactly_once_timeout
    given = prepared_of(config).timeout(dict(config.producer_kwargs))
    return given if given is not None else DEFAULT_TIMEOUT


def check_job(config: SinkConfig) -> float | None:
    """Refuse, on the driver, an exactly-once write that could not be one: another backend,
    on Kafka an option exactly-once sets itself (``transactional_id``), settings that rule out
    transactions (``acks`` other than all, ``enable_idempotence=False``), a partition column or
    ``on_error="count"`` (a transaction is all or nothing), on JetStream a stream whose
    duplicate window is shorter than ``exactly_once_timeout`` (or, that not given, a warning
    naming the window). Raises ConfigurationError before any task runs; returns that window
    (JetStream)."""
    if way_of(config) == "prepared":
        prepared = prepared_of(config)
        kwargs = dict(config.producer_kwargs)
        if (name := prepared.name_option) in kwargs:
            raise ConfigurationError(
                f"{name}={kwargs[name]!r} with exactly_once: exactly_once gives each task's "
                "transaction an id of its own, one per output partition of the write "
                "({job}-{partition}), so that a retried or speculative attempt fences the "
                f"earlier one and the driver can commit or abort each: drop {name}"
            )
        if (refusal := prepared.refusal(kwargs)) is not None:
            raise ConfigurationError(f"exactly_once: {refusal}")
        if config.partition_col is not None:
            raise ConfigurationError(
                "exactly_once on Kafka routes rows by key (a transaction's batch takes no "
                "partition): drop partition_col"
            )
        if config.on_error != "fail":
            raise ConfigurationError(
                'exactly_once on Kafka takes on_error="fail": a task\'s rows are committed '
                "whole or not at all"
            )
        given = prepared.timeout(kwargs)
        timeout = config.exactly_once_timeout
        if timeout is not None and given is not None and given != timeout:
            option = prepared.timeout_option
            raise ConfigurationError(
                f"exactly_once_timeout={timeout:g} and {option}={kwargs[option]} disagree: give one"
            )
        return None
    return check_window(config) if config.id_col is None else None


def check_window(config: SinkConfig) -> float | None:
    """Compare the stream's duplicate window with ``exactly_once_timeout`` (see check_job);
    the window, in seconds."""
    window = run(_duplicate_window, config)
    if window is None:
        return None  # no stream and none to be created: the job fails on its own, saying so
    where = f"the stream of {config.topic!r}"
    if window <= 0:
        raise ConfigurationError(
            f"{where} keeps no duplicate window: a retried task would store its rows twice"
        )
    if config.exactly_once_timeout is None:
        logger.warning(
            "exactly_once into JetStream: %s drops duplicates for %.0f s; a task retried, or a "
            "micro-batch replayed, later than that after its first run stores its rows twice. "
            "Pass exactly_once_timeout=<the job's longest run, in seconds> to have it checked.",
            where,
            window,
        )
    elif config.exactly_once_timeout > window:
        raise ConfigurationError(
            f"exactly_once_timeout={config.exactly_once_timeout:g} s is longer than {where}'s "
            f"duplicate window ({window:g} s): a row retried after the window would be stored "
            "twice. Raise the stream's duplicate_window, or lower exactly_once_timeout."
        )
    return window


def check_duration(config: SinkConfig, window: float | None, report: PublishReport) -> None:
    """After a JetStream job: a retried task whose first attempt ran longer ago than the
    duplicate window may have stored rows twice; say so."""
    if window is None or not report.retried_partitions or report.seconds <= window:
        return
    logger.warning(
        "exactly_once into JetStream: the job took %.0f s, longer than the stream's duplicate "
        "window (%.0f s), and %d partition(s) were retried: rows of a first attempt older than "
        "the window may be stored twice",
        report.seconds,
        window,
        report.retried_partitions,
    )


async def _duplicate_window(config: SinkConfig) -> float | None:
    """The duplicate window (seconds) of the stream ``config.topic`` goes to (see the spec's
    ``duplicate_window``)."""
    duplicate_window = _spec_of(config).duplicate_window
    if config.topic is None or duplicate_window is None:
        return None
    return await duplicate_window(config.url, config.topic, dict(config.producer_kwargs))


# ---------------------------------------------------------------------- on the executors


def write_task(
    config: SinkConfig, chunks: Iterable[Chunk], job: Job
) -> tuple[TaskCounts, Prepared | None]:
    """Write one task's rows exactly once (see the module docstring): its counts, and on Kafka
    the transaction it prepared (None if it wrote nothing)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("exactly_once writes run in Spark tasks")
    partition = context.partitionId()
    prefix = job.prefix
    if prefix is None:  # streaming: the query's id and the micro-batch's
        query, batch = context.getLocalProperty(_QUERY_ID), context.getLocalProperty(_BATCH_ID)
        if query is None or batch is None:
            raise RuntimeError("a streaming exactly_once task without Spark's query or batch id")
        skipped = job.skip.get(int(batch), ())
        if skipped is None or partition in skipped:
            logger.info("micro-batch %s partition %d already committed: skipped", batch, partition)
            return TaskCounts(), None
        prefix = f"pk-{query}-{batch}"
    base = f"{prefix}-{partition}"
    if way_of(config) == "ids":
        if config.id_col is not None:
            return publish_task(config, chunks), None
        return publish_task(config, _with_row_ids(chunks, base)), None
    # A batch job's ids are new: its first attempts take theirs only if no newer attempt did
    # (a failed attempt's Python worker lives on; see the module docstring). A streaming
    # micro-batch's ids are taken again by its replay after a restart.
    first_of_new_id = job.prefix is not None and context.attemptNumber() == 0
    return _prepare(config, chunks, base, fresh=first_of_new_id)


def _with_row_ids(chunks: Iterable[Chunk], base: str) -> Iterator[Chunk]:
    """Each chunk with an ``id`` column: ``{base}-{row}``, the row's position in the task."""
    row = 0
    for chunk in chunks:
        count = len(chunk["value"])
        yield {**chunk, "id": [f"{base}-{index}" for index in range(row, row + count)]}
        row += count


def _prepare(
    config: SinkConfig, chunks: Iterable[Chunk], name: str, *, fresh: bool
) -> tuple[TaskCounts, Prepared | None]:
    """One task on Kafka: its rows in one transaction left open, through a producer of its own
    (a producer that prepared a transaction begins no other); ``fresh``: it takes
    ``name`` (its transactional id) only if no producer initialized it before."""
    from producerkit._sync import SyncProducer

    timeout = timeout_of(config)
    arguments = {
        **config.producer_arguments(),
        **prepared_of(config).options(timeout, name, fresh),
        # the transaction's messages stay in flight until it is prepared: the window and each
        # message's deadline must hold the whole task
        "max_in_flight_messages": _WHOLE_PARTITION,
        "timeout": timeout,
    }
    rows = 0

    def batches() -> Iterator[dict[str, Any]]:
        nonlocal rows
        for chunk in chunks:
            rows += len(chunk["value"])
            yield from _batch_arguments(chunk)

    producer = SyncProducer(config.url, topic=config.topic, **arguments)
    try:
        prepared = producer.prepare_transaction(batches())
    finally:
        with contextlib.suppress(Exception):  # what failed was raised above
            producer.close(timeout=5.0)
    return TaskCounts(rows=rows, delivered=rows), prepared


def _batch_arguments(chunk: Chunk) -> Iterator[dict[str, Any]]:
    """``produce_batch`` arguments for a chunk: one per run of rows with the same topic."""
    from producerkit.spark._worker import _headers

    values, keys, headers = chunk["value"], chunk.get("key"), chunk.get("headers")
    pairs = None if headers is None else [_headers(item) for item in headers]
    topics = chunk.get("topic")
    if topics is None:
        yield {"values": values, "keys": keys, "headers": pairs}
        return
    start = 0
    for end in range(1, len(values) + 1):
        if end == len(values) or topics[end] != topics[start]:
            yield {
                "values": values[start:end],
                "keys": None if keys is None else keys[start:end],
                "headers": None if pairs is None else pairs[start:end],
                "topic": topics[start],
            }
            start = end


# ---------------------------------------------------------------------- the driver's step


def run(function: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any) -> T:
    """``function(*args, **kwargs)`` on an event loop of its own, in a thread (the driver may
    be a notebook with a loop running in this one)."""
    from producerkit.transactions import run_blocking

    return run_blocking(function, *args, **kwargs)


def _end_options(config: SinkConfig) -> tuple[dict[str, Any], float]:
    """The backend options (security, ...) the driver's Kafka requests take, and their
    timeout: the producer's."""
    settings = attrs.fields_dict(ProducerOptions)
    kwargs = dict(config.producer_kwargs)
    timeout = float(kwargs.get("timeout") or 30.0)
    options = {name: value for name, value in kwargs.items() if name not in settings}
    options.update(prepared_of(config).options(timeout_of(config)))
    return options, timeout


def partition_of(prepared: Prepared) -> int:
    return int(prepared.name.rsplit("-", 1)[1])


async def _end_each(
    config: SinkConfig, handles: Sequence[Prepared], *, commit: bool
) -> dict[int, AtomicBatchError]:
    """Commit (or abort) every handle, some at once: those not ended, by partition, each with
    why (the coordinator's refusal; any other failure of the step as an AtomicBatchError of
    kind ``"aborted"`` whose cause it is), so the caller knows which ended whatever failed."""
    prepared = prepared_of(config)
    options, timeout = _end_options(config)
    gate = asyncio.Semaphore(_CONCURRENT_ENDS)
    refused: dict[int, AtomicBatchError] = {}

    async def end_one(handle: Prepared) -> None:
        async with gate:
            try:
                await prepared.end(
                    config.url, handle, commit=commit, timeout=timeout, options=options
                )
            except AtomicBatchError as exc:
                refused[partition_of(handle)] = exc
            except Exception as exc:
                step = "commit" if commit else "abort"
                failed = AtomicBatchError(
                    f"the {step} of {handle.name!r} failed: {type(exc).__name__}: {exc}",
                    kind="aborted",
                )
                failed.__cause__ = exc
                refused[partition_of(handle)] = failed

    await asyncio.gather(*(end_one(handle) for handle in handles))
    return refused


async def _abort_open(config: SinkConfig, ids: list[str]) -> None:
    options, timeout = _end_options(config)
    await prepared_of(config).abort_open(config.url, ids, timeout=timeout, options=options)


def commit_job(config: SinkConfig, handles: Sequence[Prepared]) -> set[int]:
    """Commit every task's transaction (a job that succeeded): the partitions committed.

    Whatever keeps a transaction from its commit (the coordinator's refusal, or the commit
    step failing in any other way), the driver aborts it: the ids of those not committed are
    initialized again, which aborts what they (or a newer attempt of them) left open, so no
    transaction stays open to hold back ``read_committed`` readers. It then raises
    AtomicBatchError naming the partitions committed, those aborted, and those it could not
    abort (the broker aborts them after ``exactly_once_timeout``), and logs the same. The
    others are committed all the same."""
    if not handles:
        return set()
    try:
        refused = run(_end_each, config, handles, commit=True)
    except BaseException as exc:  # interrupted: which committed is not known
        ids = [handle.name for handle in handles]
        _abort_uncommitted(config, ids, f"its commit step raised {type(exc).__name__}")
        raise
    committed = {partition_of(handle) for handle in handles} - set(refused)
    if refused:
        stale = [h.name for h in handles if partition_of(h) in refused]
        aborted = _abort_uncommitted(config, stale, "their commit failed")
        _raise_refused(refused, committed, _ABORTED if aborted else _NOT_ABORTED)
    return committed


def _abort_uncommitted(config: SinkConfig, ids: list[str], why: str) -> bool:
    """Abort whatever the transactional ``ids`` hold open (a committed transaction stays so),
    logging what it did: whether it could."""
    try:
        run(_abort_open, config, ids)
    except Exception as exc:
        logger.error(
            "exactly_once: %s, and aborting the transactions of %s failed too (%s: %s): the "
            "broker aborts them after exactly_once_timeout (%.0f s); until then they hold back "
            "read_committed readers of their partitions",
            why,
            ids,
            type(exc).__name__,
            exc,
            timeout_of(config),
        )
        return False
    logger.error(
        "exactly_once: %s: aborted the transactions of %s (nothing of them stored)", why, ids
    )
    return True


#: What became of the transactions whose commit failed, as the driver's error says it.
_ABORTED: Final = "aborted"
_NOT_ABORTED: Final = (
    "could not be aborted either: the broker aborts them after exactly_once_timeout"
)
_KEPT_FOR_RESTART: Final = "left for the next run of the query to commit (the log's intent)"


def _raise_refused(
    refused: Mapping[int, AtomicBatchError], committed: set[int], ended: str
) -> None:
    first = refused[min(refused)]
    raise AtomicBatchError(
        f"exactly_once: the commit of partition(s) {sorted(refused)} was refused or failed, "
        f"so their rows are not stored: their transactions {ended} (partition(s) "
        f"{sorted(committed) or 'none'} are committed); first: {first}. A 'fenced' refusal: "
        "a newer attempt of the partition (speculation) took its transactional id after this "
        "one had written, or the transaction outlived exactly_once_timeout.",
        kind=first.kind,
        code=first.code,
    ) from first


def abort_job(
    config: SinkConfig,
    handles: Sequence[Prepared],
    ids: Iterable[str],
    *,
    again_after: float | None = None,
) -> bool:
    """A job that failed: abort the transactions of the tasks that succeeded, and initialize
    every transactional id of the job (which aborts what the other attempts left open; call it
    once the job's tasks ended: a task that begins its transaction after it would leave that
    open). ``again_after``: where the tasks' end cannot be waited for, initialize the ids once
    more after that many seconds (Spark kills a failed job's running tasks within seconds).
    Best effort: what cannot be ended, the broker aborts after the transaction timeout.
    Logs what it did; returns whether it could."""
    ids = list(ids)
    try:
        if handles:
            run(_end_each, config, handles, commit=False)
        if ids:
            run(_abort_open, config, ids)
            if again_after is not None:
                time.sleep(again_after)
                run(_abort_open, config, ids)
    except Exception:
        logger.warning(
            "exactly_once: could not abort the failed job's transactions (the broker aborts "
            "them after exactly_once_timeout)",
            exc_info=True,
        )
        return False
    logger.warning(
        "exactly_once: the job failed: aborted what its transactional ids %s held open (a "
        "transaction committed before stays committed)",
        ids or [handle.name for handle in handles],
    )
    return True


def wait_for_tasks(context: Any, after_job: int, timeout: float = 60.0) -> None:
    """Wait (at most ``timeout`` seconds) until no task runs any more in the jobs of this
    thread's job group whose id is above ``after_job``: those of a publish that failed, whose
    running tasks Spark kills (a task still starting could otherwise begin its transaction
    after the driver aborted the job's)."""
    tracker = context.statusTracker()
    group = context.getLocalProperty("spark.jobGroup.id")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = [job for job in tracker.getJobIdsForGroup(group) if job > after_job]
        stages = [
            stage
            for job in jobs
            if (info := tracker.getJobInfo(job)) is not None
            for stage in info.stageIds
        ]
        infos = [tracker.getStageInfo(stage) for stage in stages]
        if not any(info is not None and info.numActiveTasks for info in infos):
            return
        time.sleep(0.2)
    logger.warning("exactly_once: the failed job's tasks still run after %.0f s", timeout)


def last_job(context: Any) -> int:
    """The highest job id of this thread's job group so far (-1: none)."""
    group = context.getLocalProperty("spark.jobGroup.id")
    return max(context.statusTracker().getJobIdsForGroup(group), default=-1)


# ---------------------------------------------------------------------- streaming


class CommitLog:
    """What a streaming query committed, per micro-batch: one JSON file per batch in a
    directory only the driver uses (``<checkpointLocation>/producerkit-exactly-once``, or the
    ``exactly_once_log`` option), each written whole (a temporary file renamed over it).

    A batch's file: ``{"batch": id, "state": "intent" | "partial" | "done", "prepared":
    [[partition, transactional id, producer id, epoch, messages], ...], "committed":
    [partitions]}``. ``intent``: the handles are about to be committed; ``partial``: some
    were refused (``committed`` says which were not); ``done``: all committed. The last
    ``_KEPT_BATCHES`` batches are kept."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def read(self, batch: int) -> dict[str, Any] | None:
        try:
            entry: dict[str, Any] = json.loads((self.directory / f"{batch}.json").read_text())
        except FileNotFoundError:
            return None
        return entry

    def entries(self) -> dict[int, dict[str, Any]]:
        if not self.directory.is_dir():
            return {}
        batches = sorted(
            int(path.stem) for path in self.directory.glob("*.json") if path.stem.isdigit()
        )
        found = {batch: self.read(batch) for batch in batches}
        return {batch: entry for batch, entry in found.items() if entry is not None}

    def write(
        self,
        batch: int,
        state: Literal["intent", "partial", "done"],
        prepared: Sequence[Prepared],
        committed: Iterable[int] = (),
    ) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        entry = {
            "batch": batch,
            "state": state,
            "prepared": [[partition_of(handle), *handle] for handle in prepared],
            "committed": sorted(set(committed)),
        }
        path = self.directory / f"{batch}.json"
        temporary = path.with_name(f".{batch}.json.{os.getpid()}")
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(entry, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        _fsync_directory(self.directory)
        if state == "done":
            self._prune(batch)

    def _prune(self, newest: int) -> None:
        for path in self.directory.glob("*.json"):
            if path.stem.isdigit() and int(path.stem) <= newest - _KEPT_BATCHES:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def handles_of(config: SinkConfig, entry: Mapping[str, Any]) -> list[Prepared]:
    """The handles a log entry recorded."""
    prepared = prepared_of(config)
    return [prepared.handle(item[1:]) for item in entry["prepared"]]


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform opens a directory
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def log_directory(options: Mapping[str, str], given: str | None) -> Path:
    """The commit log's directory: ``exactly_once_log`` as given, else under the query's
    ``checkpointLocation`` option. Local (or mounted) paths only: the driver reads and writes
    it with plain file calls."""
    location = given
    if location is None:
        checkpoint = options.get("checkpointLocation") or options.get("checkpointlocation")
        if checkpoint is None:
            raise ConfigurationError(
                "exactly_once in a streaming query keeps a commit log: give "
                '.option("checkpointLocation", ...) on the writeStream, or '
                '.option("exactly_once_log", "<a directory on the driver>")'
            )
        location = os.path.join(_local_path(str(checkpoint)), "producerkit-exactly-once")
    return Path(_local_path(location))


def _local_path(location: str) -> str:
    if location.startswith("file:"):
        return re.sub(r"^file:(//)?", "", location) or "/"
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", location):
        raise ConfigurationError(
            f"exactly_once keeps its commit log with plain file calls on the driver, not at "
            f"{location!r}: give .option('exactly_once_log', '<a local or mounted directory>')"
        )
    return location


def recover(config: SinkConfig, log: CommitLog) -> Job:
    """What the writer Spark asks for before each micro-batch does first (on the driver, before
    any task of the batch runs): commit what the log holds as an intent (the driver stopped
    between recording and committing), so no replayed task fences a transaction that must be
    committed. Returns the job for the batch's tasks: the batches (and partitions) a replay of
    which writes nothing."""
    skip: dict[int, tuple[int, ...] | None] = {}
    for batch, entry in log.entries().items():
        if entry["state"] == "intent":
            entry = _finish(config, log, batch, handles_of(config, entry), set(entry["committed"]))
        if entry["state"] == "done":
            skip[batch] = None
        else:
            skip[batch] = tuple(entry["committed"])
    return Job(prefix=None, skip=skip)


def _finish(
    config: SinkConfig,
    log: CommitLog,
    batch: int,
    handles: Sequence[Prepared],
    committed: set[int],
) -> dict[str, Any]:
    """Commit the handles of ``batch`` not committed yet and record the outcome (``done``).
    A handle refused for good (fenced: a newer attempt took its id, or the transaction timed
    out) makes the batch ``partial``, its id is initialized again (which aborts what a newer
    attempt left open), and this raises: a replay of the batch writes those partitions again.
    No coordinator answering leaves the batch an intent and raises: the next writer Spark asks
    for (a restart) commits it."""
    pending = [handle for handle in handles if partition_of(handle) not in committed]
    refused = run(_end_each, config, pending, commit=True) if pending else {}
    committed |= {partition_of(handle) for handle in pending} - set(refused)
    unanswered = any(error.kind == "coordinator_unavailable" for error in refused.values())
    state: Literal["intent", "partial", "done"] = (
        "intent" if unanswered else "partial" if refused else "done"
    )
    log.write(batch, state, handles, committed)
    if refused:
        ended = _KEPT_FOR_RESTART
        if not unanswered:
            stale = [h.name for h in pending if partition_of(h) in refused]
            aborted = _abort_uncommitted(config, stale, "their commit failed")
            ended = _ABORTED if aborted else _NOT_ABORTED
        _raise_refused(refused, committed, ended)
    entry = log.read(batch)
    assert entry is not None
    return entry


def commit_batch(
    config: SinkConfig,
    log: CommitLog,
    batch: int,
    handles: Sequence[Prepared],
) -> None:
    """Commit micro-batch ``batch``'s transactions through the log (see the module
    docstring). For a batch the log already holds (a replay): what it recorded is committed
    first; then this replay's transactions are aborted where the batch was done, and
    committed only for the partitions a ``partial`` batch had not committed."""
    entry = log.read(batch)
    if entry is None:
        log.write(batch, "intent", handles)
        _finish(config, log, batch, handles, set())
        return
    recorded, committed = handles_of(config, entry), set(entry["committed"])
    if entry["state"] == "intent":
        entry = _finish(config, log, batch, recorded, committed)
        committed = set(entry["committed"])
    done = entry["state"] == "done"
    again = [h for h in handles if not done and partition_of(h) not in committed]
    duplicates = [h for h in handles if h not in again]
    if duplicates:
        run(_end_each, config, duplicates, commit=False)
    if again:
        kept = [handle for handle in recorded if partition_of(handle) in committed]
        log.write(batch, "intent", [*kept, *again], committed)
        _finish(config, log, batch, [*kept, *again], committed)
