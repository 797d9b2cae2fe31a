"""Kafka compression: each codec publishes 1,000 messages that another client reads back; an
unknown codec, or one whose library is missing, is refused when the Producer is built."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from conftest import read_kafka

import producerkit as pk
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
