"""Kafka transactions left open by one process and ended by another (the second phase of a
two-phase commit): the handle a prepared atomic batch returns, and the ``prepared`` ends of
Kafka's atomic writes, by transactional id, producer id and epoch, through a transaction
coordinator (``transactions.end_prepared``, ``transactions.abort_open``)."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Final, NamedTuple, TypeVar

from producerkit.backends.base import PreparedBatches
from producerkit.backends.kafka.options import transaction_refusal
from producerkit.errors import AtomicBatchError, ConfigurationError

__all__ = ["PREPARED", "PreparedTransaction"]

_T = TypeVar("_T")

#: The option that names a producer's transactions.
_NAME_OPTION: Final = "transactional_id"
_TIMEOUT_OPTION: Final = "transaction_timeout_ms"


class PreparedTransaction(NamedTuple):
    """A Kafka transaction written whole and left open for another process to end
    (``producerkit.transactions.commit_prepared`` or ``abort_prepared``): the first phase of a
    two-phase commit. ``messages``: how many it holds; ``began_at``: when it began
    (``time.time()`` of the writer's machine) and ``transaction_timeout_ms``: how long the
    coordinator lets it stay open, so that its end can say it outlived that (None in handles
    made before they were kept)."""

    transactional_id: str
    producer_id: int
    epoch: int
    messages: int
    began_at: float | None = None
    transaction_timeout_ms: int | None = None

    @property
    def name(self) -> str:
        """The transactional id (what a prepared batch's coordinator calls it)."""
        return self.transactional_id


class _KafkaPrepared(PreparedBatches):
    name_option = _NAME_OPTION
    timeout_option = _TIMEOUT_OPTION

    def refusal(self, options: Mapping[str, Any]) -> str | None:
        return transaction_refusal(options)

    def options(
        self, timeout: float, name: str | None = None, fresh: bool = False
    ) -> dict[str, Any]:
        options: dict[str, Any] = {_TIMEOUT_OPTION: int(timeout * 1000)}
        if name is not None:
            options[_NAME_OPTION] = name
            options["fresh_transactional_id"] = fresh
        return options

    def timeout(self, options: Mapping[str, Any]) -> float | None:
        given = options.get(_TIMEOUT_OPTION)
        return None if given is None else int(given) / 1000

    def handle(self, values: Sequence[Any]) -> PreparedTransaction:
        return PreparedTransaction(*values)

    async def end(
        self,
        url: str,
        prepared: Any,
        *,
        commit: bool,
        timeout: float,
        options: Mapping[str, Any],
    ) -> None:
        from producerkit.backends.kafka import transactions

        handle = PreparedTransaction(*prepared)
        await _typed(
            transactions.end_prepared(
                url,
                *handle[:3],
                commit=commit,
                began_at=handle.began_at,
                prepared_timeout_ms=handle.transaction_timeout_ms,
                timeout=timeout,
                **_checked(options),
            )
        )

    async def abort_open(
        self, url: str, names: Sequence[str], *, timeout: float, options: Mapping[str, Any]
    ) -> None:
        from producerkit.backends.kafka import transactions

        await _typed(
            transactions.abort_open(url, list(names), timeout=timeout, **_checked(options))
        )


#: Kafka's prepared batches (``KafkaAtomicWrites.prepared``).
PREPARED: Final = _KafkaPrepared()


def _checked(options: Mapping[str, Any]) -> dict[str, Any]:
    if _NAME_OPTION in options:
        raise ConfigurationError(
            "the transactional id is the prepared transaction's own (its handle names it): "
            "drop transactional_id from the options"
        )
    return dict(options)


async def _typed(step: Awaitable[_T]) -> _T:
    from producerkit.backends.kafka.transactions import TransactionError

    try:
        return await step
    except TransactionError as exc:
        raise AtomicBatchError(str(exc), kind=exc.kind, code=exc.code) from exc
