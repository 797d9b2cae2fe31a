"""Kafka compression: each codec publishes 1,000 messages that another client reads back; an
unknown codec, or one whose library is missing, is refused when the Producer is built."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections.abc import Callable
from typing import Any

import pytest
from conftest import read_kafka

import producerkit as pk
from producerkit.backends.kafka import codecs
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_each_codec_is_read_back_by_another_client(
    codec: str, kafka_broker: SessionBroker, topic: str
) -> None:
    count = 1000

    async def main() -> list[dict[str, Any]]:
        async with pk.Producer(kafka_broker.url, topic=topic, compression_type=codec) as producer:
            for i in range(count):
                await producer.produce(b"order %d " % i * 4, key=b"k%d" % (i % 7), nonblocking=True)
            await producer.flush()
            assert (producer.stats.acked, producer.stats.failed) == (count, 0)
        return await read_kafka(kafka_broker.url, topic, count)

    values = sorted(record["value"] for record in await main())
    assert values == sorted(b"order %d " % i * 4 for i in range(count))


def test_an_unknown_codec_is_refused_at_construction() -> None:
    with pytest.raises(pk.ConfigurationError, match="unknown compression_type 'brotli'"):
        pk.Producer("kafka://127.0.0.1:9092", topic="t", compression_type="brotli")


def test_a_codec_whose_library_is_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "cramjam" else real(name, *a)
    )
    with pytest.raises(pk.MissingDependencyError, match=r"cramjam.*producerkit\[kafka\]"):
        pk.Producer("kafka://127.0.0.1:9092", topic="t", compression_type="zstd")
    pk.Producer("kafka://127.0.0.1:9092", topic="t", compression_type="gzip")  # the stdlib's


def _compress_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("producerkit-compress")]


def _compresses_on_a_thread(producer: pk.Producer, codec: str) -> bool:
    """On the fast path, for gzip and zstd; on the public path aiokafka's builder compresses."""
    return producer.backend.client_path == "fast" and codecs.compresses_off_the_loop(codec)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_full_batches_read_back_whole_and_in_order_per_key(
    codec: str, kafka_broker: SessionBroker, topic: str
) -> None:
    """Batches of 256 KiB and more, compressed on the connection's thread for gzip and zstd (on
    the loop for snappy and lz4): every message read back, each key's in the order produced."""
    count, keys = 20_000, 13
    earlier = set(_compress_threads())  # another test's, still ending
    async with pk.Producer(
        kafka_broker.url, topic=topic, compression_type=codec, preset="throughput"
    ) as producer:
        for i in range(count):
            await producer.produce(b"%06d " % i * 50, key=b"k%d" % (i % keys), nonblocking=True)
        threads = set(_compress_threads()) - earlier
        await producer.flush()
        assert (producer.stats.acked, producer.stats.failed) == (count, 0)
        assert bool(threads) is _compresses_on_a_thread(producer, codec)
    records = await read_kafka(kafka_broker.url, topic, count)
    assert len(records) == count
    by_key: dict[bytes, list[int]] = {}
    for record in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        by_key.setdefault(record["key"], []).append(int(record["value"][:6]))
    assert sorted(n for numbers in by_key.values() for n in numbers) == list(range(count))
    assert all(numbers == sorted(numbers) for numbers in by_key.values())


async def test_a_compressor_failing_on_its_thread_fails_its_batch_only(
    kafka_broker: SessionBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failing batch's messages fail with the compressor's error as their cause, as never
    stored; the batches around it are acked, and the producer goes on."""
    made: list[int] = []
    real = codecs.compressor

    def compressor(codec: str, level: int | None) -> Callable[[Any], Any]:
        compress = real(codec, level)
        made.append(1)
        if len(made) == 1:  # the loop's own; the second is the thread's
            return compress
        calls: list[int] = []

        def failing_once(section: Any) -> Any:
            calls.append(1)
            if len(calls) == 2:
                raise ValueError("this compressor broke")
            return compress(section)

        return failing_once

    monkeypatch.setattr(codecs, "compressor", compressor)
    failures: list[pk.Failure] = []
    count = 6000
    async with pk.Producer(
        kafka_broker.url,
        topic=topic,
        compression_type="gzip",
        on_error=failures.append,
    ) as producer:
        if not _compresses_on_a_thread(producer, "gzip"):
            pytest.skip("on the public path aiokafka's batch builder compresses")
        for i in range(count):  # one key: one partition, its batches compressed in turn
            await producer.produce(b"%06d " % i * 50, key=b"k", nonblocking=True)
        with pytest.raises(pk.ProduceError):
            await producer.flush()
        stats = producer.stats
        assert stats.acked + stats.failed == count
        assert 0 < stats.failed < count and len(failures) == stats.failed
        assert all(not failure.possibly_stored for failure in failures)
        causes = {repr(failure.exception.__cause__) for failure in failures}
        assert causes == {repr(ValueError("this compressor broke"))}
        await producer.produce(b"after", nonblocking=False)  # still usable
    records = await read_kafka(kafka_broker.url, topic, count - len(failures) + 1)
    assert len(records) == count - len(failures) + 1


@pytest.mark.parametrize("ending", ["close", "purge"])
async def test_ending_while_batches_compress_accounts_for_every_message(
    ending: str, kafka_broker: SessionBroker, topic: str
) -> None:
    """With batches still on the compression thread, ``close()`` waits for them and they are
    acked; ``purge()`` fails them at once. Either way each message is reported exactly once,
    also after the thread hands back a batch that was purged."""
    count = 20_000
    earlier = set(_compress_threads())
    outcomes: list[bool] = []
    producer = pk.Producer(
        kafka_broker.url,
        topic=topic,
        compression_type="gzip",
        max_in_flight_messages=count,
        on_delivery=lambda result, context: outcomes.append(isinstance(result, pk.Delivery)),
    )
    async with producer:
        for i in range(count):
            await producer.produce(b"%06d " % i * 50, nonblocking=True)
        threads = set(_compress_threads()) - earlier
        assert bool(threads) is _compresses_on_a_thread(producer, "gzip")
        if ending == "purge":
            purged = producer.purge()
            assert any(not failure.possibly_stored for failure in purged)
            await producer.flush()
            await producer.produce(b"after", nonblocking=False)
            count += 1
    stats = producer.stats
    assert stats.acked + stats.failed == count == len(outcomes)
    assert (stats.failed > 0) is (ending == "purge")
    await asyncio.sleep(0.2)  # anything the thread still hands back finds the producer closed
    assert len(outcomes) == count
