"""JetStream fast ingest (ADR-50 fast batches, ``producerkit.backends.nats.fast_ingest``).

Against the session's nats-server (2.14+ has fast batches): a stream that allows them gets
every message once, in order, each Delivery with its stream sequence; ids, expectations,
headers, ``produce_batch`` and atomic batches keep working; a stream that does not allow them
keeps the per-message PubAcks; and through the fault proxy every message ends acked or failed,
with ``possibly_stored`` False only for what the stream does not hold.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from conftest import ON_THE_PUBLIC_PATH, read_jetstream

import producerkit as pk
from producerkit._spool import read_spool
from producerkit.backends.nats import fast_ingest
from producerkit.backends.nats.jetstream import JetStreamConnection, _covers_partitions
from producerkit.backends.nats.pubacks import batch_puback, flow_ack, flow_notice
from producerkit.testing.pytest_plugin import NatsSessionBroker

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.brokers,
    pytest.mark.skipif(
        ON_THE_PUBLIC_PATH,
        reason="fast batches are written on producerkit's own path; nats-py's public API "
        "publishes one PubAck each (today's path, tested by the other JetStream tests)",
    ),
]


class Ledger:
    """Each message's outcome by its ``context`` (from ``on_delivery``)."""

    def __init__(self) -> None:
        self.acked: dict[Any, pk.Delivery] = {}
        self.failed: dict[Any, pk.Failure] = {}

    def __call__(self, result: pk.Delivery | pk.Failure, context: Any) -> None:
        if context is None:
            return
        assert context not in self.acked and context not in self.failed, "told twice"
        if isinstance(result, pk.Failure):
            self.failed[context] = result
        else:
            self.acked[context] = result


def accounted(producer: pk.Producer, produced: int) -> None:
    stats = producer.stats
    assert stats.produced == produced
    assert stats.in_flight == 0
    assert stats.acked + stats.failed == stats.produced


async def flushed(producer: pk.Producer) -> list[pk.Failure]:
    try:
        await producer.flush()
    except pk.ProduceError as caught:
        return caught.failures
    return []


async def stored(url: str, subject: str, expected: int) -> dict[bytes, int]:
    """Every value in the stream, with its stream sequence; each value once."""
    records = await read_jetstream(url, subject, expected)
    values = [record["value"] for record in records]
    assert len(values) >= expected, f"{len(values)} of the {expected} messages expected are there"
    assert len(values) == len(set(values)), "a message was stored twice"
    return {record["value"]: record["offset"] for record in records}


def offsets_hold(ledger: Ledger, in_stream: dict[bytes, int]) -> int:
    """Every acked message is stored at the offset its Delivery gave (where it gave one);
    how many gave none."""
    unknown = 0
    for value, delivery in ledger.acked.items():
        if delivery.duplicate:  # not stored again: its offset is the original's
            assert delivery.offset in in_stream.values()
            continue
        assert value in in_stream, f"{value!r} acked but not stored"
        if delivery.offset is None:
            unknown += 1
        else:
            assert delivery.offset == in_stream[value], value
    return unknown


def nothing_unstored_is_there(ledger: Ledger, in_stream: dict[bytes, int]) -> None:
    for value, failure in ledger.failed.items():
        if not failure.possibly_stored:
            assert value not in in_stream, f"{value!r} said not stored, but it is"


@pytest.fixture
async def plain_nats(nats_broker: NatsSessionBroker) -> AsyncIterator[Any]:
    """A plain nats-py client on the session broker (for streams made by hand)."""
    import nats

    client = await nats.connect(nats_broker.url)
    try:
        yield client
    finally:
        await client.close()


# --------------------------------------------------------------------------- replies, no broker


def test_reply_subjects_and_payloads_are_read() -> None:
    assert fast_ingest.fast_reply(b"ab12.250.fail.17.1.$FI") == (b"ab12", 17, 1)
    assert fast_ingest.fast_reply(b"17") is None
    assert fast_ingest.fast_reply(b"a.250.fail.x.1.$FI") is None
    assert flow_ack(b'{"type":"ack","seq":500,"msgs":250}') == (500, 250)
    assert flow_ack(b'{"type": "ack", "msgs": 10, "seq": 3}') == (3, 10)
    assert flow_ack(b'{"stream":"S","seq":3}') is None
    assert flow_notice(b'{"type":"gap","last_seq":10,"seq":15}') == ("gap", 15)
    assert flow_notice(b'{"type":"err","seq":3,"error":{"err_code":10071}}') == ("err", 3)
    assert flow_notice(b'{"type":"ack","seq":3,"msgs":1}') is None
    assert batch_puback(b'{"stream":"S","seq":252,"batch":"abc","count":251}') == (252, 251)
    assert batch_puback(b'{"stream":"S","seq":9}') is None
    assert batch_puback(b'{"error":{"err_code":10208},"stream":"S","seq":0,"count":1}') is None


@pytest.mark.parametrize(
    ("patterns", "covered"),
    [
        (["orders", "orders.>"], True),
        (["orders.*"], True),
        ([">"], True),
        (["*.*"], True),
        (["orders.0", "orders.1"], False),
        (["orders"], False),
        (["orders.*.x"], False),
        (["other.>"], False),
    ],
)
def test_a_partitioned_topic_needs_a_stream_with_every_partition(
    patterns: list[str], covered: bool
) -> None:
    assert _covers_partitions(patterns, "orders") is covered


# --------------------------------------------------------------------------- the fast path


async def test_every_message_once_in_order_with_its_stream_sequence(
    nats_broker: NatsSessionBroker, topic: str
) -> None:
    ledger = Ledger()
    count = 5_000
    async with pk.Producer(
        nats_broker.jetstream_url, topic=topic, create_stream=True, on_delivery=ledger
    ) as producer:
        first = await producer.produce(b"first")
        assert first.offset == 1
        assert producer.backend.fast_ingest_topics == {topic: topic}
        for number in range(count):
            headers = {"n": b"%d" % number} if number % 7 == 0 else None
            value = b"m-%d" % number
            await producer.produce(value, headers=headers, nonblocking=True, context=value)
        assert await flushed(producer) == []
        accounted(producer, count + 1)
        assert producer.backend.fast_ingest_acked == count
    assert [ledger.acked[b"m-%d" % n].offset for n in range(count)] == list(range(2, count + 2))
    records = await read_jetstream(nats_broker.jetstream_url, topic, count + 1)
    assert [record["value"] for record in records] == [
        b"first",
        *(b"m-%d" % n for n in range(count)),
    ]
    assert [record["offset"] for record in records] == list(range(1, count + 2))
    assert records[1 + 14]["headers"] == {"n": "14"}


async def test_produce_batch_goes_in_fast_batches(
    nats_broker: NatsSessionBroker, topic: str
) -> None:
    ledger = Ledger()
    values = [b"b-%d" % number for number in range(3_000)]
    async with pk.Producer(
        nats_broker.jetstream_url, topic=topic, create_stream=True, on_delivery=ledger
    ) as producer:
        await producer.produce_batch(values, keys=[b"k%d" % (n % 10) for n in range(3_000)],
                                     contexts=values)  # fmt: skip
        assert await flushed(producer) == []
        assert producer.backend.fast_ingest_acked == 3_000
    in_stream = await stored(nats_broker.jetstream_url, topic, 3_000)
    assert list(in_stream) == values
    assert offsets_hold(ledger, in_stream) == 0


async def test_a_partitioned_topic_is_one_lane(nats_broker: NatsSessionBroker, topic: str) -> None:
    ledger = Ledger()
    async with pk.Producer(
        nats_broker.jetstream_url,
        topic=topic,
        create_stream=True,
        partitions=4,
        on_delivery=ledger,
    ) as producer:
        for number in range(2_000):
            value = b"p-%d" % number
            await producer.produce(value, key=b"k%d" % (number % 13), nonblocking=True,
                                   context=value)  # fmt: skip
        assert await flushed(producer) == []
        assert producer.backend.fast_ingest_acked == 2_000
    in_stream = await stored(nats_broker.jetstream_url, f"{topic}.>", 2_000)
    assert offsets_hold(ledger, in_stream) == 0
    assert {delivery.partition for delivery in ledger.acked.values()} == {0, 1, 2, 3}


async def test_msg_ids_and_expectations_go_one_pubAck_each_in_order(
    nats_broker: NatsSessionBroker, topic: str
) -> None:
    """A fast batch cannot report a duplicate, and a failed expectation would end it: those
    messages take the per-message path, in the order produced, between fast batches."""
    ledger = Ledger()
    async with pk.Producer(
        nats_broker.jetstream_url, topic=topic, create_stream=True, on_delivery=ledger
    ) as producer:
        await producer.produce(b"a0")  # sequence 1

        async def plain(prefix: bytes) -> None:
            for number in range(50):
                value = prefix + b"%d" % number
                await producer.produce(value, nonblocking=True, context=value)

        await plain(b"p")  # 2 ... 51
        await producer.produce(b"id-1", msg_id="x", nonblocking=True, context=b"id-1")  # 52
        await producer.produce(b"id-1-again", msg_id="x", nonblocking=True, context=b"again")
        await plain(b"q")  # 53 ... 102
        ok = pk.Expect(last_subject_sequence=102)
        await producer.produce(b"exp-ok", expect=ok, nonblocking=True, context=b"exp-ok")  # 103
        bad = pk.Expect(last_subject_sequence=1)
        await producer.produce(b"exp-bad", expect=bad, nonblocking=True, context=b"exp-bad")
        await plain(b"r")  # 104 ... 153
        failures = await flushed(producer)
        accounted(producer, 155)
        assert producer.backend.fast_ingest_acked == 150
    assert [failure.value for failure in failures] == [b"exp-bad"]
    assert isinstance(failures[0].exception, pk.ExpectationFailed)
    assert failures[0].possibly_stored is False
    again = ledger.acked[b"again"]
    assert again.duplicate and again.offset == 52
    assert ledger.acked[b"id-1"].offset == 52
    assert ledger.acked[b"exp-ok"].offset == 103
    assert ledger.acked[b"r49"].offset == 153
    in_stream = await stored(nats_broker.jetstream_url, topic, 153)
    assert offsets_hold(ledger, in_stream) == 0
    assert list(in_stream) == [
        b"a0",
        *(b"p%d" % n for n in range(50)),
        b"id-1",
        *(b"q%d" % n for n in range(50)),
        b"exp-ok",
        *(b"r%d" % n for n in range(50)),
    ]


async def test_a_stream_that_does_not_allow_it_keeps_per_message_pubacks(
    nats_broker: NatsSessionBroker, plain_nats: Any, topic: str
) -> None:
    js = plain_nats.jetstream()
    await js.add_stream(name=topic, subjects=[topic])
    ledger = Ledger()
    async with pk.Producer(nats_broker.jetstream_url, topic=topic, on_delivery=ledger) as producer:
        for number in range(500):
            await producer.produce(b"v-%d" % number, nonblocking=True, context=b"v-%d" % number)
        assert await flushed(producer) == []
        assert producer.backend.fast_ingest_topics == {}
        assert producer.backend.fast_ingest_acked == 0
    in_stream = await stored(nats_broker.jetstream_url, topic, 500)
    assert offsets_hold(ledger, in_stream) == 0


async def test_an_existing_stream_is_asked_and_fast_ingest_false_turns_it_off(
    nats_broker: NatsSessionBroker, plain_nats: Any, topic: str
) -> None:
    js = plain_nats.jetstream()
    await js.add_stream(name=topic, subjects=[topic], allow_batched=True)
    await js.publish(topic, b"before")  # the lane's anchor is the stream's last sequence
    ledger = Ledger()
    async with pk.Producer(nats_broker.jetstream_url, topic=topic, on_delivery=ledger) as producer:
        for number in range(300):
            await producer.produce(b"a-%d" % number, nonblocking=True, context=b"a-%d" % number)
        assert await flushed(producer) == []
        assert producer.backend.fast_ingest_acked == 300
    async with pk.Producer(
        f"{nats_broker.jetstream_url}?fast_ingest=false", topic=topic, on_delivery=ledger
    ) as producer:
        for number in range(300):
            await producer.produce(b"b-%d" % number, nonblocking=True, context=b"b-%d" % number)
        assert await flushed(producer) == []
        assert producer.backend.fast_ingest_topics == {}
    in_stream = await stored(nats_broker.jetstream_url, topic, 601)
    assert offsets_hold(ledger, in_stream) == 0
    assert ledger.acked[b"a-0"].offset == 2


async def test_other_writers_interleaving_never_give_a_wrong_offset(
    nats_broker: NatsSessionBroker, topic: str
) -> None:
    """Two producers write one stream at once: a fast batch another writer interleaved with
    gives its messages no offset (but its last), never a wrong one."""
    ledger = Ledger()
    options: dict[str, Any] = {"topic": topic, "create_stream": True, "on_delivery": ledger}
    async with (
        pk.Producer(nats_broker.jetstream_url, **options) as one,
        pk.Producer(nats_broker.jetstream_url, **options) as two,
    ):
        await one.produce(b"warm-up")
        await two.produce(b"warm-up-2")

        async def write(producer: pk.Producer, name: bytes) -> None:
            for burst in range(30):
                for number in range(100):
                    value = b"%s-%d-%d" % (name, burst, number)
                    await producer.produce(value, nonblocking=True, context=value)
                await anyio.sleep(0)

        async with anyio.create_task_group() as group:
            group.start_soon(write, one, b"one")
            group.start_soon(write, two, b"two")
        assert await flushed(one) == []
        assert await flushed(two) == []
    in_stream = await stored(nats_broker.jetstream_url, topic, 6_002)
    assert len(ledger.acked) == 6_000
    unknown = offsets_hold(ledger, in_stream)
    assert unknown < 6_000


async def test_atomic_batches_beside_fast_ingest(
    nats_broker: NatsSessionBroker, topic: str
) -> None:
    ledger = Ledger()
    async with pk.Producer(
        nats_broker.jetstream_url,
        topic=topic,
        create_stream=True,
        allow_atomic=True,
        on_delivery=ledger,
    ) as producer:
        for number in range(200):
            await producer.produce(b"f-%d" % number, nonblocking=True, context=b"f-%d" % number)
        async with producer.atomic_batch() as batch:
            for number in range(20):
                await batch.produce(b"atomic-%d" % number)
        for number in range(200):
            await producer.produce(b"g-%d" % number, nonblocking=True, context=b"g-%d" % number)
        assert await flushed(producer) == []
        accounted(producer, 420)
        assert producer.backend.fast_ingest_acked == 400
    in_stream = await stored(nats_broker.jetstream_url, topic, 420)
    assert list(in_stream) == [
        *(b"f-%d" % n for n in range(200)),
        *(b"atomic-%d" % n for n in range(20)),
        *(b"g-%d" % n for n in range(200)),
    ]
    assert offsets_hold(ledger, in_stream) == 0


async def test_a_message_too_large_for_the_stream_goes_on_its_own(
    nats_broker: NatsSessionBroker, plain_nats: Any, topic: str
) -> None:
    """A message larger than the stream's max_msg_size would be refused and end its fast
    batch: it takes the per-message path and fails alone, not stored."""
    js = plain_nats.jetstream()
    await js.add_stream(name=topic, subjects=[topic], allow_batched=True, max_msg_size=1_000)
    ledger = Ledger()
    async with pk.Producer(
        nats_broker.jetstream_url, topic=topic, on_delivery=ledger, timeout=10
    ) as producer:
        for number in range(300):
            value = b"s-%d" % number
            if number == 120:
                value = b"big-" + b"x" * 2_000
            await producer.produce(value, nonblocking=True, context=value)
        failures = await flushed(producer)
        accounted(producer, 300)
        assert producer.backend.fast_ingest_acked == 299
    assert [failure.value[:4] for failure in failures] == [b"big-"]
    assert failures[0].possibly_stored is False
    assert isinstance(failures[0].exception, pk.MessageTooLarge)
    in_stream = await stored(nats_broker.jetstream_url, topic, 299)
    assert list(in_stream) == [b"s-%d" % n for n in range(300) if n != 120]
    assert offsets_hold(ledger, in_stream) == 0


async def test_a_full_stream_ends_the_fast_batch_and_nothing_after_is_stored(
    nats_broker: NatsSessionBroker, plain_nats: Any, topic: str
) -> None:
    """A stream that refuses new messages (max_msgs, discard new) refuses one in a fast batch:
    the server ends the batch there, the message fails with the server's error, and every
    message after it fails too, not stored (sent again on its own where nothing of the lane was
    written after it, else failed at once so that nothing is stored out of order)."""
    from nats.js.api import DiscardPolicy

    js = plain_nats.jetstream()
    await js.add_stream(
        name=topic, subjects=[topic], allow_batched=True, max_msgs=100, discard=DiscardPolicy.NEW
    )
    ledger = Ledger()
    async with pk.Producer(
        nats_broker.jetstream_url, topic=topic, on_delivery=ledger, timeout=10
    ) as producer:
        for number in range(600):
            await producer.produce(b"s-%d" % number, nonblocking=True, context=b"s-%d" % number)
        failures = await flushed(producer)
        accounted(producer, 600)
    assert len(failures) == 500
    assert not any(failure.possibly_stored for failure in failures)
    assert all(isinstance(failure.exception, pk.ProducerkitError) for failure in failures)
    assert sorted(ledger.acked) == sorted(b"s-%d" % n for n in range(100))
    in_stream = await stored(nats_broker.jetstream_url, topic, 100)
    assert list(in_stream) == [b"s-%d" % n for n in range(100)]
    assert offsets_hold(ledger, in_stream) == 0


async def test_the_spool_takes_what_a_fast_batch_failed_and_replay_stores_it_once(
    nats_broker: NatsSessionBroker, plain_nats: Any, topic: str, tmp_path: Path
) -> None:
    """A full stream refuses 200 of 300 messages written in fast batches: they go to the spool,
    not stored; once the stream has room, ``producerkit replay`` (fast batches too) stores each
    of them once and empties the spool."""
    from nats.js.api import DiscardPolicy

    js = plain_nats.jetstream()
    config = await js.add_stream(
        name=topic, subjects=[topic], allow_batched=True, max_msgs=100, discard=DiscardPolicy.NEW
    )
    spool = tmp_path / "failed.spool"
    async with pk.Producer(nats_broker.jetstream_url, topic=topic, spool=str(spool)) as producer:
        for number in range(300):
            await producer.produce(b"v-%d" % number, nonblocking=True)
        assert len(await flushed(producer)) == 200
        assert producer.backend.fast_ingest_acked == 100
    lines = list(read_spool(spool))
    assert len(lines) == 200
    assert not any(line[2].possibly_stored for line in lines)
    config.config.max_msgs = 1_000
    await js.update_stream(config.config)
    done = await anyio.run_process(
        [sys.executable, "-m", "producerkit", "replay", str(spool), "--url",
         nats_broker.jetstream_url],
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert spool.read_bytes() == b""
    in_stream = await stored(nats_broker.jetstream_url, topic, 300)
    assert sorted(in_stream) == sorted(b"v-%d" % n for n in range(300))


def drop_one_message(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the first long run written into a fast batch lose one message on the way (its
    number is kept: the server sees a gap). The dropped message's batch number, once dropped."""
    dropped: list[int] = []
    write_run = JetStreamConnection.write_run

    def losing(
        self: JetStreamConnection, records: list[Any], prefix: bytes, first: int, last_op: int
    ) -> None:
        if dropped or len(records) < 20:
            write_run(self, records, prefix, first, last_op)
            return
        dropped.append(first + 10)
        write_run(self, records[:10], prefix, first, fast_ingest.APPEND)
        write_run(self, records[11:], prefix, first + 11, last_op)

    monkeypatch.setattr(JetStreamConnection, "write_run", losing)
    return dropped


async def test_a_lost_message_ends_its_batch_and_the_rest_is_sent_again(
    nats_broker: NatsSessionBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server sees a gap: it ends the batch before it (a gap notice, then the PubAck of
    what it stored). Nothing was written after the batch, so the lost message and those after
    it are sent again, one PubAck each: every message stored once, in order."""
    dropped = drop_one_message(monkeypatch)
    ledger = Ledger()
    async with pk.Producer(
        nats_broker.jetstream_url, topic=topic, create_stream=True, on_delivery=ledger
    ) as producer:
        for number in range(200):
            await producer.produce(b"m-%d" % number, nonblocking=True, context=b"m-%d" % number)
        assert await flushed(producer) == []
        accounted(producer, 200)
        assert producer.backend.fast_ingest_acked == dropped[0] - 1
    in_stream = await stored(nats_broker.jetstream_url, topic, 200)
    assert list(in_stream) == [b"m-%d" % n for n in range(200)]
    assert offsets_hold(ledger, in_stream) == 0


async def test_a_lost_message_with_later_batches_written_fails_what_followed_it(
    nats_broker: NatsSessionBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but the next batch was written before the PubAck came: the lost message and
    the rest of its batch fail, not stored (sent again they would land after later ones)."""
    dropped = drop_one_message(monkeypatch)
    ledger = Ledger()
    async with pk.Producer(
        nats_broker.jetstream_url, topic=topic, create_stream=True, on_delivery=ledger
    ) as producer:
        for number in range(700):
            await producer.produce(b"m-%d" % number, nonblocking=True, context=b"m-%d" % number)
        failures = await flushed(producer)
        accounted(producer, 700)
    lost = dropped[0] - 1  # the records' index of the lost message
    assert [failure.value for failure in failures] == [
        b"m-%d" % n for n in range(lost, fast_ingest.ACK_INTERVAL)
    ]
    assert not any(failure.possibly_stored for failure in failures)
    in_stream = await stored(nats_broker.jetstream_url, topic, 700 - len(failures))
    assert list(in_stream) == [
        b"m-%d" % n for n in range(700) if not lost <= n < fast_ingest.ACK_INTERVAL
    ]
    assert offsets_hold(ledger, in_stream) == 0


# --------------------------------------------------------------------------- faults


async def test_a_stall_delivers_every_fast_batch_late(
    nats_broker: NatsSessionBroker, topic: str
) -> None:
    ledger = Ledger()
    async with pk.Producer(
        nats_broker.faulty_jetstream_url,
        topic=topic,
        create_stream=True,
        timeout=10,
        on_delivery=ledger,
    ) as producer:
        for number in range(300):  # a first fast batch: the ack interval is granted
            await producer.produce(b"w-%d" % number, nonblocking=True, context=b"w-%d" % number)
        assert await flushed(producer) == []
        nats_broker.faults.stall(1.5)
        started = time.monotonic()
        for number in range(1_000):
            await producer.produce(b"m-%d" % number, nonblocking=True, context=b"m-%d" % number)
        assert await flushed(producer) == []
        assert 1.3 <= time.monotonic() - started < 9
        accounted(producer, 1_300)
        assert producer.backend.fast_ingest_acked == 1_300
    in_stream = await stored(nats_broker.jetstream_url, topic, 1_300)
    assert offsets_hold(ledger, in_stream) == 0


async def test_a_blackhole_fails_each_message_at_its_deadline(
    nats_broker: NatsSessionBroker, topic: str
) -> None:
    """Nothing comes back: every message fails at its own deadline, ProduceTimeout; what the
    lane never wrote says not stored; then the lane recovers."""
    ledger = Ledger()
    timeout = 1.0
    async with pk.Producer(
        nats_broker.faulty_jetstream_url,
        topic=topic,
        create_stream=True,
        timeout=timeout,
        on_delivery=ledger,
    ) as producer:
        await producer.produce(b"warm-up")
        nats_broker.faults.blackhole(2.5)
        started = time.monotonic()
        for number in range(300):  # the lane's first fast batch: it waits for its first reply
            await producer.produce(b"m-%d" % number, nonblocking=True, context=b"m-%d" % number)
        failures = await flushed(producer)
        assert time.monotonic() - started < timeout + 2
        assert len(failures) == 300
        assert all(isinstance(failure.exception, pk.ProduceTimeout) for failure in failures)
        assert {failure.possibly_stored for failure in failures} == {True, False}
        accounted(producer, 301)
        while "blackhole" in nats_broker.faults.log.active():
            await anyio.sleep(0.05)
        deadline = time.monotonic() + 20
        while True:  # the lane goes on once the server answers again
            burst = [b"after-%d-%d" % (time.monotonic_ns(), n) for n in range(50)]
            for value in burst:
                await producer.produce(value, nonblocking=True, context=value)
            if not await flushed(producer):
                break
            assert time.monotonic() < deadline, "the lane did not recover"
            await anyio.sleep(0.2)
        assert producer.backend.fast_ingest_acked >= 50
    in_stream = await stored(nats_broker.jetstream_url, topic, len(ledger.acked) + 1)
    nothing_unstored_is_there(ledger, in_stream)
    offsets_hold(ledger, in_stream)


async def test_a_reset_mid_flow_leaves_every_message_accounted_once(
    nats_broker: NatsSessionBroker, topic: str
) -> None:
    """Connections are reset while fast batches flow: each message ends acked (and stored, at
    the offset it was given) or failed (and, where said not stored, not in the stream); none
    is stored twice; the flow goes on after the reconnect."""
    ledger = Ledger()
    async with pk.Producer(
        nats_broker.faulty_jetstream_url,
        topic=topic,
        create_stream=True,
        timeout=3,
        on_delivery=ledger,
    ) as producer:
        await producer.produce(b"warm-up")
        produced = 1
        for burst in range(60):
            if burst == 20:
                nats_broker.faults.reset()
            for number in range(200):
                value = b"m-%d-%d" % (burst, number)
                await producer.produce(value, nonblocking=True, context=value)
                produced += 1
            await anyio.sleep(0.01)
        await flushed(producer)
        accounted(producer, produced)
        after = [value for value in ledger.acked if value.startswith(b"m-5")]
        assert len(after) >= 1_000  # bursts 50-59, long after the reset
    in_stream = await stored(nats_broker.jetstream_url, topic, len(ledger.acked) + 1)
    nothing_unstored_is_there(ledger, in_stream)
    offsets_hold(ledger, in_stream)


async def test_kill_and_restart_keep_every_message_accounted(
    private_nats_broker: NatsSessionBroker, topic: str
) -> None:
    broker = private_nats_broker
    ledger = Ledger()
    async with pk.Producer(
        broker.faulty_jetstream_url,
        topic=topic,
        timeout=5,
        create_stream=True,
        stream_storage="file",
        on_delivery=ledger,
    ) as producer:
        for number in range(500):
            await producer.produce(b"before-%d" % number, nonblocking=True,
                                   context=b"before-%d" % number)  # fmt: skip
        assert await flushed(producer) == []
        for number in range(2_000):
            await producer.produce(b"mid-%d" % number, nonblocking=True,
                                   context=b"mid-%d" % number)  # fmt: skip
            if number == 1_000:
                broker.faults.kill()
        await anyio.sleep(0.3)
        for number in range(300):
            await producer.produce(b"down-%d" % number, nonblocking=True,
                                   context=b"down-%d" % number)  # fmt: skip
        await anyio.to_thread.run_sync(broker.faults.restart)
        await flushed(producer)
        accounted(producer, 2_800)
    in_stream = await stored(broker.jetstream_url, topic, len(ledger.acked))
    assert {b"before-%d" % n for n in range(500)} <= set(in_stream)
    nothing_unstored_is_there(ledger, in_stream)
    offsets_hold(ledger, in_stream)


class _Host:
    """A lane's connection, recording what the lane asks of it (no server)."""

    timeout = 5.0

    def __init__(self) -> None:
        self.reports = _Reports()
        self.chunks: dict[bytes, fast_ingest.Chunk] = {}
        self.runs: list[tuple[int, int, int]] = []  # (first number, records, last op)
        self.controls: list[str] = []
        self.electing: list[int] = []
        self.singles: list[int] = []

    def writable(self) -> bool:
        return True

    def write_run(self, records: list[Any], prefix: bytes, first: int, last_op: int) -> None:
        self.runs.append((first, len(records), last_op))

    def write_control(self, subject: str, reply: str) -> None:
        self.controls.append(reply)

    def send_one(self, record: Any) -> None:
        self.singles.append(record.seq)

    def wait_out_election(self, record: Any) -> bool:
        self.electing.append(record.seq)
        return True

    def fast_reply_prefix(self) -> str:
        return "_FI."

    def subject(self, record: Any) -> str:
        return str(record.topic)


class _Reports:
    def __init__(self) -> None:
        self.pending: dict[int, Any] = {}
        self.failures: list[tuple[int, bool]] = []

    def failed(self, record: Any, error: BaseException, possibly_stored: bool = True) -> None:
        self.pending.pop(record.seq, None)
        self.failures.append((record.seq, possibly_stored))


async def test_a_503_to_a_ping_of_a_one_message_chunk_is_no_election_answer() -> None:
    """A chunk whose first message went unanswered (its leader died holding it, which may have
    stored it) is pinged with number 1. No leader hearing the ping (503) says nothing of that
    message: the chunk is pinged again, its record is not taken as unstored and sent on the
    per-message path, as a 503 to the message itself would be."""
    from producerkit._record import Record

    host = _Host()
    lane = fast_ingest.Lane(host, "S", anchor=None)  # type: ignore[arg-type]
    deadline = time.monotonic() + 60
    records = [
        Record(seq, b"v", None, "orders", None, None, None, deadline, 0, None, None)
        for seq in range(1, fast_ingest.MIN_CHUNK + 1)
    ]
    for record in records:
        host.reports.pending[record.seq] = record
        lane.queue.append(record)
    lane.drain()
    chunk = lane.chunk
    assert chunk is not None and host.runs == [(1, 1, fast_ingest.APPEND)]
    assert chunk.written == 1  # the lane's first chunk waits for its first reply

    lane.on_reply(chunk, 1, fast_ingest.PING, b"", {"Status": "503"})
    assert host.electing == []  # before: its record waited out an "election" ...
    assert chunk.key in lane.unsettled  # ... and the chunk was dropped as if nothing was stored
    assert host.reports.failures == [] and host.singles == []

    lane.on_reply(chunk, 1, fast_ingest.START, b"", {"Status": "503"})
    assert host.electing == [1]  # the message's own 503: nothing of the chunk was stored
    assert chunk.key not in lane.unsettled
