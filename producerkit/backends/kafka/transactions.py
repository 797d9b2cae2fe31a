"""Kafka transactions at the protocol level: the transaction coordinator's side.

A transactional producer is an idempotent one whose producer id belongs to a transactional id:
InitProducerId with that id, sent to its coordinator (FindCoordinator, key type 1), fences every
earlier producer with the same id (it bumps the epoch, and aborts what the earlier one left
open). Its batches are flagged transactional; EndTxn commits or aborts them together, and only
then does a ``read_committed`` consumer see them (or never, once aborted).

Two versions of the protocol, chosen per coordinator by :meth:`Coordinator.transactions_v2`:

- **transactions v1** (every broker before Kafka 4.0, and clusters whose finalized feature
  ``transaction.version`` is below 2): each partition is added (AddPartitionsToTxn) before a
  batch for it is written, with Produce v3-v8; EndTxn (v0) ends the transaction, and the
  producer keeps its epoch from one transaction to the next.
- **transactions v2** (KIP-890 part 2: a cluster that finalized ``transaction.version`` 2 or
  more, and whose coordinator takes Produce v12 and EndTxn v5): no AddPartitionsToTxn; a
  Produce v12 request adds its partitions to the open transaction itself (the partition's
  leader asks the coordinator). EndTxn v5 bumps the epoch at every commit and abort and answers
  with the producer id and epoch of the next transaction (a new producer id, at epoch 0, where
  the epoch would overflow): the producer writes its next transaction with those, its sequences
  numbered from 0. A write still in flight under the old epoch, or sent with it after the
  commit, is refused (INVALID_PRODUCER_EPOCH): it cannot join the next transaction.

:class:`Coordinator` sends those requests, retrying what the protocol says to retry (the
coordinator loading, moving or busy with the previous transaction's end) until a deadline, and
raises :class:`TransactionError` with a ``kind`` for the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Final

from aiokafka import errors as kafka_errors
from aiokafka.protocol.api import Request, RequestStruct, Response, ResponseHeader_v0
from aiokafka.protocol.transaction import AddPartitionsToTxnRequest, EndTxnRequest
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

from producerkit.backends.kafka import _aiokafka_compat, idempotence
from producerkit.backends.kafka import options as kafka_options

logger = logging.getLogger("producerkit.kafka")

#: FindCoordinator's key type of a transactional id.
_TRANSACTION: Final = 1
#: Codes that mean: ask again, after a backoff (the coordinator loading, moving, busy).
_ASK_AGAIN: Final = frozenset({7, 13, 14, 15, 16, 51})
#: Codes that mean the coordinator must be looked up again.
_MOVED: Final = frozenset({15, 16})
#: Codes that mean a newer producer took the transactional id.
_FENCED: Final = frozenset({47, 90})
#: The refusals of an EndTxn for a transaction the coordinator aborted because it outlived its
#: timeout: INVALID_PRODUCER_EPOCH (v1: the abort bumped the epoch), INVALID_TXN_STATE (v2).
_TIMED_OUT: Final = frozenset({47, 48})
#: Names of the codes aiokafka has no class for (its UnknownError would say nothing).
_CODE_NAMES: Final = {
    47: "INVALID_PRODUCER_EPOCH",
    59: "UNKNOWN_PRODUCER_ID",
    90: "PRODUCER_FENCED",
}
#: The producer id and epoch an InitProducerId asking for a transactional id only if it is new
#: gives as its current ones (KIP-360): a coordinator grants an id whose metadata it has just
#: created (no epoch yet) whatever they are, and fences every other request naming a producer
#: id it did not grant (none is this large), in one step under the id's lock.
_NEVER_GRANTED: Final = idempotence.ProducerId(2**63 - 1, 0)
#: The refusals of such a request by a coordinator that knows no producer id it did not grant
#: and so cannot tell a new id from a held one: UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_ID_MAPPING.
_PRODUCER_ID_UNKNOWN: Final = frozenset({59, 49})
#: Codes of a transactional id the broker will not let this producer use.
_REFUSED: Final = frozenset({53, 35})  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED, UNSUPPORTED_VERSION


#: The finalized feature whose level says which transaction protocol the cluster runs.
TRANSACTION_VERSION: Final = "transaction.version"
#: The EndTxn version of transactions v2 (its response carries the next producer id and epoch).
END_TXN_V2: Final = 5
_API_VERSIONS: Final = 18
_PRODUCE: Final = 0
_END_TXN: Final = 26
#: ApiVersions v3's tagged field of the finalized features.
_FINALIZED_FEATURES_TAG: Final = 2
_FINALIZED_FEATURES: Final = CompactArray(
    ("name", CompactString("utf-8")),
    ("max_version_level", Int16),
    ("min_version_level", Int16),
    ("tags", TaggedFields),
)


class _ApiVersionsResponse_v3(Response):  # type: ignore[misc]
    API_KEY = _API_VERSIONS
    API_VERSION = 3
    SCHEMA = Schema(
        ("error_code", Int16),
        (
            "api_versions",
            CompactArray(
                ("api_key", Int16),
                ("min_version", Int16),
                ("max_version", Int16),
                ("tags", TaggedFields),
            ),
        ),
        ("throttle_time_ms", Int32),
        ("tags", TaggedFields),
    )


class _ApiVersionsRequest_v3(RequestStruct):  # type: ignore[misc]
    API_KEY = _API_VERSIONS
    API_VERSION = 3
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = _ApiVersionsResponse_v3
    SCHEMA = Schema(
        ("client_software_name", CompactString("utf-8")),
        ("client_software_version", CompactString("utf-8")),
        ("tags", TaggedFields),
    )

    def parse_response_header(self, read_buffer: Any) -> Any:
        """ApiVersions answers with response header v0 at every version (a client that does not
        know the broker's versions yet must read it)."""
        return ResponseHeader_v0.decode(read_buffer)


class _ApiVersionsRequest(Request[_ApiVersionsRequest_v3]):  # type: ignore[misc]
    """ApiVersions v3, the first with the cluster's finalized features (aiokafka asks v0-v2)."""

    API_KEY: ClassVar[int] = _API_VERSIONS

    def build(self, request_struct_class: type[_ApiVersionsRequest_v3]) -> _ApiVersionsRequest_v3:
        return request_struct_class("producerkit", _SOFTWARE_VERSION, {})


class _EndTxnResponse_v5(Response):  # type: ignore[misc]
    API_KEY = _END_TXN
    API_VERSION = END_TXN_V2
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("tags", TaggedFields),
    )


class _EndTxnRequest_v5(RequestStruct):  # type: ignore[misc]
    API_KEY = _END_TXN
    API_VERSION = END_TXN_V2
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = _EndTxnResponse_v5
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("committed", Boolean),
        ("tags", TaggedFields),
    )


class _EndTxnRequestV2(Request[_EndTxnRequest_v5]):  # type: ignore[misc]
    """EndTxn v5, transactions v2's: its answer carries the producer id and epoch to go on
    with."""

    API_KEY: ClassVar[int] = _END_TXN

    def __init__(self, transactional_id: str, producer: idempotence.ProducerId, commit: bool):
        self._fields: tuple[Any, ...] = (
            transactional_id,
            producer.id,
            producer.epoch,
            commit,
            {},
        )

    def build(self, request_struct_class: type[_EndTxnRequest_v5]) -> _EndTxnRequest_v5:
        return request_struct_class(*self._fields)


_DESCRIBE_TRANSACTIONS: Final = 65


class _DescribeTransactionsResponse_v0(Response):  # type: ignore[misc]
    API_KEY = _DESCRIBE_TRANSACTIONS
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "transaction_states",
            CompactArray(
                ("error_code", Int16),
                ("transactional_id", CompactString("utf-8")),
                ("transaction_state", CompactString("utf-8")),
                ("transaction_timeout_ms", Int32),
                ("transaction_start_time_ms", Int64),
                ("producer_id", Int64),
                ("producer_epoch", Int16),
                (
                    "topics",
                    CompactArray(
                        ("topic", CompactString("utf-8")),
                        ("partitions", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _DescribeTransactionsRequest_v0(RequestStruct):  # type: ignore[misc]
    API_KEY = _DESCRIBE_TRANSACTIONS
    API_VERSION = 0
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = _DescribeTransactionsResponse_v0
    SCHEMA = Schema(
        ("transactional_ids", CompactArray(CompactString("utf-8"))),
        ("tags", TaggedFields),
    )


class _DescribeTransactionsRequest(Request[_DescribeTransactionsRequest_v0]):  # type: ignore[misc]
    """DescribeTransactions v0 (KIP-664): a transactional id's state, producer id and epoch."""

    API_KEY: ClassVar[int] = _DESCRIBE_TRANSACTIONS

    def __init__(self, transactional_id: str):
        self._transactional_id = transactional_id

    def build(
        self, request_struct_class: type[_DescribeTransactionsRequest_v0]
    ) -> _DescribeTransactionsRequest_v0:
        return request_struct_class([self._transactional_id], {})


def _software_version() -> str:
    from producerkit import __version__

    return __version__


_SOFTWARE_VERSION: Final = _software_version()


def speaks_transactions_v2(response: Any) -> bool:
    """Whether an ApiVersions v3+ ``response`` says the cluster runs transactions v2: its
    finalized ``transaction.version`` is 2 or more, and the broker takes Produce v12 and EndTxn
    v5."""
    if response.error_code:
        return False
    versions = {api_key: (low, high) for api_key, low, high, _ in response.api_versions}
    produce = versions.get(_PRODUCE, (0, -1))
    end_txn = versions.get(_END_TXN, (0, -1))
    if not (
        produce[0] <= _aiokafka_compat.IMPLICIT_ADD_VERSION <= produce[1]
        and end_txn[0] <= END_TXN_V2 <= end_txn[1]
    ):
        return False
    raw = response.tags.get(_FINALIZED_FEATURES_TAG)
    if raw is None:
        return False
    features = _FINALIZED_FEATURES.decode(io.BytesIO(raw)) or []
    levels = {name: level for name, level, _, _ in features}
    return int(levels.get(TRANSACTION_VERSION, 0)) >= 2


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


def timed_out(
    transactional_id: str, code: int | None, lasted: float, timeout_ms: int
) -> TransactionError | None:
    """The ``"timed_out"`` error to report where an EndTxn refused with ``code``, for a
    transaction open ``lasted`` seconds, was refused because the coordinator aborted it for
    outliving its ``timeout_ms``; None where the refusal means something else."""
    if code not in _TIMED_OUT or lasted < timeout_ms / 1000:
        return None
    return TransactionError(
        f"transaction of {transactional_id!r} aborted by the coordinator: it was open "
        f"{lasted:.1f}s, past transaction_timeout_ms={timeout_ms} (EndTxn refused: code {code})",
        kind="timed_out",
        code=code,
    )


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
        #: Whether this transactional id speaks transactions v2 (see the module docstring):
        #: learned from its coordinator before its first request, then kept.
        self.v2: bool | None = None

    async def transactions_v2(self) -> bool:
        """Whether the coordinator's cluster runs transactions v2, asked once (ApiVersions v3,
        to the coordinator) and kept: a transactional id does not change protocol midway. A
        broker that does not answer v3 (or answers without the feature) runs v1."""
        if self.v2 is None:
            deadline = self._deadline()
            node = await self._coordinator(deadline)
            try:
                self.v2 = await self._speaks_v2(node, deadline)
            except (kafka_errors.KafkaError, TimeoutError) as exc:  # unreachable: as before
                logger.debug("ApiVersions v3 to %s: %r; transactions v1", node, exc)
                self.v2 = False
        return self.v2

    async def _speaks_v2(self, node: int, deadline: float) -> bool:
        """Ask ``node`` (ApiVersions v3) whether the cluster runs transactions v2. Raises the
        client's NodeNotReadyError (or TimeoutError) where the node cannot be reached or does
        not answer in time: it is asked again later. Any other failure (a broker without v3
        may refuse it, or drop the connection) means v1."""
        try:
            response = await asyncio.wait_for(
                self._client.send(node, _ApiVersionsRequest()), max(deadline - _now(), 0.001)
            )
        except (kafka_errors.NodeNotReadyError, TimeoutError):
            raise
        except Exception as exc:  # no v3: the protocol every broker speaks
            logger.debug("ApiVersions v3 to %s: %r; transactions v1", node, exc)
            return False
        return speaks_transactions_v2(response)

    async def init_producer_id(
        self, *, current: idempotence.ProducerId | None = None, only_if_new: bool = False
    ) -> idempotence.ProducerId:
        """The transactional id's producer id, with a new epoch: every earlier producer of it
        is fenced, and what it left open is aborted. ``current``: this producer's id and epoch
        (KIP-588), refused ``"fenced"`` where another producer took the id since; a
        transactions-v2 coordinator that aborted the producer's transaction for its timeout
        answers with the epoch it bumped (only there can the coordinator tell: see
        ``KafkaConnection.begin_transaction``). ``only_if_new``: only if
        no producer ever initialized the id (else ``"fenced"``, and nothing of the id's holder
        is touched); a coordinator that does not tell (it knows no producer id it did not
        grant: librdkafka's mock) grants the id as without. A coordinator that cannot be
        reached, or answers busy or moved, is looked up and asked again until the timeout:
        then ``"coordinator_unavailable"``."""
        deadline = self._deadline()
        if only_if_new:
            current = _NEVER_GRANTED
        while True:
            node = await self._coordinator(deadline)
            try:
                if self.v2 is None:  # learned from the coordinator before its first request
                    self.v2 = await self._speaks_v2(node, deadline)
                return await idempotence.request_producer_id(
                    self._client,
                    deadline=deadline,
                    transactional_id=self.transactional_id,
                    transaction_timeout_ms=self.transaction_timeout_ms,
                    current=current,
                    node_id=functools.partial(int, node),
                    retry_backoff=self._retry_backoff,
                )
            except (kafka_errors.KafkaError, TimeoutError) as exc:
                code = getattr(exc, "errno", None)
                if code in _MOVED or _unanswered(exc):
                    self._node = None
                    await self._backoff(deadline, exc)
                    continue
                if only_if_new and code in _FENCED:
                    raise TransactionError(
                        f"InitProducerId: the transactional id {self.transactional_id!r} was "
                        "initialized before (it was asked for as new): a newer producer holds "
                        "it, or held it",
                        "fenced",
                        code,
                    ) from exc
                if only_if_new and code in _PRODUCER_ID_UNKNOWN:
                    logger.debug(
                        "the coordinator of %r does not take a new-only InitProducerId (%s): "
                        "asked without the condition",
                        self.transactional_id,
                        type(exc).__name__,
                    )
                    current = None
                    continue
                raise self._error(exc, code, "InitProducerId") from exc

    async def init_producer_id_after_timeout(
        self, current: idempotence.ProducerId
    ) -> idempotence.ProducerId:
        """:meth:`init_producer_id` naming ``current`` (KIP-588), for a producer whose
        transaction a transactions-v2 coordinator aborted for its timeout (bumping its epoch by
        one): only if the coordinator still holds the id that way, nobody else having taken it
        since. Else ``"fenced"`` without asking: a coordinator aborts the ongoing transaction of
        whoever holds the id for an InitProducerId naming its producer id, whatever the epoch,
        and so would abort a newer producer's open batch. (A newer producer taking the id
        between the look and the request is not excluded.)"""
        holder = await self.holder()
        if holder is not None:
            state, held = holder
            if state != "CompleteAbort" or held != (current.id, current.epoch + 1):
                raise TransactionError(
                    f"fenced: another producer took the transactional id "
                    f"{self.transactional_id!r} after its coordinator aborted this producer's "
                    f"transaction for its timeout (the id is {state} at producer id {held.id}, "
                    f"epoch {held.epoch}; this producer had {current.id}, {current.epoch})",
                    "fenced",
                )
        return await self.init_producer_id(current=current)

    async def holder(self) -> tuple[str, idempotence.ProducerId] | None:
        """The transactional id's state as its coordinator has it (``"Ongoing"``,
        ``"CompleteAbort"``...) and the producer id and epoch that hold it; None where the
        coordinator does not say (it does not know the id, or this request)."""
        try:
            response = await self._ask(
                _DescribeTransactionsRequest(self.transactional_id),
                lambda response: [state[0] for state in response.transaction_states if state[0]],
                "DescribeTransactions",
            )
        except TransactionError as exc:
            if exc.kind == "coordinator_unavailable":
                raise
            logger.debug("DescribeTransactions of %r: %s", self.transactional_id, exc)
            return None
        for _, _, state, _, _, producer_id, epoch, _, _ in response.transaction_states:
            return state, idempotence.ProducerId(producer_id, epoch)
        return None

    async def add_partitions(
        self, producer: idempotence.ProducerId, topic: str, partitions: list[int]
    ) -> None:
        """Add ``topic``'s ``partitions`` to the open transaction (before anything is written
        to them in it): transactions v1 only (with v2, a Produce v12 adds them)."""
        request = AddPartitionsToTxnRequest(
            self.transactional_id, producer.id, producer.epoch, [(topic, partitions)]
        )

        def codes(response: Any) -> list[int]:
            return [code for _, errors in response.errors for _, code in errors if code]

        await self._ask(request, codes, "AddPartitionsToTxn")

    async def end(
        self, producer: idempotence.ProducerId, *, commit: bool
    ) -> idempotence.ProducerId | None:
        """Commit (or abort) the open transaction. With transactions v2, the producer id and
        epoch its next transaction must be written with (the epoch bumped, or a new id at
        epoch 0 where it would overflow); None with v1, where they stay as they are."""
        request: Any
        if await self.transactions_v2():
            request = _EndTxnRequestV2(self.transactional_id, producer, commit)
        else:
            request = EndTxnRequest(self.transactional_id, producer.id, producer.epoch, commit)
        response = await self._ask(
            request, lambda response: [response.error_code] if response.error_code else [], "EndTxn"
        )
        if getattr(response, "API_VERSION", 0) >= END_TXN_V2 and response.producer_id >= 0:
            return idempotence.ProducerId(response.producer_id, response.producer_epoch)
        return None

    async def _ask(self, request: Any, codes: Any, name: str) -> Any:
        """The coordinator's answer to ``request`` without an error code (``codes(answer)``),
        asked again while the codes say so."""
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
                return response
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


def _unanswered(exc: BaseException) -> bool:
    """Whether ``exc`` says the coordinator did not answer (unreachable, timed out, loading,
    busy): the request is asked again until the deadline, not refused."""
    if isinstance(exc, (TimeoutError, kafka_errors.KafkaTimeoutError)):
        return True
    code = getattr(exc, "errno", None)
    return bool(getattr(exc, "retriable", False)) or code in _ASK_AGAIN


async def end_prepared(
    url: str,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    *,
    commit: bool,
    began_at: float | None = None,
    prepared_timeout_ms: int | None = None,
    timeout: float = 30.0,
    **options: Any,
) -> None:
    """Commit (or abort) a transaction another producer prepared and left open, by its
    transactional id, producer id and epoch: the second phase of a two-phase commit. Raises
    TransactionError: ``kind="timed_out"`` where the coordinator refused the end of a
    transaction open (since ``began_at``, a ``time.time()``) longer than the
    ``prepared_timeout_ms`` it was written with, as it refuses one it aborted for that;
    ``"fenced"`` where a newer producer of the id aborted it meanwhile."""
    async with _client_of(url, timeout, options) as client:
        coordinator = _coordinator_of(client, transactional_id, timeout, options)
        try:
            await coordinator.end(idempotence.ProducerId(producer_id, epoch), commit=commit)
        except TransactionError as refused:
            if began_at is None or prepared_timeout_ms is None:
                raise
            lasted = time.time() - began_at
            error = timed_out(transactional_id, refused.code, lasted, prepared_timeout_ms)
            if error is None:
                raise
            raise error from refused


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
    try:
        await producer.start()
    except (kafka_errors.KafkaError, OSError) as exc:
        with contextlib.suppress(Exception):
            await producer.stop()
        raise TransactionError(
            f"no transaction coordinator answered: the cluster at {url} could not be reached "
            f"within {timeout}s ({type(exc).__name__}: {exc})",
            "coordinator_unavailable",
        ) from exc
    try:
        yield producer.client
    finally:
        await producer.stop()
