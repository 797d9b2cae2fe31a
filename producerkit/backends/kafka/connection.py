"""One Kafka connection: an aiokafka client, an accumulator of batches and a sender."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors

from producerkit._record import Record
from producerkit.backends import _clients
from producerkit.backends.base import Connection
from producerkit.backends.kafka import (
    _aiokafka_compat,
    idempotence,
    options,
    record_batch,
    transactions,
    wire,
)
from producerkit.backends.kafka.accumulator import (
    Accumulator,
    Gathering,
    PartitionQueue,
    partition_runs,
)
from producerkit.backends.kafka.errors import translate
from producerkit.backends.kafka.sender import Sender
from producerkit.errors import (
    AtomicBatchError,
    AuthenticationError,
    BrokerUnavailable,
    ConfigurationError,
    TLSError,
)

logger = logging.getLogger("producerkit.kafka")

_T = TypeVar("_T")


def _acks_number(acks: int | str) -> int:
    return -1 if acks == "all" else int(acks)


class KafkaConnection(Connection):
    """A connection to a Kafka cluster through aiokafka (see the package docstring).

    ``idempotent`` says, once connected, whether the broker granted the producer an id (see
    ``options.idempotence_wanted``), and ``idempotence_reason`` why or why not.
    """

    def setup(self) -> None:
        _clients.check_client("aiokafka")
        self._settings = settings = options.client_settings(self.options, self.timeout)
        self.max_message_size = settings.get("max_request_size", 1024 * 1024)
        self._producer = AIOKafkaProducer(bootstrap_servers=self.url.server_strings(), **settings)
        self._acks: int = _acks_number(settings["acks"])
        self._coordinator: transactions.Coordinator | None = None
        self._transactions_over: AtomicBatchError | None = None
        self._restart_transactions = False
        #: Initialize the id again naming this producer's id and epoch (KIP-588), not as a new
        #: producer does: after a transactions-v2 batch the broker aborted for its timeout.
        self._restart_naming_current = False
        #: When the open transaction began (the loop's clock), to tell its timeout at its end.
        self._transaction_began = 0.0
        self._partition_counts: dict[str, int] = {}
        codec = settings.get("compression_type")
        self._compressed_encoder = (
            record_batch.CompressedEncoder(codec, self.options.get("compression_level"))
            if codec
            else None
        )
        encode: record_batch.Encoder = self._compressed_encoder or record_batch.encode_batch
        self._queues: dict[str, dict[int, PartitionQueue]] = {}
        self._gathering = gathering = Gathering()
        self._accumulator = Accumulator(
            queues=self._queues,
            encode=encode,
            max_batch_size=settings["max_batch_size"],
            request_timeout=settings["request_timeout_ms"] / 1000,
            timeout=self.timeout,
            gathering=gathering,
            fail=self._fail,
            reports=self.reports,
        )
        self._sender = Sender(
            self._producer,
            self._accumulator,
            self.reports,
            linger=settings["linger_ms"] / 1000,
            acks=self._acks,
            max_batches_in_flight=options.batches_in_flight(self.options, idempotent=False),
            retry_backoff=settings.get("retry_backoff_ms", 100) / 1000,
        )
        self._accumulator.batch_ready = self._sender.schedule_ship
        self._lingers = self._sender.linger > 0
        self._append = wire.ACTIVE.Appender(
            self._queues, self._accumulator.queue_of, gathering, self._sender, self._batch_full,
            time.monotonic, PartitionQueue,
        )  # fmt: skip

    async def connect(self) -> None:
        settings = self._settings
        try:
            if "ssl_context" in settings:
                self.awaiting = "a TLS handshake"
                await _probe_tls(self.url.servers[0], settings["ssl_context"], self.timeout)
            self.awaiting = "the cluster's metadata (bootstrap)"
            await self._producer.start()
            self.awaiting = "a connection to a broker (probing the client)"
            self.client_path, self.client_path_reason = await _aiokafka_compat.choose_path(
                self._producer, self._acks
            )
            self.awaiting = "a producer id (InitProducerId)"
            producer_id = await self._grant_idempotence()
            self.awaiting = ""
        except BaseException as exc:
            await self._producer.stop()
            if isinstance(exc, KeyError) and "sasl_mechanism" in settings:
                # aiokafka's SCRAM reads the server's final message without checking for an
                # error ("e=unknown-user"), so a refused login surfaces as KeyError('v').
                raise AuthenticationError(
                    f"{settings['sasl_mechanism']} authentication failed for user "
                    f"{settings['sasl_plain_username']!r} (unknown user or wrong password)"
                ) from exc
            if isinstance(exc, kafka_errors.KafkaConnectionError):
                # aiokafka's "Unable to bootstrap" names no cause (it only logs it): find it.
                causes = await _why_unreachable(self.url.servers, self.timeout)
                raise BrokerUnavailable(
                    f"cannot reach a Kafka bootstrap server: {causes}"
                    if causes
                    else translate(exc).args[0]
                ) from exc
            if isinstance(exc, Exception):
                raise translate(exc) from exc
            raise
        fast = self.client_path == _clients.FAST
        sender = self._sender
        sender.max_batches_in_flight = options.batches_in_flight(
            self.options, idempotent=bool(self.idempotent)
        )
        if not fast:
            self._accumulator.new_builder = self._producer.create_batch
        if not fast:
            # aiokafka sends one batch per partition at a time and keeps one more in its
            # accumulator; a third waits in send_batch(), whose wait loop subtracts the whole
            # time waited on every wake-up and so times out long before request_timeout_ms.
            sender.max_batches_in_flight = min(sender.max_batches_in_flight, 2)
        else:
            sender.wire = _aiokafka_compat.ProduceWire(
                self._producer,
                self._acks,
                settings["request_timeout_ms"],
                settings.get("client_id") or "producerkit",
            )
            sender.producer_id = producer_id
            if producer_id is not None and self._compressed_encoder is None:
                # every batch is stamped before it is sent, and the stamp makes its CRC
                self._accumulator.encode = record_batch.unchecked(record_batch.encode_batch)
            if self._coordinator is None:
                sender.renew_producer_id = self._renew_producer_id
            else:
                sender.transactional = True
                sender.wire.transactional(
                    self._coordinator.transactional_id,
                    implicit_add=bool(self._coordinator.v2),
                )
        self._producer.client.cluster.add_listener(self._metadata_updated)

    # ------------------------------------------------------------------ transactions

    async def _init_transactions(self, transactional_id: str) -> idempotence.ProducerId:
        """The producer id of ``transactional_id`` (fencing its earlier producers), for the
        connection an atomic batch writes through (``Producer.atomic_batch``)."""
        if self.client_path != _clients.FAST:
            raise AtomicBatchError(
                "Kafka atomic batches (transactions) need producerkit's own Produce requests, "
                f"and this connection is on aiokafka's public API ({self.client_path_reason})",
                kind="unsupported",
            )
        if (refusal := options.transaction_refusal(self.options)) is not None:
            raise ConfigurationError(f"atomic_batch() on this producer: {refusal}")
        self._coordinator = transactions.Coordinator(
            self._producer.client,
            transactional_id,
            transaction_timeout_ms=self.options.get(
                "transaction_timeout_ms", options.DEFAULT_TRANSACTION_TIMEOUT_MS
            ),
            timeout=self.timeout,
            retry_backoff=self._settings.get("retry_backoff_ms", 100) / 1000,
        )
        producer_id = await self._transaction_step(
            self._coordinator.init_producer_id(
                only_if_new=bool(self.options.get("fresh_transactional_id"))
            )
        )
        self.idempotent, self.idempotence_reason = True, f"transactional id {transactional_id!r}"
        self._acks = -1
        return producer_id

    async def begin_transaction(self) -> None:
        """Open a transaction. After one that did not commit, the producer id is initialized
        again first: the epoch bumped aborts whatever the coordinator still has open, and the
        sequences start from 0 (a failed batch left a gap in them). After a transactions-v2
        batch the broker aborted for its timeout, the id is taken again only if nobody took it
        since, and the InitProducerId names this producer's id and epoch (KIP-588), so that a
        newer producer that took the id meanwhile fences this one rather than being fenced by
        it. Not after other failures: a coordinator takes a stale producer naming the epoch a
        newer producer bumped from as a retry of that producer's request, and grants both one
        epoch."""
        if self._transactions_over is not None:
            raise self._transactions_over
        if self._restart_transactions:
            coordinator = self._coordinator
            assert coordinator is not None
            current = self._sender.producer_id
            producer_id = await self._transaction_step(
                coordinator.init_producer_id_after_timeout(current)
                if self._restart_naming_current and current is not None
                else coordinator.init_producer_id()
            )
            for record in self._accumulator.strand() + self._sender.unwritten_records():
                self.reports.failed(record, BrokerUnavailable("its transaction ended"), False)
            self._sender.restart_sequences(producer_id)
            self._restart_transactions = self._restart_naming_current = False
        self._transaction_began = asyncio.get_running_loop().time()

    async def prepare_transaction(self) -> tuple[int, int, float, int]:
        """Leave the open transaction for another process to end (``end_prepared``): its
        producer id, epoch, when it began (``time.time()``) and its ``transaction_timeout_ms``.
        The connection begins no other transaction (the producer id initialized again would
        abort this one)."""
        producer_id = self._sender.producer_id
        assert self._coordinator is not None and producer_id is not None
        lasted = asyncio.get_running_loop().time() - self._transaction_began
        self._transactions_over = AtomicBatchError(
            f"this producer's transaction {self._coordinator.transactional_id!r} was prepared "
            "for another process to commit: a new transaction needs a new producer",
            kind="unsupported",
        )
        timeout_ms = self._coordinator.transaction_timeout_ms
        return producer_id.id, producer_id.epoch, time.time() - lasted, timeout_ms

    @property
    def transactions_v2(self) -> bool:
        """Whether this connection's transactions are KIP-890's transactions v2 (see
        ``transactions``): known once its first atomic batch opened it."""
        return self._coordinator is not None and bool(self._coordinator.v2)

    async def add_to_transaction(self, topic: str, partitions: list[int]) -> None:
        """Add ``topic``'s ``partitions`` to the open transaction (the connection of an atomic
        batch): before any of its messages for them is sent. With transactions v2 the Produce
        requests add them themselves, and this sends nothing."""
        producer_id = self._sender.producer_id
        assert self._coordinator is not None and producer_id is not None
        if self._coordinator.v2:
            return
        await self._transaction_step(
            self._coordinator.add_partitions(producer_id, topic, partitions)
        )

    async def end_transaction(self, *, commit: bool) -> None:
        """Commit (or abort) the open transaction once every message sent in it was answered.
        Raises AtomicBatchError with the coordinator's refusal (its ``kind``): ``"timed_out"``
        where the transaction outlived ``transaction_timeout_ms`` and the coordinator refused
        its end as it does one it aborted for that (INVALID_TXN_STATE with transactions v2,
        INVALID_PRODUCER_EPOCH with v1: the abort bumped the epoch), which does not end this
        producer's transactions as fencing does. With transactions v2 the next transaction is
        written with the producer id and epoch the coordinator answered with, every
        partition's sequence from 0 (nothing is in flight then: the batch waited for every
        answer before it ended the transaction)."""
        producer_id = self._sender.producer_id
        coordinator = self._coordinator
        assert coordinator is not None and producer_id is not None
        self._restart_transactions = not commit
        over_before = self._transactions_over
        try:
            following = await self._transaction_step(coordinator.end(producer_id, commit=commit))
        except AtomicBatchError as refused:
            self._restart_transactions = True
            lasted = asyncio.get_running_loop().time() - self._transaction_began
            error = transactions.timed_out(
                coordinator.transactional_id,
                refused.code,
                lasted,
                coordinator.transaction_timeout_ms,
            )
            if over_before is None and error is not None:
                self._transactions_over = None  # not fenced: the next batch begins anew
                # transactions v2: the coordinator that aborted it for its timeout keeps the
                # epoch it fenced as the last one, and grants it again to a KIP-588
                # InitProducerId naming it unless a newer producer took the id meanwhile (v1's
                # refuses it PRODUCER_FENCED: the id is taken as a new producer takes it)
                self._restart_naming_current = bool(coordinator.v2)
                raise AtomicBatchError(str(error), kind=error.kind, code=error.code) from refused
            raise
        if following is not None:
            self._sender.restart_sequences(following)

    async def _transaction_step(self, step: Awaitable[_T]) -> _T:
        """``step``'s result, its TransactionError as an AtomicBatchError of the same kind; once
        fenced (or refused for good), every later step fails the same way."""
        if self._transactions_over is not None:
            close = getattr(step, "close", None)
            if close is not None:
                close()
            raise self._transactions_over
        try:
            return await step
        except transactions.TransactionError as exc:
            error = AtomicBatchError(str(exc), kind=exc.kind, code=exc.code)
            if exc.kind in ("fenced", "unsupported"):
                self._transactions_over = error
            raise error from exc

    async def _grant_idempotence(self) -> idempotence.ProducerId | None:
        """Make the producer idempotent where it is wanted and the broker grants a producer id
        (``options.idempotence_wanted``); set ``idempotent`` and ``idempotence_reason``.
        Returns the id for the fast path's sender; on the public path aiokafka's own idempotent
        producer replaces the started one (its InitProducerId is v0, asked the same here)."""
        transactional_id = self.options.get(options.TRANSACTIONAL_OPTION)
        if transactional_id is not None:
            return await self._init_transactions(transactional_id)
        wanted, why = options.idempotence_wanted(self.options)
        if wanted is False:
            self.idempotent, self.idempotence_reason = False, why
            return None
        fast = self.client_path == _clients.FAST
        try:
            producer_id = await idempotence.request_producer_id(
                self._producer.client,
                deadline=asyncio.get_running_loop().time() + self.timeout,
                newest=fast,
                retry_backoff=self._settings.get("retry_backoff_ms", 100) / 1000,
            )
        except Exception as exc:
            refusal = translate(exc).args[0]
            if wanted:
                raise ConfigurationError(
                    "enable_idempotence=True needs a producer id from the broker, and its "
                    f"InitProducerId request failed ({refusal}): this broker does not grant "
                    "one; produce with enable_idempotence left at its default (idempotent "
                    "where the broker allows it) or False"
                ) from exc
            self.idempotent = False
            self.idempotence_reason = f"the broker granted no producer id ({refusal})"
            if self.index == 0:
                logger.info(
                    "Kafka at %s: not idempotent: %s; acks=%s, one batch per partition in flight",
                    self.url.server_strings()[0],
                    self.idempotence_reason,
                    self._settings["acks"],
                )
            return None
        self.idempotent, self.idempotence_reason = True, f"producer id granted ({why})"
        self._acks = -1
        if not fast:
            await self._producer.stop()
            self._producer = AIOKafkaProducer(
                bootstrap_servers=self.url.server_strings(),
                **options.idempotent_settings(self._settings),
            )
            self._sender.use_producer(self._producer)
            await self._producer.start()
        return producer_id

    async def _renew_producer_id(self, current: idempotence.ProducerId) -> idempotence.ProducerId:
        """``current`` with its epoch bumped, or a new producer id where the broker will not
        bump it."""
        deadline = asyncio.get_running_loop().time() + self.timeout
        client = self._producer.client
        try:
            return await idempotence.request_producer_id(client, deadline=deadline, current=current)
        except kafka_errors.KafkaError as exc:
            if exc.retriable:
                raise
            return await idempotence.request_producer_id(client, deadline=deadline)

    async def prepare_topic(self, topic: str) -> int | None:
        try:
            partitions = await self._producer.partitions_for(topic)
        except Exception as exc:
            raise translate(exc) from exc
        self._partition_counts[topic] = len(partitions)
        return len(partitions)

    def _metadata_updated(self, cluster: Any) -> None:
        for topic, known in list(self._partition_counts.items()):
            partitions = cluster.partitions_for_topic(topic)
            if partitions is not None and len(partitions) != known:
                self._partition_counts[topic] = len(partitions)
                self.reports.topic_changed(topic)

    # ------------------------------------------------------------------ the hot path

    @property
    def send(self) -> Callable[[Record], Awaitable[None] | None]:
        """``send(record)``: ``record`` appended to its partition's open list, its ship
        arranged. The connection's own ``wire.Appender``, C where built: no Python frame per
        record (a subclass's ``send``, or one patched onto the class, replaces it whole)."""
        return self._append

    def _batch_full(self, queue: PartitionQueue) -> Awaitable[None]:
        """A partition has enough open records for a full batch: it is encoded now, and the
        loop writes it (and reads acks) at once, not only when the window is full, so the
        broker works while the caller keeps producing."""
        self._accumulator.seal(queue)
        self._sender.schedule_ship()
        return asyncio.sleep(0)

    def send_many(
        self, records: list[Record], failed: Callable[[Record, Exception], object]
    ) -> list[tuple[Record, Awaitable[None]]]:
        """Append each record to its partition's open list (partition by partition) and
        arrange for them to ship, as :meth:`send` does for one: as many records as fill whole
        batches are sealed, the rest stay open for the next records (as one at a time, they
        would be sealed when they fill a batch)."""
        accumulator, sender, gathering = self._accumulator, self._sender, self._gathering
        sealed = False
        for run in partition_runs(records):
            queue = accumulator.queue_of(run[0])
            if not queue.records and self._lingers:
                queue.opened_at = time.monotonic()
            queue.records += run
            batch_records = gathering.batch_records
            if len(queue.records) >= batch_records:
                accumulator.seal(queue, len(queue.records) // batch_records * batch_records)
                sealed = True
            elif not gathering.ship_due and not queue.in_flight:
                sender.schedule_ship(sender.linger)  # else the answers in flight ship them
        if not sealed:
            return []
        sender.schedule_ship()
        return [(records[-1], asyncio.sleep(0))]  # let the loop write what was sealed

    def _fail(self, records: list[Record], exc: BaseException) -> None:
        self._sender.fail(records, exc, possibly_stored=False)  # the encoder refused them

    def unwritten(self, records: list[Record]) -> set[int]:
        # Once they fail (the caller's doing), the accumulator drops them as it seals and the
        # sender before it writes a batch waiting for its connection.
        seqs = {record.seq for record in records}
        found = self._accumulator.unwritten(seqs)
        found.update(
            record.seq for record in self._sender.unwritten_records() if record.seq in seqs
        )
        return found

    def flush(self) -> None:
        # Start shipping what is open now; acks (or deadlines) end each record, not this call.
        if any(queue.records or queue.full for queue in self._accumulator.all_queues()):
            self._sender.ship_all(now=True)

    async def close(self) -> None:
        unsent = self._sender.unwritten_records()
        self._sender.stop()
        error = BrokerUnavailable("the connection closed before this message was sent")
        for record in self._accumulator.strand() + unsent:
            self.reports.failed(record, error, False)
        if self._compressed_encoder is not None:
            self._compressed_encoder.close()
        await self._producer.stop()


async def _why_unreachable(servers: Sequence[tuple[str, int]], timeout: float) -> str:
    """Why each bootstrap server cannot be reached ("a:9092: connection refused; ..."), found
    by resolving and connecting to each as aiokafka would; empty if every one answers."""
    patience = min(timeout / 2, 5.0)

    async def why(host: str, port: int) -> str | None:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), patience)
        except socket.gaierror as exc:
            return f"{host}:{port}: cannot resolve host {host!r} (DNS: {exc.strerror or exc})"
        except ConnectionRefusedError:
            return f"{host}:{port}: connection refused (nothing listens there)"
        except TimeoutError:
            return f"{host}:{port}: no answer within {patience}s"
        except OSError as exc:
            return f"{host}:{port}: {exc.strerror or exc}"
        writer.transport.abort()
        return None

    causes = await asyncio.gather(*(why(host.strip("[]"), port) for host, port in servers))
    return "; ".join(cause for cause in causes if cause is not None)


async def _probe_tls(server: tuple[str, int], context: ssl.SSLContext, timeout: float) -> None:
    """Handshake once with the first bootstrap server before aiokafka connects: aiokafka logs a
    TLS failure and reports only "Unable to bootstrap", and a plaintext listener may never
    answer a ClientHello. Unreachable servers are left to aiokafka's own error."""
    host, port = server
    # A handshake takes round trips, not seconds; a plaintext listener reads the ClientHello as
    # the start of a huge request and waits for the rest.
    patience = min(timeout / 2, 5.0)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), patience)
    except (OSError, TimeoutError):
        return
    try:
        await asyncio.wait_for(
            writer.start_tls(context, server_hostname=host.strip("[]")), patience
        )
    except TimeoutError as exc:
        raise TLSError(
            f"no TLS handshake from {host}:{port} within {patience}s: "
            "is TLS enabled on this listener?"
        ) from exc
    except (ssl.SSLError, OSError) as exc:
        raise TLSError(f"TLS handshake with {host}:{port} failed: {exc}") from exc
    finally:
        writer.transport.abort()
