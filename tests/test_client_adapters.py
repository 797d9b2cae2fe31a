"""The client adapters: which path a connection takes through aiokafka or nats-py, and what
happens when a client is too old, its internals are not as expected, or they fail mid-run.

Every test here talks to the session's real brokers.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import pytest
from conftest import read_jetstream, read_kafka

import producerkit as pk
from producerkit.backends import _clients
from producerkit.testing.brokers import LocalBroker

SCHEMES = ["kafka", "jetstream", "nats"]

pytestmark = pytest.mark.anyio


def _url(
    scheme: str, kafka_broker: LocalBroker, nats_broker: LocalBroker
) -> tuple[str, dict[str, Any]]:
    if scheme == "kafka":
        return kafka_broker.url, {}
    if scheme == "jetstream":
        return nats_broker.jetstream_url, {"create_stream": True}
    return f"nats://{nats_broker.host_port}", {}


@pytest.fixture(params=SCHEMES)
def target(
    request: pytest.FixtureRequest, kafka_broker: LocalBroker, nats_broker: LocalBroker
) -> tuple[str, str, dict[str, Any]]:
    url, options = _url(request.param, kafka_broker, nats_broker)
    return request.param, url, options


async def _produce_some(producer: pk.Producer, count: int) -> None:
    for i in range(count):
        await producer.produce(b"%d" % i, key=b"k%d" % (i % 3), nonblocking=True)
    await producer.flush()


@pytest.mark.parametrize("forced", ["public", "fast"])
async def test_the_forced_path_is_taken_and_delivers(
    target: tuple[str, str, dict[str, Any]],
    topic: str,
    forced: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, url, options = target
    monkeypatch.setenv(_clients.PATH_VARIABLE, forced)
    async with pk.Producer(url, topic=topic, **options) as producer:
        assert [backend.client_path for backend in producer.backends] == [forced]
        await _produce_some(producer, 500)
        assert (producer.stats.acked, producer.stats.failed) == (500, 0)


async def test_an_unknown_forced_path_is_a_configuration_error(
    target: tuple[str, str, dict[str, Any]], topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url, options = target
    monkeypatch.setenv(_clients.PATH_VARIABLE, "turbo")
    with pytest.raises(pk.ConfigurationError, match="'fast' or 'public'"):
        await pk.Producer(url, topic=topic, **options).start()


@pytest.mark.parametrize("installed", ["older", "unreadable"])
async def test_a_client_older_than_supported_fails_start_at_once(
    target: tuple[str, str, dict[str, Any]],
    topic: str,
    installed: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheme, url, options = target
    package = "aiokafka" if scheme == "kafka" else "nats-py"
    old = {"aiokafka": "0.12.0", "nats-py": "2.15.0"}[package] if installed == "older" else None
    real = _clients.installed_version
    monkeypatch.setattr(
        _clients, "installed_version", lambda name: old if name == package else real(name)
    )

    producer = pk.Producer(url, topic=topic, **options)
    started = time.monotonic()
    with pytest.raises(pk.IncompatibleClientError) as caught:
        await producer.start()
    assert time.monotonic() - started < 1.0
    error = caught.value
    assert isinstance(error, pk.ProducerkitError)
    assert (error.package, error.version) == (package, old)
    assert error.supported == _clients.supported_range(package)
    assert package in str(error) and error.supported in str(error)
    assert "not installed" not in str(error)


async def test_a_client_newer_than_tested_takes_the_fast_path_when_its_internals_match(
    target: tuple[str, str, dict[str, Any]],
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv(_clients.PATH_VARIABLE, raising=False)
    scheme, url, options = target
    package = "aiokafka" if scheme == "kafka" else "nats-py"
    newer = _clients.SUPPORTED[package][1] + ".0"
    real = _clients.installed_version
    monkeypatch.setattr(
        _clients, "installed_version", lambda name: newer if name == package else real(name)
    )
    monkeypatch.setattr(_clients, "_logged", set())

    with caplog.at_level(logging.INFO, logger="producerkit.clients"):
        async with pk.Producer(url, topic=topic, **options) as producer:
            assert producer.backend.client_path == "fast"
            assert "newer than tested" in producer.backend.client_path_reason
            await _produce_some(producer, 100)
    assert [r.getMessage() for r in caplog.records if "newer than tested" in r.getMessage()]


def _break_internal(scheme: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Make the probe find what a client release could bring: aiokafka negotiating a Produce
    version producerkit does not frame, or nats-py without an internal the fast path uses.
    Returns what the reason must name."""
    if scheme == "kafka":
        from producerkit.backends.kafka import _aiokafka_compat

        monkeypatch.setattr(_aiokafka_compat, "PRODUCE_VERSIONS", range(3, 4))
        return "producerkit frames v3-v3"
    from producerkit.backends.nats import _natspy_compat

    internals = (*_natspy_compat._CLIENT_INTERNALS, ("_pending_renamed", callable))
    monkeypatch.setattr(_natspy_compat, "_CLIENT_INTERNALS", internals)
    return "Client._pending_renamed"


async def test_a_missing_internal_falls_back_to_the_public_path_and_says_why(
    target: tuple[str, str, dict[str, Any]],
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheme, url, options = target
    monkeypatch.delenv(_clients.PATH_VARIABLE, raising=False)
    monkeypatch.setattr(_clients, "_logged", set())

    with caplog.at_level(logging.INFO, logger="producerkit.clients"):
        missing = _break_internal(scheme, monkeypatch)
        async with pk.Producer(url, topic=topic, connections=2, **options) as producer:
            for backend in producer.backends:
                assert backend.client_path == "public"
                assert missing in backend.client_path_reason
            await _produce_some(producer, 300)
            assert (producer.stats.acked, producer.stats.failed) == (300, 0)
    monkeypatch.undo()
    if scheme == "kafka":
        assert len(await read_kafka(url, topic, 300)) == 300
    elif scheme == "jetstream":
        assert len(await read_jetstream(url, topic, 300)) == 300
    # (core NATS keeps nothing to read back)
    said = [r for r in caplog.records if "public path" in r.getMessage()]
    assert len(said) == 1, "logged once for both connections"
    assert said[0].levelno == logging.WARNING


async def test_a_fast_path_failure_mid_run_fails_its_batch_at_once_with_the_cause(
    kafka_broker: LocalBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An internal that breaks after the probe (here: the correlation id raising) fails exactly
    the messages of the requests it concerns, at once and with the original exception as the
    cause, instead of stalling the partition until the messages time out; the producer goes on
    once the internal works again."""
    from aiokafka.conn import AIOKafkaConnection

    monkeypatch.delenv(_clients.PATH_VARIABLE, raising=False)

    async with pk.Producer(kafka_broker.url, topic=topic, timeout=30) as producer:
        assert producer.backend.client_path == "fast"
        await producer.produce(b"warm", key=b"k")

        def broken(self: Any) -> int:
            raise RuntimeError("correlation ids are gone")

        monkeypatch.setattr(AIOKafkaConnection, "_next_correlation_id", broken)
        started = time.monotonic()
        for i in range(200):
            await producer.produce(b"%d" % i, key=b"k%d" % (i % 3), nonblocking=True)
        with pytest.raises(pk.ProduceError) as caught:
            await producer.flush(timeout=5)
        assert time.monotonic() - started < 2, "failed at once, not at the deadline"
        failures = caught.value.failures
        assert sorted(int(failure.value) for failure in failures) == list(range(200))
        for failure in failures:
            assert isinstance(failure.exception, pk.DeliveryError)
            assert isinstance(failure.exception.__cause__, RuntimeError)
        monkeypatch.undo()
        delivery = await producer.produce(b"after", key=b"k")
        assert delivery is not None and delivery.offset is not None
        stats = producer.stats
        assert (stats.produced, stats.acked, stats.failed) == (202, 2, 200)


async def test_the_direct_nats_path_writes_what_nats_py_would(
    nats_broker: LocalBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path writes PUBs itself: a plain nats-py subscriber receives each message once,
    in order, with its bytes."""
    import nats

    monkeypatch.delenv(_clients.PATH_VARIABLE, raising=False)
    received: list[bytes] = []
    done = anyio.Event()

    async def collect(msg: Any) -> None:
        received.append(msg.data)
        if len(received) == 250:
            done.set()

    nc = await nats.connect(nats_broker.url)
    try:
        await nc.subscribe(topic, cb=collect)
        await nc.flush()
        async with pk.Producer(f"nats://{nats_broker.host_port}", topic=topic) as producer:
            assert producer.backend.client_path == "fast"
            await _produce_some(producer, 250)
        with anyio.fail_after(10):
            await done.wait()
    finally:
        await nc.close()
    assert received == [b"%d" % i for i in range(250)]


def test_errors_keep_the_client_exception_as_their_cause() -> None:
    import nats.errors
    from aiokafka import errors as kafka_errors

    from producerkit.backends.kafka import KAFKA
    from producerkit.backends.nats import NATS

    original = kafka_errors.RequestTimedOutError()
    translated = KAFKA.translate_error(original)
    assert isinstance(translated, pk.ProduceTimeout) and translated.__cause__ is original
    nats_original = nats.errors.ConnectionClosedError()
    nats_translated = NATS.translate_error(nats_original)
    assert isinstance(nats_translated, pk.BrokerUnavailable)
    assert nats_translated.__cause__ is nats_original


async def test_the_public_kafka_path_keeps_pipelining_without_spurious_timeouts(
    kafka_broker: LocalBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the throughput preset (5 batches per partition in flight) on aiokafka's send_batch(),
    batches queued behind each other in aiokafka timed out within seconds (1,387 of 200,000
    messages in one run): the public path keeps at most two per partition with aiokafka."""
    monkeypatch.setenv(_clients.PATH_VARIABLE, "public")
    count = 200_000

    async with pk.Producer(
        kafka_broker.url,
        topic=topic,
        preset="throughput",
        max_in_flight_messages=15_000,
        max_batch_size=256 * 1024,
    ) as producer:
        for i in range(count):
            await producer.produce(b"x" * 512, key=b"u%d" % (i % 10_000), nonblocking=True)
        await producer.flush()
        assert (producer.stats.acked, producer.stats.failed) == (count, 0)


async def test_no_overdue_probe_is_written_on_a_connection_that_is_closing() -> None:
    """An overdue Produce request's ApiVersions probe: nothing on a closing connection, and a
    write the transport refuses (uvloop raises on a closed handle) is the connection's end,
    not an error escaping the loop's timer (seen under load: a blackhole test failed so)."""
    from types import SimpleNamespace

    from producerkit.backends.kafka import _aiokafka_compat

    sent: list[object] = []

    def refusing_send(request: object) -> None:
        sent.append(request)
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

    def transport(closing: bool) -> Any:
        return SimpleNamespace(is_closing=lambda: closing)

    wire = _aiokafka_compat.ProduceWire(SimpleNamespace(client=None), 1, 30_000, "test")  # type: ignore[arg-type]
    closing = SimpleNamespace(
        _writer=SimpleNamespace(transport=transport(True)), send=refusing_send
    )
    wire._write_probe(closing)
    assert sent == []
    refused = SimpleNamespace(
        _writer=SimpleNamespace(transport=transport(False)), send=refusing_send
    )
    wire._write_probe(refused)  # raises nothing
    assert len(sent) == 1
