"""Names renamed for one meaning each still work for one release, with a DeprecationWarning that
names the new one."""

from __future__ import annotations

import asyncio
import importlib

import pytest

import producerkit as pk
from producerkit import settings


def test_concurrent_task_limit_is_max_in_flight_messages() -> None:
    with pytest.warns(DeprecationWarning, match="use max_in_flight_messages"):
        producer = pk.Producer("memory://", topic="t", concurrent_task_limit=7)

    async def main() -> None:
        async with producer:
            for _ in range(20):
                await producer.produce(b"v", nonblocking=True)
        assert producer.stats.peak_in_flight <= 7

    asyncio.run(main())
    with pytest.raises(pk.ConfigurationError, match="max_in_flight_messages only"):
        pk.Producer("memory://", concurrent_task_limit=7, max_in_flight_messages=8)


def test_stats_max_in_flight_is_peak_in_flight() -> None:
    async def main() -> pk.Stats:
        async with pk.Producer("memory://", topic="t") as producer:
            await producer.produce(b"v")
        return producer.stats

    stats = asyncio.run(main())
    with pytest.warns(DeprecationWarning, match="peak_in_flight"):
        assert stats.max_in_flight == stats.peak_in_flight == 1


def test_the_kafka_option_max_in_flight_is_max_batches_in_flight() -> None:
    from producerkit.backends.kafka import KAFKA

    with pytest.warns(DeprecationWarning, match="max_batches_in_flight"):
        checked = KAFKA.checked_options({"max_in_flight": "3"})
    assert checked == {"max_batches_in_flight": 3}
    with pytest.raises(pk.ConfigurationError, match="max_batches_in_flight only"):
        KAFKA.checked_options({"max_in_flight": 3, "max_batches_in_flight": 2})


def test_old_setting_names_are_read() -> None:
    environ = {"PRODUCERKIT_URL": "memory://", "PRODUCERKIT_CONCURRENT_TASK_LIMIT": "9"}
    with pytest.warns(DeprecationWarning, match="PRODUCERKIT_MAX_IN_FLIGHT_MESSAGES"):
        loaded = settings.load(environ=environ)
    assert loaded["max_in_flight_messages"] == 9 and "concurrent_task_limit" not in loaded


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("producerkit.backends.kafka", "KafkaBackend", "KafkaConnection"),
        ("producerkit.backends.nats", "NatsBackend", "NatsConnection"),
        ("producerkit.backends.nats", "JetStreamBackend", "JetStreamConnection"),
        ("producerkit.backends.memory", "MemoryBackend", "MemoryConnection"),
        ("producerkit.backends.null", "NullBackend", "NullConnection"),
    ],
)
def test_old_backend_class_names(module: str, old: str, new: str) -> None:
    imported = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=new):
        assert getattr(imported, old) is getattr(imported, new)
