"""Kafka transactions prepared in one process and ended in another: the second phase of a
two-phase commit.

A writer (a Spark task, say) writes its messages in a transaction it does not commit::

    async with producer.atomic_batch(prepare=True) as batch:
        for row in rows:
            await batch.produce(row)
    handle = batch.prepared          # a PreparedTransaction: send it to the coordinator

and the coordinator (the job's driver), once every writer succeeded, commits them all, or
aborts them if the job failed::

    await producerkit.transactions.commit_prepared(url, handle)
    await producerkit.transactions.abort_open(url, ["job-7-0", "job-7-1"])   # whatever is open

A transaction left open longer than its ``transaction_timeout_ms`` is aborted by the broker, so
the writers' timeout must cover the whole job. Every failure is an
:class:`~producerkit.AtomicBatchError` with its ``kind`` (``"fenced"``: a newer producer of the
transactional id aborted it meanwhile).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

from producerkit._transaction import PreparedTransaction
from producerkit.errors import AtomicBatchError

__all__ = ["PreparedTransaction", "abort_open", "abort_prepared", "commit_prepared"]

_T = TypeVar("_T")


async def commit_prepared(
    url: str, prepared: PreparedTransaction, *, timeout: float = 30.0, **options: Any
) -> None:
    """Commit ``prepared`` (``kafka://`` ``url``; ``options`` as the producer's, security
    included). Raises AtomicBatchError."""
    from producerkit.backends.kafka import transactions

    await _typed(
        transactions.end_prepared(url, *prepared[:3], commit=True, timeout=timeout, **options)
    )


async def abort_prepared(
    url: str, prepared: PreparedTransaction, *, timeout: float = 30.0, **options: Any
) -> None:
    """Abort ``prepared``. Raises AtomicBatchError."""
    from producerkit.backends.kafka import transactions

    await _typed(
        transactions.end_prepared(url, *prepared[:3], commit=False, timeout=timeout, **options)
    )


async def abort_open(
    url: str, transactional_ids: list[str], *, timeout: float = 30.0, **options: Any
) -> None:
    """Abort whatever each of ``transactional_ids`` has open (its producer id initialized
    again, which fences its producers too). Raises AtomicBatchError."""
    from producerkit.backends.kafka import transactions

    await _typed(transactions.abort_open(url, transactional_ids, timeout=timeout, **options))


async def _typed(step: Awaitable[_T]) -> _T:
    from producerkit.backends.kafka.transactions import TransactionError

    try:
        return await step
    except TransactionError as exc:
        raise AtomicBatchError(str(exc), kind=exc.kind, code=exc.code) from exc
