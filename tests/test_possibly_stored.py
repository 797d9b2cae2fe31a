"""Failed means not sent, or says it may be stored: a message whose deadline passes before it is
written to a connection is removed and never written (``Failure.possibly_stored`` is False); one
that was written and lost its answer says ``possibly_stored=True``. Checked by reading back, with
another client, what a broker behind a stalled link stored once the link recovered."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from conftest import read_jetstream, read_kafka

import producerkit as pk
from producerkit.backends import spec_for
from producerkit.testing.pytest_plugin import NatsSessionBroker, SessionBroker

pytestmark = pytest.mark.anyio


async def _failures(producer: pk.Producer) -> list[pk.Failure]:
    try:
        await producer.flush()
    except pk.ProduceError as caught:
        return caught.failures
    return []


async def _one_written_then_held(producer: pk.Producer, count: int) -> None:
    """One message written into the stalled link (alone in its batch), then ``count`` more,
    which wait in the producer: the producer has one batch per partition in flight
    (``max_batches_in_flight=1``; the idempotent default has five, which writes them too)."""
    await producer.produce(b"first", key=b"k", nonblocking=True)
    await anyio.sleep(0.1)  # its batch is written
    for number in range(count):
        await producer.produce(b"m-%d" % number, key=b"k", nonblocking=True)


async def test_kafka_expired_unsent_messages_are_never_written(
    kafka_broker: SessionBroker, topic: str
) -> None:
    """The held messages expire unwritten: they fail with ``possibly_stored=False`` and are not
    written after (the broker's stall ends later and stores only the first); the first fails
    as possibly stored, and is."""
    outcomes: list[Any] = []
    async with pk.Producer(
        kafka_broker.faulty_url,
        topic=topic,
        timeout=1.5,
        request_timeout_ms=10_000,  # the written request outlives the messages' deadlines
        on_outcome=outcomes.append,
        max_batches_in_flight=1,
    ) as producer:
        await producer.produce(b"warm-up", key=b"k")  # the topic's metadata, before the stall
        kafka_broker.faults.stall(3.0)
        await _one_written_then_held(producer, 300)
        failures = await _failures(producer)
        stats = producer.stats
        assert stats.acked + stats.failed == stats.produced == 302
        assert len(failures) == 301 == stats.failed
        never_written = {f.value for f in failures if not f.possibly_stored}
        assert never_written == {b"m-%d" % number for number in range(300)}
        assert all("never sent" in str(f.exception) for f in failures if not f.possibly_stored)
        assert [f.value for f in failures if f.possibly_stored] == [b"first"]
        assert {o.possibly_stored for o in outcomes if not o.acked} == {True, False}
        await anyio.sleep(2.5)  # the stall ends; what it held is delivered, and answered
    stored = {record["value"] for record in await read_kafka(kafka_broker.url, topic, 2)}
    assert not (never_written & stored)
    assert stored == {b"warm-up", b"first"}


async def test_jetstream_messages_written_before_their_ack_was_lost_say_so(
    nats_broker: NatsSessionBroker, topic: str
) -> None:
    """JetStream publishes as it is handed a message: a PubAck that does not come in time fails
    it as possibly stored, and it may indeed be stored when the link recovers. (The per-message
    path: fast ingest holds what its first batch may not write yet, see test_fast_ingest.py.)"""
    subject = topic.replace("-", "")
    async with pk.Producer(
        nats_broker.faulty_jetstream_url,
        topic=subject,
        timeout=1.0,
        create_stream=True,
        fast_ingest=False,
    ) as producer:
        await producer.produce(b"warm-up")
        nats_broker.faults.stall(3.0)
        for number in range(50):
            await producer.produce(b"m-%d" % number, nonblocking=True)
        failures = await _failures(producer)
    assert len(failures) == 50
    assert all(failure.possibly_stored for failure in failures)
    await anyio.sleep(2.5)
    stored = await read_jetstream(nats_broker.jetstream_url, subject, 1)
    assert len(stored) <= 51  # whatever arrived was among those said to be possibly stored


async def test_a_refused_message_is_not_stored(
    backend: Any, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the broker refuses (JetStream: an expectation that does not hold), or what a
    connection raises as it is handed a message, fails with ``possibly_stored=False``."""
    seen: list[pk.Failure] = []
    spec = spec_for(backend.url.split(":", 1)[0])
    if spec.takes_expectations:
        subject = topic.replace("-", "")
        async with pk.Producer(
            backend.url, topic=subject, on_error=seen.append, **backend.options
        ) as producer:
            await producer.produce(b"first", msg_id="a")
            await producer.produce(
                b"second", expect=pk.Expect(last_msg_id="not-a"), nonblocking=True
            )
            await _failures(producer)
    else:

        def refuse(self: Any, record: Any) -> None:
            raise ConnectionRefusedError("refused")

        monkeypatch.setattr(spec.connection, "send", refuse)
        async with pk.Producer(
            backend.url, topic=topic, on_error=seen.append, **backend.options
        ) as producer:
            await producer.produce(b"v", nonblocking=True)
            await _failures(producer)
    assert len(seen) == 1 and seen[0].possibly_stored is False


async def test_purged_unsent_messages_are_not_stored(
    kafka_broker: SessionBroker, topic: str
) -> None:
    async with pk.Producer(
        kafka_broker.faulty_url, topic=topic, timeout=10.0, max_batches_in_flight=1
    ) as producer:
        await producer.produce(b"warm-up", key=b"k")
        kafka_broker.faults.stall(2.0)
        await _one_written_then_held(producer, 199)
        purged = producer.purge()
        assert len(purged) == 200
        unsent = {failure.value for failure in purged if not failure.possibly_stored}
        assert unsent == {b"m-%d" % number for number in range(199)}
        assert [f.value for f in purged if f.possibly_stored] == [b"first"]
        await anyio.sleep(2.5)
    stored = {record["value"] for record in await read_kafka(kafka_broker.url, topic, 2)}
    assert not (unsent & stored)


def _on_the_fast_path(producer: pk.Producer) -> None:
    if producer.backend.client_path != "fast":
        pytest.skip(
            "on the public path aiokafka's sender owns connections, timeouts and retries: "
            "producerkit's hold of a late request is the fast path's"
        )


async def test_kafka_request_past_its_timeout_holds_its_partition_until_answered(
    kafka_broker: SessionBroker, topic: str
) -> None:
    """A Produce request unanswered past the request timeout (here the message timeout) keeps
    its connection, and its partition sends nothing more until it is answered: the messages
    behind it fail as never sent and are not written, and nothing stored afterwards lands ahead
    of the late request, so a key's stored messages keep the order they were produced in."""
    async with pk.Producer(
        kafka_broker.faulty_url, topic=topic, timeout=1.0, max_batches_in_flight=1
    ) as producer:
        await producer.produce(b"warm-up", key=b"k")
        _on_the_fast_path(producer)
        connections = kafka_broker.faults.connections
        kafka_broker.faults.stall(3.0)
        await _one_written_then_held(producer, 300)
        failures = await _failures(producer)
        assert kafka_broker.faults.connections == connections  # none closed, none opened
        never_written = {f.value for f in failures if not f.possibly_stored}
        assert never_written == {b"m-%d" % number for number in range(300)}
        assert [f.value for f in failures if f.possibly_stored] == [b"first"]
        await anyio.sleep(2.5)  # the stall ends and the late request is answered
        for number in range(100):
            await producer.produce(b"after-%d" % number, key=b"k", nonblocking=True)
        assert await _failures(producer) == []
    stored = [record["value"] for record in await read_kafka(kafka_broker.url, topic, 102)]
    assert stored == [b"warm-up", b"first", *(b"after-%d" % number for number in range(100))]


async def test_kafka_batch_waiting_for_its_connection_is_not_written_once_failed(
    kafka_broker: SessionBroker, topic: str
) -> None:
    """A batch that waits for its connection to open (the old one was reset, the new one is
    stalled) while its messages' deadlines pass: they fail as never sent, and when the
    connection opens at last they are not written."""
    async with pk.Producer(kafka_broker.faulty_url, topic=topic, timeout=1.0) as producer:
        await producer.produce(b"warm-up", key=b"k")
        _on_the_fast_path(producer)
        kafka_broker.faults.stall(3.0)
        kafka_broker.faults.reset()
        await anyio.sleep(0.2)  # the client sees its connection end
        for number in range(50):
            await producer.produce(b"m-%d" % number, key=b"k", nonblocking=True)
        failures = await _failures(producer)
        assert len(failures) == 50
        assert [f.value for f in failures if f.possibly_stored] == []
        await anyio.sleep(2.5)  # the stall ends; the connection opens
        await producer.produce(b"after", key=b"k")
    stored = [record["value"] for record in await read_kafka(kafka_broker.url, topic, 2)]
    assert stored == [b"warm-up", b"after"]


@pytest.mark.parametrize("fault", ["stall", "reset", "blackhole"])
async def test_batches_through_a_fault_are_stored_as_reported(
    kafka_broker: SessionBroker, topic: str, fault: str
) -> None:
    """produce_batch in chunks while the link stalls or drops everything for longer than the
    messages' timeout, or resets: every message is acked or failed (some of each, but for the
    reset, which is retried), every acked one is stored, none that failed as never sent is,
    and each key's first stored copies keep produce order (one batch per partition in
    flight)."""
    count, chunk = 4_000, 250
    values = [b"v%05d" % number for number in range(count)]
    keys = [b"k%d" % (number % 20) for number in range(count)]
    faults = kafka_broker.faults
    async with pk.Producer(kafka_broker.faulty_url, topic=topic, timeout=1.5) as producer:
        await producer.produce(b"warm-up", key=b"k")
        for start in range(0, count, chunk):
            if start == count // 4:
                if fault == "reset":
                    faults.reset()
                else:
                    getattr(faults, fault)(3.0)
            await producer.produce_batch(
                values[start : start + chunk], keys=keys[start : start + chunk]
            )
        failures = await _failures(producer)
        stats = producer.stats
        assert stats.acked + stats.failed == stats.produced == count + 1
        assert len(failures) == stats.failed
        assert (stats.failed > 0) == (fault != "reset")
        await anyio.sleep(2.0)  # the fault ends; what a stall held is delivered
    failed = {failure.value for failure in failures}
    never_sent = {failure.value for failure in failures if not failure.possibly_stored}
    records = await read_kafka(kafka_broker.url, topic, stats.acked)  # the warm-up's too
    stored = {record["value"] for record in records}
    assert set(values) - failed <= stored
    assert not (never_sent & stored)
    for key in set(keys):
        firsts = list(dict.fromkeys(r["value"] for r in records if r["key"] == key))
        assert firsts == sorted(firsts)
