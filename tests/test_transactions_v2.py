"""Kafka transactions v2 (KIP-890) against Apache Kafka: ``atomic_batch()`` on ``kafka://``.

On a node that finalized ``transaction.version`` 2 (``apache_kafka``) producerkit's transactions
are written as Produce v12 (no AddPartitionsToTxn) and ended with EndTxn v5, whose answer
carries the epoch of the next transaction; on a node formatted with ``transaction.version=0``
(``apache_kafka_tv0``) the same workloads go as before: AddPartitionsToTxn, Produce v3-v8,
EndTxn v0. Both are read back by ``read_committed`` and ``read_uncommitted`` consumers.

What goes over the wire is read from the client's side of each connection (every
``StreamWriter.write`` split into Kafka frames, see :class:`WireTap`): the requests' API keys
and versions, and the producer id, epoch and sequences of the transactional Produce and EndTxn
requests.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from chaos.judges import kafka_wire as txn_wire
from chaos.judges.kafka_recorder import _Frames
from conftest import TRANSACTIONS_ON_THE_FAST_PATH

import producerkit as pk
from producerkit._atomic import AtomicBatch
from producerkit.backends.kafka import transactions
from producerkit.backends.kafka.idempotence import ProducerId

pytestmark = [pytest.mark.anyio, TRANSACTIONS_ON_THE_FAST_PATH]

ADD_PARTITIONS_TO_TXN = 24
PRODUCE, END_TXN = txn_wire.PRODUCE, txn_wire.END_TXN
PARTITIONS = 3


@dataclass
class WireTap:
    """The requests this process writes to Kafka while it is installed: each as ``(api_key,
    api_version)``, and the transactional Produce requests' batch headers and EndTxn requests
    read from their frames."""

    requests: list[tuple[int, int]] = field(default_factory=list)
    produced: list[tuple[int, txn_wire.BatchHeader]] = field(default_factory=list)
    ended: list[tuple[int, int, int, bool]] = field(default_factory=list)
    _streams: dict[int, _Frames] = field(default_factory=dict)

    def feed(self, writer: Any, data: Any) -> None:
        frames = self._streams.get(id(writer))
        if frames is None:
            frames = self._streams[id(writer)] = _Frames(12, self._want, self._frame)
        frames.feed(bytes(data))

    def _want(self, head: bytearray) -> bool:
        api_key, version, _ = txn_wire.request_header(head)
        self.requests.append((api_key, version))
        return api_key in (PRODUCE, END_TXN)

    def _frame(self, frame: bytes) -> None:
        api_key, version, _ = txn_wire.request_header(frame)
        if api_key == END_TXN:
            _, producer_id, epoch, committed = txn_wire.end_txn_request(frame, version)
            self.ended.append((version, producer_id, epoch, committed))
        else:
            read = txn_wire.produce_request(frame, version)
            if read is not None:
                self.produced += [(version, batch) for batch in read[1]]

    def versions(self, api_key: int) -> set[int]:
        return {version for key, version in self.requests if key == api_key}

    def transactional_produce_versions(self) -> set[int]:
        return {version for version, _ in self.produced}


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Iterator[WireTap]:
    tap = WireTap()
    write = asyncio.StreamWriter.write

    def tapped(self: asyncio.StreamWriter, data: Any) -> None:
        tap.feed(self, data)
        write(self, data)

    monkeypatch.setattr(asyncio.StreamWriter, "write", tapped)
    yield tap


@pytest.fixture(params=["apache_kafka", "apache_kafka_tv0"])
def kafka(request: pytest.FixtureRequest) -> Any:
    """Each Apache Kafka node: transactions v2 and transactions v1 (``transaction.version=0``)."""
    return request.getfixturevalue(request.param)


def _topic(kafka: Any) -> str:
    name = f"tv2-{uuid.uuid4().hex[:12]}"
    kafka.create_topic(name, partitions=PARTITIONS)
    return name


def _values(records: list[dict[str, Any]]) -> list[bytes]:
    return sorted(record["value"] for record in records)


async def test_commits_are_read_once_and_aborts_never(kafka: Any, wire: WireTap) -> None:
    """Five transactions in a row over three partitions, the third aborted by its block:
    a ``read_committed`` consumer reads the four committed ones' messages once each and none of
    the aborted one; a ``read_uncommitted`` one reads those too. With transactions v2 every
    request is Produce v12 and EndTxn v5, none AddPartitionsToTxn, and each transaction is
    written with the epoch the previous EndTxn answered with, its sequences from 0; with v1,
    AddPartitionsToTxn, Produce below v9 and EndTxn v0, one epoch throughout."""
    topic = _topic(kafka)
    committed: list[bytes] = []
    aborted: list[bytes] = []
    async with pk.Producer(
        kafka.url, topic=topic, transactional_id=f"tx-{topic}", timeout=30.0
    ) as producer:
        for number in range(5):
            values = [b"%d-%d" % (number, index) for index in range(12)]
            try:
                async with producer.atomic_batch() as batch:
                    for index, value in enumerate(values):
                        await batch.produce(value, key=b"k%d" % index)
                    if number == 2:
                        raise RuntimeError("the application gives up on this one")
            except RuntimeError:
                aborted += values
            else:
                committed += values

    assert _values(kafka.read(topic, expected=len(committed))) == sorted(committed)
    everything = kafka.read(topic, isolation="read_uncommitted", expected=60)
    assert _values(everything) == sorted(committed + aborted)

    ends = [(producer_id, epoch, commit) for _, producer_id, epoch, commit in wire.ended]
    assert [commit for _, _, commit in ends] == [True, True, False, True, True]
    epochs = [epoch for _, epoch, _ in ends]
    if kafka.transaction_version >= 2:
        assert wire.transactional_produce_versions() == {12}
        assert wire.versions(END_TXN) == {transactions.END_TXN_V2}
        assert ADD_PARTITIONS_TO_TXN not in {key for key, _ in wire.requests}
        # EndTxn bumps the epoch at every end; the transaction after the abort begins with a
        # fresh InitProducerId (which bumps it again).
        assert epochs[1] == epochs[0] + 1 and epochs[2] == epochs[1] + 1
        assert epochs[3] > epochs[2] + 1 and epochs[4] == epochs[3] + 1
    else:
        assert max(wire.transactional_produce_versions()) < 9
        assert wire.versions(END_TXN) == {0}
        assert ADD_PARTITIONS_TO_TXN in {key for key, _ in wire.requests}
        assert epochs[0] == epochs[1] == epochs[2] and epochs[3] == epochs[4] == epochs[2] + 1
    # Every batch is stamped with its transaction's epoch, each partition numbered from 0 in
    # each epoch.
    by_epoch: dict[int, dict[int, list[int]]] = {}
    for _, header in wire.produced:
        assert header.transactional
        by_epoch.setdefault(header.epoch, {}).setdefault(header.partition, []).append(
            header.base_sequence
        )
    assert set(by_epoch) == set(epochs)
    for sequences in by_epoch.values():
        assert all(found[0] == 0 for found in sequences.values())


async def test_a_newer_producer_of_the_id_fences_the_older(kafka: Any, wire: WireTap) -> None:
    """Two producers of one transactional id: the newer one's first batch fences the older,
    whose next batch fails ``"fenced"`` (with transactions v2, its Produce v12 under the old
    epoch is refused, and so is its abort); the newer one's batches commit."""
    topic = _topic(kafka)
    transactional_id = f"tx-{topic}"
    async with (
        pk.Producer(kafka.url, topic=topic, transactional_id=transactional_id) as older,
        pk.Producer(kafka.url, topic=topic, transactional_id=transactional_id) as newer,
    ):
        async with older.atomic_batch() as batch:
            await batch.produce(b"older-1")
        async with newer.atomic_batch() as batch:
            await batch.produce(b"newer-1")
        with pytest.raises(pk.AtomicBatchError) as raised:
            async with older.atomic_batch() as batch:
                await batch.produce(b"older-2")
        assert raised.value.kind == "fenced"
        with pytest.raises(pk.AtomicBatchError) as again:
            async with older.atomic_batch() as batch:
                await batch.produce(b"older-3")
        assert again.value.kind == "fenced"
        async with newer.atomic_batch() as batch:
            await batch.produce(b"newer-2")

    assert _values(kafka.read(topic, expected=3)) == [b"newer-1", b"newer-2", b"older-1"]
    if kafka.transaction_version >= 2:
        assert wire.transactional_produce_versions() == {12}
        assert ADD_PARTITIONS_TO_TXN not in {key for key, _ in wire.requests}


async def test_reusing_the_epoch_after_end_txn_v5_is_refused(
    apache_kafka: Any, wire: WireTap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken producer that ignores the producer id and epoch EndTxn v5 answered with, and
    writes its next transaction under the old epoch: the broker refuses its Produce, the batch
    fails, and none of it is ever read committed. (What the epoch bump is for: a write of an
    ended transaction cannot join the next one.)"""
    topic = _topic(apache_kafka)
    end = transactions.Coordinator.end

    async def end_ignoring_the_answer(self: Any, producer: Any, *, commit: bool) -> None:
        await end(self, producer, commit=commit)

    monkeypatch.setattr(transactions.Coordinator, "end", end_ignoring_the_answer)
    async with pk.Producer(
        apache_kafka.url, topic=topic, transactional_id=f"tx-{topic}", timeout=15.0
    ) as producer:
        async with producer.atomic_batch() as batch:
            await batch.produce(b"first")
        with pytest.raises(pk.AtomicBatchError) as refused:
            async with producer.atomic_batch() as batch:
                await batch.produce(b"under-the-old-epoch")
        assert refused.value.kind == "message_failed"
        assert "InvalidProducerEpoch" in str(refused.value)

    assert _values(apache_kafka.read(topic, expected=1)) == [b"first"]
    first, second = (batch for _, batch in wire.produced[:2])
    assert second.epoch == first.epoch  # the broken producer's doing, refused by the broker


async def test_prepared_transactions_are_ended_by_another_client(kafka: Any, wire: WireTap) -> None:
    """The two-phase commit of the Spark exactly-once sink: transactions written whole and left
    open (``prepare=True``), then committed, aborted (by their handles) or aborted as left open
    (by their ids) from another client: only the committed one is read committed. With
    transactions v2 the other client's EndTxn is v5 too."""
    from producerkit import transactions as pk_transactions

    topic = _topic(kafka)
    prepared = []
    for name in ("commit", "abort", "left-open"):
        async with pk.Producer(
            kafka.url, topic=topic, transactional_id=f"tx-{topic}-{name}"
        ) as producer:
            async with producer.atomic_batch(prepare=True) as batch:
                for index in range(5):
                    await batch.produce(b"%s-%d" % (name.encode(), index), key=b"k%d" % index)
            assert isinstance(batch, AtomicBatch) and batch.prepared is not None
            prepared.append(batch.prepared)
    await pk_transactions.commit_prepared(kafka.url, prepared[0])
    await pk_transactions.abort_prepared(kafka.url, prepared[1])
    await pk_transactions.abort_open(kafka.url, [prepared[2].transactional_id])

    assert _values(kafka.read(topic, expected=5)) == [b"commit-%d" % i for i in range(5)]
    assert len(kafka.read(topic, isolation="read_uncommitted", expected=15)) == 15
    if kafka.transaction_version >= 2:
        assert wire.versions(END_TXN) == {transactions.END_TXN_V2}
        assert wire.transactional_produce_versions() == {12}
    else:
        assert wire.versions(END_TXN) == {0}


async def test_a_fresh_transactional_id_is_taken_only_if_no_producer_held_it(kafka: Any) -> None:
    """``fresh_transactional_id=True`` (a Spark task's first attempt): a new id is granted and
    its transaction commits; an id another producer initialized is refused ``"fenced"`` at
    the batch's start, and the holder's prepared transaction is untouched (its commit stands).
    A producer without the option takes the id as before."""
    from producerkit import transactions as pk_transactions

    topic = _topic(kafka)
    async with (
        pk.Producer(
            kafka.url, topic=topic, transactional_id=f"tx-{topic}-new", fresh_transactional_id=True
        ) as first,
        first.atomic_batch() as batch,
    ):
        await batch.produce(b"new-id")
    held = f"tx-{topic}-held"
    async with pk.Producer(kafka.url, topic=topic, transactional_id=held) as holder:
        async with holder.atomic_batch(prepare=True) as batch:
            await batch.produce(b"holder")
        assert isinstance(batch, AtomicBatch) and batch.prepared is not None
        prepared = batch.prepared
    async with pk.Producer(
        kafka.url, topic=topic, transactional_id=held, fresh_transactional_id=True
    ) as late:
        with pytest.raises(pk.AtomicBatchError, match="initialized before") as refused:
            async with late.atomic_batch() as batch:
                await batch.produce(b"late")
    assert refused.value.kind == "fenced"
    await pk_transactions.commit_prepared(kafka.url, prepared)
    async with (
        pk.Producer(kafka.url, topic=topic, transactional_id=held) as taker,
        taker.atomic_batch() as batch,
    ):
        await batch.produce(b"taker")

    assert _values(kafka.read(topic, expected=3)) == [b"holder", b"new-id", b"taker"]
    assert len(kafka.read(topic, isolation="read_uncommitted", expected=3)) == 3


def test_a_fresh_transactional_id_needs_one_given() -> None:
    with pytest.raises(pk.ConfigurationError, match="give transactional_id"):
        pk.Producer("kafka://127.0.0.1:9", fresh_transactional_id=True)


async def test_a_coordinator_that_cannot_tell_a_new_id_grants_it_anyway(
    kafka_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka's mock knows no producer id it did not grant (it answers the new-only request
    UNKNOWN_PRODUCER_ID or the like): the id is asked for again without the condition."""
    caplog.set_level("DEBUG", logger="producerkit.kafka")
    topic = f"tv2-{uuid.uuid4().hex[:12]}"
    kafka_cluster.create_topic(topic, partitions=1)
    async with (
        pk.Producer(
            kafka_cluster.url,
            topic=topic,
            transactional_id=f"tx-{topic}",
            fresh_transactional_id=True,
        ) as producer,
        producer.atomic_batch() as batch,
    ):
        await batch.produce(b"granted")
    assert [r.value for r in kafka_cluster.read(topic)] == [b"granted"]
    assert "does not take a new-only InitProducerId" in caplog.text


class _Coordinator:
    """An aiokafka client's stand-in for a coordinator that answers ApiVersions v3 with
    ``features`` finalized and EndTxn with ``following`` (the next producer id and epoch)."""

    def __init__(self, features: list[tuple[str, int]], following: tuple[int, int]) -> None:
        self.features = features
        self.following = following
        self.asked: list[Any] = []

    async def coordinator_lookup(self, key_type: int, key: str) -> int:
        return 1

    async def send(self, node: int, request: Any) -> Any:
        self.asked.append(request)
        if request.API_KEY == 18:
            finalized = transactions._FINALIZED_FEATURES.encode(
                [(name, level, level, {}) for name, level in self.features]
            )
            return transactions._ApiVersionsResponse_v3(
                0, [(0, 3, 13, {}), (26, 0, 5, {})], 0, {2: finalized}
            )
        if isinstance(request, transactions._EndTxnRequestV2):
            return transactions._EndTxnResponse_v5(0, 0, *self.following, {})
        return transactions._EndTxnResponse_v5(0, 0, -1, -1, {})


@pytest.mark.parametrize(
    ("features", "v2"),
    [
        ([("transaction.version", 2), ("metadata.version", 27)], True),
        ([("transaction.version", 1)], False),
        ([("metadata.version", 27)], False),
    ],
)
async def test_transactions_v2_from_the_finalized_features(
    features: list[tuple[str, int]], v2: bool
) -> None:
    """Transactions v2 where ``transaction.version`` 2 or more is finalized (and the broker
    takes Produce v12 and EndTxn v5): EndTxn's answer then gives the next producer id and epoch,
    a new id at epoch 0 where the epoch would overflow, as Kafka answers."""
    client = _Coordinator(features, following=(78, 0))
    coordinator = transactions.Coordinator(
        client, "tx", transaction_timeout_ms=60_000, timeout=5.0, retry_backoff=0.01
    )
    following = await coordinator.end(ProducerId(77, 32766), commit=True)
    assert coordinator.v2 is v2
    assert following == (ProducerId(78, 0) if v2 else None)
    assert [request.API_KEY for request in client.asked] == [18, 26]
