"""Kafka transactions at the protocol level: the transaction coordinator's side.

A transactional producer is an idempotent one whose producer id belongs to a transactional id:
InitProducerId with that id, sent to its coordinator (FindCoordinator, key type 1), fences every
earlier producer with the same id (it bumps the epoch, and aborts what the earlier one left
open). In a transaction, each partition is added (AddPartitionsToTxn) before a batch for it is
written; the batches are flagged transactional; EndTxn commits or aborts them together, and
only then does a ``read_committed`` consumer see them (or never, once aborted).

:class:`Coordinator` sends those requests, retrying what the protocol says to retry (the
coordinator loading, moving or busy with the previous transaction's end) until a deadline, and
raises :class:`TransactionError` with a ``kind`` for the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any, Final

from aiokafka import errors as kafka_errors
from aiokafka.protocol.transaction import AddPartitionsToTxnRequest, EndTxnRequest

from producerkit.backends.kafka import idempotence
from producerkit.backends.kafka import options as kafka_options

#: FindCoordinator's key type of a transactional id.
_TRANSACTION: Final = 1
#: Codes that mean: ask again, after a backoff (the coordinator loading, moving, busy).
_ASK_AGAIN: Final = frozenset({7, 13, 14, 15, 16, 51})
#: Codes that mean the coordinator must be looked up again.
_MOVED: Final = frozenset({15, 16})
#: Codes that mean a newer producer took the transactional id.
_FENCED: Final = frozenset({47, 90})
#: Names of the codes aiokafka has no class for (its UnknownError would say nothing).
_CODE_NAMES: Final = {
    47: "INVALID_PRODUCER_EPOCH",
    59: "UNKNOWN_PRODUCER_ID",
    90: "PRODUCER_FENCED",
}
#: Codes of a transactional id the broker will not let this producer use.
_REFUSED: Final = frozenset({53, 35})  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED, UNSUPPORTED_VERSION


class TransactionError(Exception):
    """A transaction request that did not succeed. ``kind``: ``"fenced"`` (a newer producer
    has the transactional id), ``"coordinator_unavailable"`` (no coordinator answered in
    time), ``"timed_out"`` (the coordinator ended the transaction: it outlived
    ``transaction_timeout_ms``), ``"unsupported"`` (the broker does not do transactions, or
    not for this id), ``"refused"`` (any other error code, in ``code``)."""

    def __init__(self, message: str, kind: str, code: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code


class Coordinator:
    """The requests of one transactional id to its coordinator, through aiokafka's client."""

    def __init__(
        self,
        client: Any,
        transactional_id: str,
        *,
        transaction_timeout_ms: int,
        timeout: float,
        retry_backoff: float,
    ) -> None:
        self._client = client
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self._timeout = timeout
        self._retry_backoff = retry_backoff
        self._node: int | None = None

    async def init_producer_id(self) -> idempotence.ProducerId:
        """The transactional id's producer id, with a new epoch: every earlier producer of it
        is fenced, and what it left open is aborted."""
        deadline = self._deadline()
        while True:
            node = await self._coordinator(deadline)
            try:
                return await idempotence.request_producer_id(
                    self._client,
                    deadline=deadline,
                    transactional_id=self.transactional_id,
                    transaction_timeout_ms=self.transaction_timeout_ms,
                    node_id=functools.partial(int, node),
                    retry_backoff=self._retry_backoff,
                )
            except kafka_errors.KafkaError as exc:
                code = getattr(exc, "errno", None)
                if code in _MOVED:
                    self._node = None
                    await self._backoff(deadline, exc)
                    continue
                raise self._error(exc, code, "InitProducerId") from exc

    async def add_partitions(
        self, producer: idempotence.ProducerId, topic: str, partitions: list[int]
    ) -> None:
        """Add ``topic``'s ``partitions`` to the open transaction (before anything is written
        to them in it)."""
        request = AddPartitionsToTxnRequest(
            self.transactional_id, producer.id, producer.epoch, [(topic, partitions)]
        )

        def codes(response: Any) -> list[int]:
            return [code for _, errors in response.errors for _, code in errors if code]

        await self._ask(request, codes, "AddPartitionsToTxn")

    async def end(self, producer: idempotence.ProducerId, *, commit: bool) -> None:
        """Commit (or abort) the open transaction."""
        request = EndTxnRequest(self.transactional_id, producer.id, producer.epoch, commit)
        await self._ask(
            request, lambda response: [response.error_code] if response.error_code else [], "EndTxn"
        )

    async def _ask(self, request: Any, codes: Any, name: str) -> None:
        deadline = self._deadline()
        while True:
            node = await self._coordinator(deadline)
            try:
                response = await asyncio.wait_for(
                    self._client.send(node, request), max(deadline - _now(), 0.001)
                )
            except (kafka_errors.KafkaError, TimeoutError) as exc:
                if isinstance(exc, kafka_errors.KafkaError) and not exc.retriable:
                    raise self._error(exc, getattr(exc, "errno", None), name) from exc
                self._node = None
                await self._backoff(deadline, exc)
                continue
            errors = codes(response)
            if not errors:
                return
            code = errors[0]
            if code in _ASK_AGAIN:
                if code in _MOVED:
                    self._node = None
                await self._backoff(deadline, kafka_errors.for_code(code)())
                continue
            raise self._error(kafka_errors.for_code(code)(), code, name)

    async def _coordinator(self, deadline: float) -> int:
        while self._node is None:
            try:
                self._node = await asyncio.wait_for(
                    self._client.coordinator_lookup(_TRANSACTION, self.transactional_id),
                    max(deadline - _now(), 0.001),
                )
            except (kafka_errors.KafkaError, TimeoutError) as exc:
                code = getattr(exc, "errno", None)
                if code in _REFUSED or isinstance(exc, kafka_errors.UnsupportedVersionError):
                    raise self._error(exc, code, "FindCoordinator") from exc
                await self._backoff(deadline, exc)
        return self._node

    async def _backoff(self, deadline: float, cause: BaseException) -> None:
        if _now() + self._retry_backoff >= deadline:
            raise TransactionError(
                f"no transaction coordinator for {self.transactional_id!r} answered within "
                f"{self._timeout}s (last: {type(cause).__name__}: {cause})",
                "coordinator_unavailable",
                getattr(cause, "errno", None),
            ) from cause
        await asyncio.sleep(self._retry_backoff)

    def _error(self, exc: BaseException, code: int | None, request: str) -> TransactionError:
        name = _CODE_NAMES.get(code or 0) or type(exc).__name__
        if code in _FENCED:
            return TransactionError(
                f"{request}: fenced ({name}): a newer producer took the transactional id "
                f"{self.transactional_id!r}, or the coordinator ended this transaction (it "
                f"outlived transaction_timeout_ms={self.transaction_timeout_ms})",
                "fenced",
                code,
            )
        if code in _REFUSED or isinstance(exc, kafka_errors.UnsupportedVersionError):
            return TransactionError(
                f"{request}: the broker does not do transactions for {self.transactional_id!r} "
                f"({name})",
                "unsupported",
                code,
            )
        return TransactionError(f"{request} refused: {name}: {exc}", "refused", code)

    def _deadline(self) -> float:
        return _now() + self._timeout


def _now() -> float:
    return asyncio.get_running_loop().time()


async def end_prepared(
    url: str,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    *,
    commit: bool,
    timeout: float = 30.0,
    **options: Any,
) -> None:
    """Commit (or abort) a transaction another producer prepared and left open, by its
    transactional id, producer id and epoch: the second phase of a two-phase commit. Raises
    TransactionError (``kind="fenced"`` if a newer producer of the id aborted it meanwhile)."""
    async with _client_of(url, timeout, options) as client:
        coordinator = _coordinator_of(client, transactional_id, timeout, options)
        await coordinator.end(idempotence.ProducerId(producer_id, epoch), commit=commit)


async def abort_open(
    url: str, transactional_ids: list[str], *, timeout: float = 30.0, **options: Any
) -> None:
    """Abort whatever each of ``transactional_ids`` has open, by initializing its producer id
    (which fences its producers too): what a failed job does for the transactions it cannot
    end one by one."""
    async with _client_of(url, timeout, options) as client:
        for transactional_id in transactional_ids:
            coordinator = _coordinator_of(client, transactional_id, timeout, options)
            await coordinator.init_producer_id()


def _coordinator_of(
    client: Any, transactional_id: str, timeout: float, options: dict[str, Any]
) -> Coordinator:
    return Coordinator(
        client,
        transactional_id,
        transaction_timeout_ms=options.get(
            "transaction_timeout_ms", kafka_options.DEFAULT_TRANSACTION_TIMEOUT_MS
        ),
        timeout=timeout,
        retry_backoff=options.get("retry_backoff_ms", 100) / 1000,
    )


@contextlib.asynccontextmanager
async def _client_of(url: str, timeout: float, options: dict[str, Any]) -> AsyncIterator[Any]:
    """aiokafka's client for ``url`` with the checked ``options`` (security included), no
    producer id asked for."""
    from aiokafka import AIOKafkaProducer

    from producerkit._urls import parse_url

    parsed = parse_url(url)
    checked = kafka_options.check_options({**parsed.options, **options})
    producer = AIOKafkaProducer(
        bootstrap_servers=parsed.server_strings(),
        **kafka_options.client_settings(checked, timeout),
    )
    await producer.start()
    try:
        yield producer.client
    finally:
        await producer.stop()
