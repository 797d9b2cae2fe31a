"""Every private name of aiokafka and nats-py that a fast path uses is checked by its probe, and
a client on which one is renamed takes the public path (or fails the messages with a typed
error): never an ack for a message that was not sent.

Each probed name is hidden from the probe on a live client (a renamed attribute looks, to the
probe, like a missing one); the renames a test can make without breaking the client itself
(aiokafka's BatchBuilder internals, nats-py's flush coroutine, a connection aiokafka cannot
open) are made on the installed client and published through.
"""

from __future__ import annotations

from typing import Any

import pytest

import producerkit as pk
from producerkit._record import Record
from producerkit.backends import _clients
from producerkit.testing.pytest_plugin import NatsSessionBroker, SessionBroker

pytest.importorskip("aiokafka")
pytest.importorskip("nats")

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.producer.message_accumulator import BatchBuilder
from nats.aio.client import Client

from producerkit.backends.kafka import _aiokafka_compat
from producerkit.backends.nats import _natspy_compat

pytestmark = pytest.mark.anyio

KAFKA_CONNECTION = ("_requests", "_writer", "_versions", "_next_correlation_id", "connected")
NATS_CLIENT = tuple(name for name, _ in _natspy_compat._CLIENT_INTERNALS)


class Hiding:
    """``target`` as a probe sees it when ``name`` was renamed: every attribute but that one."""

    def __init__(self, target: Any, name: str) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_hidden", name)

    def __getattr__(self, name: str) -> Any:
        if name == object.__getattribute__(self, "_hidden"):
            raise AttributeError(name)
        return getattr(object.__getattribute__(self, "_target"), name)


@pytest.fixture(autouse=True)
def _not_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_clients.PATH_VARIABLE, raising=False)


@pytest.mark.parametrize("name", [*KAFKA_CONNECTION, "_conns"])
async def test_the_kafka_probe_names_each_internal_it_needs(
    name: str, kafka_broker: SessionBroker
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.url.removeprefix("kafka://"))
    await producer.start()
    try:
        client = producer.client
        if name == "_conns":
            problem = await _aiokafka_compat._probe(Hiding(client, name), -1)
        else:
            real_get_conn = client._get_conn

            async def get_conn(node_id: int) -> Any:
                return Hiding(await real_get_conn(node_id), name)

            probed = Hiding(client, "_get_conn")
            object.__setattr__(probed, "_get_conn", get_conn)
            problem = await _aiokafka_compat._probe(probed, -1)
        assert problem is not None and name in problem
    finally:
        await producer.stop()


@pytest.mark.parametrize("name", NATS_CLIENT)
async def test_the_nats_probe_names_each_internal_it_needs(
    name: str, nats_broker: NatsSessionBroker
) -> None:
    client = Client()
    await client.connect(f"nats://{nats_broker.host_port}")
    try:
        assert _natspy_compat._probe(client) is None
        problem = _natspy_compat._probe(Hiding(client, name))  # type: ignore[arg-type]
        assert problem is not None and name in problem
    finally:
        await client.close()


class _RenamedBatchBuilder(BatchBuilder):  # type: ignore[misc]
    """aiokafka's BatchBuilder as a release that renamed ``_relative_offset`` would have it."""

    def append(self, *, timestamp: Any, key: Any, value: Any, headers: Any = ()) -> Any:
        if self._closed:
            return None
        metadata = self._builder.append(
            self._count, timestamp, key=key, value=value, headers=list(headers or [])
        )
        if metadata is None:
            self.close()
            return None
        self._count += 1
        return metadata

    def record_count(self) -> int:
        return int(self._count)


def _renamed_create_batch(original: Any) -> Any:
    def create_batch(self: AIOKafkaProducer) -> Any:
        builder = original(self)
        builder.__class__ = _RenamedBatchBuilder
        builder._count = builder.__dict__.pop("_relative_offset")
        return builder

    return create_batch


async def _takes_the_public_path_and_delivers(url: str, topic: str, reason: str) -> None:
    """A producer on ``url`` takes the public path, saying ``reason``, and delivers."""
    async with pk.Producer(url, topic=topic) as producer:
        assert producer.backend.client_path == "public"
        assert reason in producer.backend.client_path_reason
        delivery = await producer.produce(b"v", key=b"k")
        assert delivery is not None and delivery.offset is not None


async def test_a_renamed_batch_builder_internal_takes_the_public_path(
    kafka_broker: SessionBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What was simulated against aiokafka 0.14: BatchBuilder._relative_offset renamed. The
    probe sees it and the public path delivers; the fast fill, had it run, refuses the batch
    (a typed failure) instead of sending an empty one acked as delivered."""
    original = AIOKafkaProducer.create_batch
    monkeypatch.setattr(AIOKafkaProducer, "create_batch", _renamed_create_batch(original))
    await _takes_the_public_path_and_delivers(
        kafka_broker.url, topic, "BatchBuilder._relative_offset"
    )
    kafka = AIOKafkaProducer(bootstrap_servers=kafka_broker.url.removeprefix("kafka://"))
    builder = kafka.create_batch()
    record = Record(1, b"v", None, topic, 0, None, None, 1e9, 0, None, None)
    with pytest.raises(KafkaError, match="holds 0 records after 1"):
        _aiokafka_compat.fill_builder(builder, [record], 0, 0.0, fast=True)


async def test_an_api_versions_request_that_cannot_frame_itself_takes_the_public_path(
    kafka_broker: SessionBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path writes ApiVersions requests on a connection whose Produce request is late
    (to learn whether it was lost): a client whose prepared request cannot build its header
    takes the public path, and delivers."""

    class Unframed:
        def prepare(self, versions: Any) -> object:
            return object()

    monkeypatch.setattr(_aiokafka_compat, "ApiVersionRequest", Unframed)
    await _takes_the_public_path_and_delivers(kafka_broker.url, topic, "ApiVersionRequest")


async def test_no_connection_to_probe_is_not_a_pass(
    kafka_broker: SessionBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_probe = _aiokafka_compat._probe

    async def probe_without_a_connection(client: Any, acks: int) -> Any:
        async def none(node_id: int) -> None:
            return None

        probed = Hiding(client, "_get_conn")
        object.__setattr__(probed, "_get_conn", none)
        return await real_probe(probed, acks)

    monkeypatch.setattr(_aiokafka_compat, "_probe", probe_without_a_connection)
    await _takes_the_public_path_and_delivers(kafka_broker.url, topic, "no connection")


async def test_a_nats_flush_that_is_no_coroutine_takes_the_public_path(
    nats_broker: NatsSessionBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Client._flush_pending

    def flush_pending(self: Client, *args: Any, **kwargs: Any) -> Any:
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Client, "_flush_pending", flush_pending)
    subject = topic.replace("-", "")
    async with pk.Producer(
        nats_broker.jetstream_url, topic=subject, create_stream=True
    ) as producer:
        assert producer.backend.client_path == "public"
        deliveries = [await producer.produce(b"%d" % number) for number in range(5)]
    assert all(d is not None and d.offset is not None for d in deliveries)


async def test_a_batch_aiokafka_reports_sent_without_an_offset_is_not_acked(
    kafka_broker: SessionBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    monkeypatch.setenv(_clients.PATH_VARIABLE, "public")

    async def send_batch(self: Any, batch: Any, topic: str, *, partition: int) -> Any:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)  # "sent", with no RecordMetadata
        return future

    async with pk.Producer(kafka_broker.url, topic=topic, timeout=5.0) as producer:
        monkeypatch.setattr(AIOKafkaProducer, "send_batch", send_batch)
        with pytest.raises(pk.DeliveryError, match="no offset"):
            await producer.produce(b"v", key=b"k")
        stats = producer.stats
        assert (stats.acked, stats.failed) == (0, 1)
        monkeypatch.undo()


def _watch_private_reads(classes: list[type], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every private name of ``classes``' instances that producerkit's own code reads."""
    import sys

    reads: list[str] = []
    for cls in classes:
        original = cls.__getattribute__

        def getattribute(self: Any, name: str, original: Any = original, cls: type = cls) -> Any:
            if name.startswith("_") and not name.startswith("__"):
                module = sys._getframe(1).f_globals.get("__name__", "")
                if module.startswith("producerkit"):
                    reads.append(f"{module}: {cls.__name__}.{name}")
            return original(self, name)

        monkeypatch.setattr(cls, "__getattribute__", getattribute)
    return reads


@pytest.mark.parametrize("scheme", ["kafka", "jetstream", "nats"])
async def test_the_public_path_reads_no_private_name_of_its_client(
    scheme: str,
    kafka_broker: SessionBroker,
    nats_broker: NatsSessionBroker,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aiokafka.client import AIOKafkaClient
    from aiokafka.conn import AIOKafkaConnection
    from nats.protocol.parser import Parser

    monkeypatch.setenv(_clients.PATH_VARIABLE, "public")
    if scheme == "kafka":
        url, options = kafka_broker.url, {}
        classes = [AIOKafkaProducer, AIOKafkaClient, AIOKafkaConnection, BatchBuilder]
    else:
        url = nats_broker.jetstream_url if scheme == "jetstream" else nats_broker.url
        options = {"create_stream": True} if scheme == "jetstream" else {}
        classes = [Client, Parser]
        topic = topic.replace("-", "")
    reads = _watch_private_reads(classes, monkeypatch)
    async with pk.Producer(url, topic=topic, **options) as producer:
        for number in range(20):
            await producer.produce(b"%d" % number, key=b"k", nonblocking=True)
        await producer.produce(b"last", key=b"k")
        assert producer.backend.client_path == "public"
    assert reads == []
