"""A producer that is never closed (no ``async with``, no close()) is closed at the event loop's
shutdown, and the messages it never got acknowledged are reported, never lost in silence."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from conftest import BackendCase

from producerkit import Producer


def test_a_producer_left_open_reports_what_was_never_acked(
    backend: BackendCase, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    producers: list[Producer] = []

    async def main() -> None:
        producer = Producer(backend.url, topic=topic, **backend.options)
        producers.append(producer)
        for number in range(5_000):  # started by produce() itself; never closed
            await producer.produce(b"x" * 100, key=b"%d" % number, nonblocking=True)

    # memory:// and null:// ack at once: nothing is left in flight to report there.
    expect_warning = pytest.warns(ResourceWarning) if backend.real else contextlib.nullcontext()
    with caplog.at_level(logging.ERROR, logger="producerkit.producer"), expect_warning:
        asyncio.run(main())  # on purpose: the loop's own shutdown is what closes the producer
    (producer,) = producers
    stats = producer.stats
    assert producer.closed
    assert stats.produced == 5_000 == stats.acked + stats.failed
    assert stats.in_flight == 0
    reports = [
        record.getMessage() for record in caplog.records if "never closed" in record.getMessage()
    ]
    if stats.failed:
        (report,) = reports
        assert f"{stats.failed} of them were never acknowledged" in report


@pytest.mark.anyio
async def test_a_closed_producer_reports_nothing(
    backend: BackendCase, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="producerkit.producer"):
        async with Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
            for number in range(50):
                await producer.produce(b"v", key=b"%d" % number, nonblocking=True)
    stats = producer.stats
    assert producer.closed
    assert (stats.produced, stats.acked, stats.failed, stats.in_flight) == (50, 50, 0, 0)
    assert not [record for record in caplog.records if "never closed" in record.getMessage()]
