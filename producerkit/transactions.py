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
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from producerkit.backends.kafka.atomic import PreparedTransaction
from producerkit.errors import AtomicBatchError, ConfigurationError

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
    from producerkit.backends.kafka import transactions

    _check(options)
    await _typed(
        transactions.end_prepared(
            url,
            *prepared[:3],
            commit=commit,
            began_at=prepared.began_at,
            prepared_timeout_ms=prepared.transaction_timeout_ms,
            timeout=timeout,
            **options,
        )
    )


async def abort_open(
    url: str, transactional_ids: list[str], *, timeout: float = 30.0, **options: Any
) -> None:
    """Abort whatever each of ``transactional_ids`` has open (its producer id initialized
    again, which fences its producers too; a committed transaction stays committed). Raises
    AtomicBatchError, ConfigurationError."""
    from producerkit.backends.kafka import transactions

    _check(options)
    await _typed(transactions.abort_open(url, transactional_ids, timeout=timeout, **options))


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


def _check(options: dict[str, Any]) -> None:
    if "transactional_id" in options:
        raise ConfigurationError(
            "the transactional id is the prepared transaction's own (its handle names it): "
            "drop transactional_id from the options"
        )


async def _typed(step: Awaitable[_T]) -> _T:
    from producerkit.backends.kafka.transactions import TransactionError

    try:
        return await step
    except TransactionError as exc:
        raise AtomicBatchError(str(exc), kind=exc.kind, code=exc.code) from exc
