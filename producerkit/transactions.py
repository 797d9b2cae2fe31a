"""Kafka transactions prepared in one process and ended in another: the second phase of a
two-phase commit (docs/atomic.md, "Two-phase commit").

A writer (a Spark task, say) writes its messages in a transaction it does not commit::

    async with producer.atomic_batch(prepare=True) as batch:
        for row in rows:
            await batch.produce(row)
    handle = batch.prepared          # a PreparedTransaction: send it to the coordinator

and the coordinator (the job's driver), once every writer succeeded, commits them all, or
aborts them if the job failed::

    await producerkit.transactions.commit_prepared(url, handle)
    await producerkit.transactions.abort_open(url, ["job-7-0", "job-7-1"])   # whatever is open

From blocking code, :func:`commit_prepared_sync`, :func:`abort_prepared_sync` and
:func:`abort_open_sync` do the same: each runs its step on an event loop of its own, in a thread
of its own, so it works whether or not the calling thread runs a loop (a notebook).

A transaction left open longer than its ``transaction_timeout_ms`` is aborted by the broker, so
the writers' timeout must cover the whole job. Every failure is an
:class:`~producerkit.AtomicBatchError` with its ``kind`` (``"fenced"``: a newer producer of the
transactional id aborted it meanwhile; ``"timed_out"``: it was open longer than its
``transaction_timeout_ms`` and the broker aborted it; ``"coordinator_unavailable"``: no
coordinator answered within ``timeout``). ``options`` are the producer's backend options
(security, ...): the transactional id is the handle's, so ``transactional_id`` is refused
(ConfigurationError).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from producerkit._urls import parse_url
from producerkit.backends import spec_for
from producerkit.backends.kafka.prepared import PreparedTransaction
from producerkit.errors import ConfigurationError

if TYPE_CHECKING:
    from producerkit.backends.base import PreparedBatches

__all__ = [
    "PreparedTransaction",
    "abort_open",
    "abort_open_sync",
    "abort_prepared",
    "abort_prepared_sync",
    "commit_prepared",
    "commit_prepared_sync",
]

_T = TypeVar("_T")


async def commit_prepared(
    url: str, prepared: PreparedTransaction, *, timeout: float = 30.0, **options: Any
) -> None:
    """Commit ``prepared`` (``kafka://`` ``url``; ``options`` as the producer's, security
    included). Raises AtomicBatchError (the transaction is not committed), ConfigurationError
    for an option it does not take."""
    await _end_prepared(url, prepared, commit=True, timeout=timeout, options=options)


async def abort_prepared(
    url: str, prepared: PreparedTransaction, *, timeout: float = 30.0, **options: Any
) -> None:
    """Abort ``prepared``. Raises AtomicBatchError, ConfigurationError."""
    await _end_prepared(url, prepared, commit=False, timeout=timeout, options=options)


async def _end_prepared(
    url: str,
    prepared: PreparedTransaction,
    *,
    commit: bool,
    timeout: float,
    options: dict[str, Any],
) -> None:
    await _prepared_of(url).end(url, prepared, commit=commit, timeout=timeout, options=options)


async def abort_open(
    url: str, transactional_ids: list[str], *, timeout: float = 30.0, **options: Any
) -> None:
    """Abort whatever each of ``transactional_ids`` has open (its producer id initialized
    again, which fences its producers too; a committed transaction stays committed). Raises
    AtomicBatchError, ConfigurationError."""
    await _prepared_of(url).abort_open(url, transactional_ids, timeout=timeout, options=options)


def commit_prepared_sync(
    url: str, prepared: PreparedTransaction, *, timeout: float = 30.0, **options: Any
) -> None:
    """:func:`commit_prepared`, blocking the calling thread until it is done."""
    run_blocking(commit_prepared, url, prepared, timeout=timeout, **options)


def abort_prepared_sync(
    url: str, prepared: PreparedTransaction, *, timeout: float = 30.0, **options: Any
) -> None:
    """:func:`abort_prepared`, blocking the calling thread until it is done."""
    run_blocking(abort_prepared, url, prepared, timeout=timeout, **options)


def abort_open_sync(
    url: str, transactional_ids: list[str], *, timeout: float = 30.0, **options: Any
) -> None:
    """:func:`abort_open`, blocking the calling thread until it is done."""
    run_blocking(abort_open, url, transactional_ids, timeout=timeout, **options)


def run_blocking(function: Callable[..., Coroutine[Any, Any, _T]], *args: Any, **kwargs: Any) -> _T:
    """``function(*args, **kwargs)`` on an event loop of its own, in a thread of its own (the
    calling thread may run a loop already: a notebook, a Spark driver's); its result, or what
    it raised."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="producerkit-txn") as pool:
        return pool.submit(lambda: asyncio.run(function(*args, **kwargs))).result()


def _prepared_of(url: str) -> PreparedBatches:
    """The prepared batches of ``url``'s backend; ConfigurationError where it has none."""
    spec = spec_for(parse_url(url).scheme)
    if spec.prepared is None:
        raise ConfigurationError(f"no prepared transactions to end: {spec.prepare_refusal}")
    return spec.prepared
