"""Cancel scopes (anyio's fail_after/move_on_after, asyncio's cancel) may cut a produce()
waiting for room, a blocking produce() waiting for its ack, or a flush(), at any point: no window
slot leaks and ``produced == acked + failed + in_flight`` holds throughout, on every backend."""

from __future__ import annotations

import asyncio
import contextlib
import gc

import anyio
import pytest
from conftest import BackendCase
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producerkit import ProduceError, Producer

pytestmark = pytest.mark.anyio

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


async def _run_steps(producer: Producer, plan: list[tuple[str, int, float]]) -> dict[str, int]:
    """Run the plan's steps at once, each in its own cancel scope; how many of each kind a
    scope cut short."""
    cut = {"nonblocking": 0, "blocking": 0, "flush": 0}

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
    return cut


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


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=steps)
async def test_random_cancellation_never_leaks_a_slot(
    backend: BackendCase, topic: str, plan: list[tuple[str, int, float]]
) -> None:
    async with Producer(
        backend.url, topic=topic, max_in_flight_messages=LIMIT, timeout=10, **backend.options
    ) as producer:
        await _run_steps(producer, plan)
        await _settled_and_no_slot_leaked(producer)


async def test_each_kind_of_wait_cut_short_leaks_nothing(backend: BackendCase, topic: str) -> None:
    """On a stalled link, a produce waiting for room, a blocking produce waiting for its ack and
    a flush are each cut short by their cancel scope; once the link carries again everything
    settles, acked, and no slot leaked. (Backends that ack at once never wait: nothing to cut.)"""
    url = backend.faulty_url if backend.real else backend.url
    async with Producer(
        url, topic=topic, max_in_flight_messages=LIMIT, timeout=10, **backend.options
    ) as producer:
        await producer.produce(b"warm-up")
        if backend.real:
            backend.faults.pause()
        plan = [("nonblocking", 2 * LIMIT, 0.2), ("blocking", 3, 0.2), ("flush", 0, 0.2)]
        cut = await _run_steps(producer, plan)
        if backend.real:
            assert cut == {"nonblocking": 1, "blocking": 1, "flush": 1}
            backend.faults.resume()
        await _settled_and_no_slot_leaked(producer)
        stats = producer.stats
    assert stats.failed == 0 and stats.acked == stats.produced


@pytest.mark.parametrize("scheme", ["kafka", "jetstream", "nats"])
async def test_start_cancelled_while_connecting_leaves_nothing_behind(
    scheme: str, anyio_backend: object
) -> None:
    """A producer's start cancelled (asyncio's task.cancel(), as Ctrl-C does) while its
    connections wait on a server that never answers leaves no future with an unretrieved
    exception behind (asyncio would log it, with a traceback, when it is collected)."""
    loop_errors: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: loop_errors.append(context))
    held: list[asyncio.StreamWriter] = []

    async def never_answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for delay in (0.0, 0.01, 0.05):
            producer = Producer(f"{scheme}://127.0.0.1:{port}", topic="t", connections=2, timeout=5)
            starting = asyncio.ensure_future(producer.start())
            await asyncio.sleep(delay)
            starting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await starting
            del starting
            gc.collect()
    finally:
        loop.set_exception_handler(None)
        server.close()
        for writer in held:
            writer.close()
    assert [context.get("message") for context in loop_errors] == []
