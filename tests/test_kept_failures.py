"""A producer keeps at most KEPT_FAILURES Failures between two flush() calls and counts the rest,
so a long outage cannot grow its memory without bound; every failure is still told."""

from __future__ import annotations

from typing import Any

import pytest

import producerkit as pk
from producerkit._window import KEPT_FAILURES
from producerkit.backends.memory import MemoryConnection

pytestmark = pytest.mark.anyio


async def test_failures_beyond_the_kept_are_counted_and_still_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def send(self: MemoryConnection, record: Any) -> None:
        raise ConnectionError("the link dropped")

    monkeypatch.setattr(MemoryConnection, "send", send)
    told: list[pk.Failure] = []
    count = KEPT_FAILURES + 25
    async with pk.Producer("memory://", topic="t", on_error=told.append) as producer:
        for n in range(count):
            await producer.produce(b"%d" % n, nonblocking=True)
        with pytest.raises(pk.ProduceError) as caught:
            await producer.flush()
        error = caught.value
        assert len(error.failures) == KEPT_FAILURES and error.count == count
        assert error.unkept == {"DeliveryError": 25}
        assert f"{count} message(s) failed ({count} DeliveryError)" in str(error)
        assert error.failures[0].value == b"0"
        assert len(told) == count
        stats = producer.stats
        assert (stats.produced, stats.failed) == (count, count)
        # A second interval starts from nothing.
        await producer.produce(b"again", nonblocking=True)
        with pytest.raises(pk.ProduceError) as caught:
            await producer.flush()
        assert caught.value.count == 1 and caught.value.unkept == {}
