"""max_in_flight_bytes (a bound in bytes as well as in messages) and resume_at (where a full
window lets waiting produces in again)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conftest import BackendCase

from producerkit import ConfigurationError, Outcome, Producer
from producerkit._byte_window import ByteBoundedWindow, record_size
from producerkit._record import Message
from producerkit._window import InFlightWindow

pytestmark = pytest.mark.anyio

MESSAGE = b"m" * 100_000


async def test_bytes_in_flight_never_pass_the_bound(backend: BackendCase, topic: str) -> None:
    bound = 1_000_000
    peaks: list[int] = []
    producer: Producer

    def watch(outcome: Outcome) -> None:  # after every settlement, read the window
        in_flight = producer.stats.bytes_in_flight
        assert in_flight is not None
        peaks.append(in_flight)
        assert in_flight <= bound

    producer = Producer(
        backend.url,
        topic=topic,
        max_in_flight_bytes=bound,
        on_outcome=watch,
        **backend.options,
    )
    async with producer:
        for number in range(200):
            await producer.produce(MESSAGE, key=b"%d" % number, nonblocking=True)
            in_flight = producer.stats.bytes_in_flight
            assert in_flight is not None and in_flight <= bound
        await producer.flush()
    stats = producer.stats
    assert stats.acked == 200 and stats.failed == 0
    assert stats.peak_bytes_in_flight is not None
    assert 0 < stats.peak_bytes_in_flight <= bound
    if backend.real and backend.spec.acks_with_offset:  # acks from a broker, not a flush
        assert stats.window_waits > 0  # 20 MB through a 1 MB window


async def test_a_message_larger_than_the_bound_goes_alone(backend: BackendCase, topic: str) -> None:
    async with Producer(
        backend.url, topic=topic, max_in_flight_bytes=10, timeout=10, **backend.options
    ) as producer:
        await producer.produce(b"x" * 100)
        assert producer.stats.peak_bytes_in_flight == 100
        for _ in range(5):  # one at a time: each waits for the one before
            await producer.produce(b"y" * 100, nonblocking=True)
            assert producer.stats.in_flight <= 1
        await producer.flush()
        assert producer.stats.bytes_in_flight == 0
    assert (producer.stats.acked, producer.stats.peak_in_flight) == (6, 1)


async def test_without_a_byte_bound_the_bytes_are_not_tracked(
    backend: BackendCase, topic: str
) -> None:
    async with Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        await producer.produce(b"x", nonblocking=True)
        assert producer.stats.bytes_in_flight is None
    assert producer.stats.peak_bytes_in_flight is None


@pytest.mark.parametrize(("resume_at", "resumes_at"), [(0.5, 50), (0.9, 90), (1.0, 99), (0.0, 0)])
async def test_waiters_resume_at_the_given_fraction(resume_at: float, resumes_at: int) -> None:
    window = InFlightWindow(100, 30.0, 1, None, resume_at=resume_at)
    message = Message(b"v", None, "t", None, None, None, None)
    records = [window.admit(message, 0, 0, None) for _ in range(100)]
    waiting = asyncio.ensure_future(window.wait_for_room())
    await asyncio.sleep(0)
    settled = 0
    while not waiting.done():
        window.acked(records[settled], settled)
        settled += 1
        await asyncio.sleep(0)
    assert window.in_flight == resumes_at
    window.stop_timer()


async def test_byte_bound_resumes_when_both_bounds_have_drained() -> None:
    window = ByteBoundedWindow(100, 30.0, 1, None, byte_limit=1000, resume_at=0.5)
    message = Message(b"v" * 100, None, "t", None, None, None, None)
    records = [window.admit(message, 0, 0, None) for _ in range(10)]
    assert window.bytes_in_flight == 1000 == sum(record_size(r) for r in records)
    assert window.is_full(1) and not window.is_full(0)
    waiting = asyncio.ensure_future(window.wait_for_room(100))
    settled = 0
    await asyncio.sleep(0)
    while not waiting.done():
        window.acked(records[settled], settled)
        settled += 1
        await asyncio.sleep(0)
    assert window.bytes_in_flight == 500
    window.failed(records[settled], RuntimeError("x"))
    assert window.bytes_in_flight == 400
    window.acked_run(records[settled:], 0)
    assert window.bytes_in_flight == 0
    window.stop_timer()


@pytest.mark.parametrize(
    "settings",
    [
        {"resume_at": 1.5},
        {"resume_at": -0.1},
        {"resume_at": "half"},
        {"max_in_flight_bytes": 0},
        {"max_in_flight_bytes": 1.5},
    ],
)
def test_bad_bounds_are_configuration_errors(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        Producer("null://", topic="t", **settings)


def test_the_throughput_preset_brings_its_window_unless_one_is_given() -> None:
    preset = Producer("kafka://127.0.0.1:1", topic="t", preset="throughput")
    assert "limit=10000 " in repr(preset)
    given = Producer(
        "kafka://127.0.0.1:1", topic="t", preset="throughput", max_in_flight_messages=7
    )
    assert "limit=7 " in repr(given)


@pytest.mark.parametrize(
    ("options", "limit"),
    [
        ({}, 10_000),  # idempotent where the broker grants it: five batches in flight
        ({"enable_idempotence": True}, 10_000),
        ({"max_batches_in_flight": 3}, 10_000),
        ({"enable_idempotence": False}, 1000),  # one batch per partition in flight
        ({"acks": 1}, 1000),  # rules idempotence out
        ({"max_batches_in_flight": 1}, 1000),
        ({"enable_idempotence": False, "preset": "throughput"}, 10_000),
        ({"max_batches_in_flight": 1, "max_in_flight_messages": 50_000}, 50_000),
    ],
)
def test_kafka_s_default_window_fills_the_batches_a_partition_may_have_in_flight(
    options: dict[str, Any], limit: int
) -> None:
    """Five batches per partition in flight pay only with the messages to fill them: Kafka's
    default window is 10,000 wherever a partition may have more than one in flight."""
    assert f"limit={limit} " in repr(Producer("kafka://127.0.0.1:1", topic="t", **options))


def test_other_backends_keep_a_default_window_of_1000() -> None:
    assert "limit=1000 " in repr(Producer("jetstream://127.0.0.1:1", topic="t"))
