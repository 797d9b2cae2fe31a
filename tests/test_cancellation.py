"""Cancel scopes (anyio's fail_after/move_on_after, asyncio's cancel) may cut a produce()
waiting for room, a blocking produce() waiting for its ack, or a flush(), at any point: no window
slot leaks and ``produced == acked + failed + in_flight`` holds throughout, on real brokers."""

from __future__ import annotations

import contextlib

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producerkit import ProduceError, Producer
from producerkit.testing.brokers import LocalBroker

LIMIT = 16

# One step: (what, how many messages, seconds before the cancel scope ends it)
steps = st.lists(
    st.tuples(
        st.sampled_from(["nonblocking", "blocking", "flush"]),
        st.integers(min_value=1, max_value=3 * LIMIT),
        st.floats(min_value=0.0, max_value=0.02),
    ),
    min_size=1,
    max_size=6,
)


def _check_ledger(producer: Producer) -> None:
    stats = producer.stats
    assert stats.produced == stats.acked + stats.failed + stats.in_flight
    assert 0 <= stats.in_flight <= LIMIT


async def _run_steps(
    producer: Producer, plan: list[tuple[str, int, float]], cut: dict[str, int]
) -> None:
    async def one(what: str, count: int, deadline: float) -> None:
        with anyio.move_on_after(deadline) as scope:
            if what == "flush":
                with contextlib.suppress(ProduceError):
                    await producer.flush()
                return
            for number in range(count):
                await producer.produce(
                    b"v%d" % number, key=b"%d" % number, nonblocking=what == "nonblocking"
                )
                _check_ledger(producer)
        if scope.cancelled_caught:
            cut[what] += 1

    async with anyio.create_task_group() as group:
        for what, count, deadline in plan:
            group.start_soon(one, what, count, deadline)
    _check_ledger(producer)


async def _settled_and_no_slot_leaked(producer: Producer) -> None:
    with contextlib.suppress(ProduceError):
        await producer.flush()
    stats = producer.stats
    assert stats.in_flight == 0 and stats.produced == stats.acked + stats.failed
    waits_before = stats.window_waits
    for number in range(LIMIT):  # a whole window's worth goes in without waiting for room
        await producer.produce(b"after %d" % number, nonblocking=True)
    assert producer.stats.window_waits == waits_before
    await producer.flush()


@pytest.mark.parametrize("scheme", ["kafka", "jetstream"])
def test_random_cancellation_never_leaks_a_slot(
    scheme: str, kafka_broker: LocalBroker, nats_broker: LocalBroker
) -> None:
    if scheme == "kafka":
        url, options = kafka_broker.url, {}
    else:
        url, options = nats_broker.jetstream_url, {"create_stream": True}
    topic = f"cancel-{scheme}"
    cut = {"nonblocking": 0, "blocking": 0, "flush": 0}  # steps a cancel scope cut short

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(plan=steps)
    def example(plan: list[tuple[str, int, float]]) -> None:
        async def main() -> None:
            async with Producer(
                url, topic=topic, max_in_flight_messages=LIMIT, **options
            ) as producer:
                await _run_steps(producer, plan, cut)
                await _settled_and_no_slot_leaked(producer)

        anyio.run(main)

    example()
    assert all(cut.values()), cut  # each kind of step was cancelled part-way at least once
