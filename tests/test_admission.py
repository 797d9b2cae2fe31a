"""The C twins do exactly what their Python twins do: ``_speedups.Router.route`` what
``_routing.PyRouter.route`` does, ``_speedups.WindowCore.admit`` what ``_window.PyWindowCore.admit``
does, and the C admission (``_speedups.Admission``, made of those two) what Producer.produce's
path through them does: the same records, partitions, connections, counts and failures, message
for message. The produce cases run the same messages both ways on memory:// and compare what was
stored."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import producerkit as pk
from producerkit import _fast, partitioners
from producerkit._routing import PyRouter
from producerkit._types import DEADLINE
from producerkit._window import PyWindowCore
from producerkit.backends.memory import MemoryConnection

needs_admission = pytest.mark.skipif(
    _fast.Admission is None, reason=f"producerkit._speedups: {_fast.SPEEDUPS}"
)

Message = tuple[Any, Any, str | None, Any, bool]  # value, key, topic, headers, nonblocking

# Mostly what the fast path takes (bytes, nonblocking, default topic), and each thing it declines.
messages = st.lists(
    st.tuples(
        st.one_of(
            st.binary(max_size=20), st.text(max_size=5), st.binary(max_size=3).map(bytearray)
        ),
        st.one_of(st.none(), st.binary(max_size=8), st.text(max_size=3)),
        st.sampled_from([None, None, None, "other"]),
        st.sampled_from([None, None, None, {"h": b"1"}]),
        st.sampled_from([True, True, True, False]),
    ),
    min_size=1,
    max_size=60,
)


def _custom_partitioner(key: bytes, num_partitions: int) -> int:
    return len(key) % num_partitions


async def _publish(fast: bool, batch: list[Message], options: dict[str, Any]) -> Any:
    async with pk.Producer("memory://", topic="main", partitions=5, **options) as producer:
        assert producer._admit is not None  # start() sets it
        if not fast:
            producer._admit = None
        for value, key, topic, headers, nonblocking in batch:
            await producer.produce(
                value, key=key, topic=topic, headers=headers, nonblocking=nonblocking
            )
        await producer.flush()
        stats = producer.stats
        assert stats.produced == len(batch) == stats.acked
        return list(producer.backend.records), stats


@needs_admission
@settings(max_examples=60, deadline=None)
@given(
    batch=messages,
    connections=st.sampled_from([1, 2, 3]),
    partitioner=st.sampled_from(["xxhash", "murmur2", "crc32", _custom_partitioner]),
)
def test_the_c_admission_stores_what_the_python_path_stores(
    batch: list[Message], connections: int, partitioner: Any
) -> None:
    options = {"connections": connections, "partitioner": partitioner, "keyless": "round_robin"}
    fast = asyncio.run(_publish(True, batch, options))
    slow = asyncio.run(_publish(False, batch, options))
    assert fast == slow


@needs_admission
def test_a_send_that_raises_fails_its_message_on_the_c_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A backend's send() raising is reported as that message's failure (translated), once,
    and the producer goes on: on the C path as on the Python path."""
    real_send = MemoryConnection.send

    def send(self: MemoryConnection, record: Any) -> None:
        if record[1].startswith(b"bad"):
            raise ConnectionError("the link dropped")
        real_send(self, record)

    monkeypatch.setattr(MemoryConnection, "send", send)

    async def main(fast: bool) -> tuple[list[bytes], pk.Stats]:
        async with pk.Producer("memory://", topic="t", partitions=3) as producer:
            if not fast:
                producer._admit = None
            for value in (b"ok-1", b"bad-1", b"ok-2", b"bad-2", b"ok-3"):
                await producer.produce(value, key=value, nonblocking=True)
            with pytest.raises(pk.ProduceError) as caught:
                await producer.flush()
            failed = [failure.value for failure in caught.value.failures]
            await producer.produce(b"ok-4", nonblocking=True)
            await producer.flush()
            return failed, producer.stats

    for fast in (True, False):
        failed, stats = asyncio.run(main(fast))
        assert failed == [b"bad-1", b"bad-2"]
        assert (stats.produced, stats.acked, stats.failed, stats.in_flight) == (6, 4, 2, 0)


@needs_admission
def test_the_c_admission_declines_what_it_does_not_handle() -> None:
    """It returns DECLINED, having counted nothing, for anything but the common case."""

    async def main() -> None:
        async with pk.Producer("memory://", topic="t", partitions=3, timeout=5) as producer:
            admit = producer._admit
            assert admit is not None
            assert admit(b"v", b"k", None, None, None, None) is _fast.DECLINED  # topic unknown
            await producer.produce(b"first")  # validates the topic and learns its partitions
            declined = [
                ("text", None, None, None, None, None),  # a str value is converted in Python
                (b"v", "k", None, None, None, None),  # so is a str key
                (b"v", None, "unseen", None, None, None),  # a topic not yet validated
                (b"v", None, None, 1, None, None),  # an explicit partition
                (b"v", None, None, None, {"h": b"1"}, None),  # headers
                (b"v", None, None, None, None, "id-1"),  # msg_id
                (b"x" * (2 << 20), None, None, None, None, None),  # over max_payload
            ]
            for call in declined:
                assert admit(*call) is _fast.DECLINED, call
            assert producer.stats.produced == 1
            assert admit(b"v", b"k", None, None, None, None) is None
            assert producer.stats.acked == 2

    asyncio.run(main())


@pytest.mark.skipif(_fast.Gather is None, reason=f"producerkit._speedups: {_fast.SPEEDUPS}")
def test_gather_appends_only_while_a_ship_is_due_and_the_batch_is_not_full() -> None:
    """Gather.send (the Kafka backend's C send) appends and returns None only in the common
    case; everything else goes to the backend's own send, which appends itself."""

    class Queue:
        __slots__ = ("records",)

        def __init__(self) -> None:
            self.records: list[Any] = []

    queue = Queue()
    slow: list[Any] = []
    gather = _fast.Gather({"t": {0: queue}}, lambda record: slow.append(record) or "slow")
    gather.batch_records = 3

    def record(partition: int) -> tuple[Any, ...]:
        return (1, b"v", None, "t", partition, None, None, 1.0, 0, None)

    assert gather.send(record(0)) == "slow"  # no ship due: the backend schedules one
    gather.ship_due = True
    assert gather.send(record(0)) is None and gather.send(record(0)) is None
    assert len(queue.records) == 2
    assert gather.send(record(0)) == "slow"  # the third would fill the batch: sealed there
    assert gather.send(record(1)) == "slow"  # a partition without a queue yet
    assert (len(queue.records), len(slow)) == (2, 3)


@needs_admission
def test_a_partitioner_returning_no_int_is_named_at_the_call_over_several_connections() -> None:
    """With connections=2 the C admission picks the connection from the partition: a user's
    partitioner returning a float is a ConfigurationError at the call, nothing is counted, and
    the producer goes on."""

    def halves(key: bytes, num_partitions: int) -> float:
        return 1.5

    async def main() -> None:
        async with pk.Producer(
            "memory://", topic="t", partitions=4, connections=2, partitioner=halves
        ) as producer:
            await producer.produce(b"first")  # keyless: learns the topic's partitions
            with pytest.raises(pk.ConfigurationError, match=r"returned 1\.5"):
                await producer.produce(b"v", key=b"k", nonblocking=True)
            await producer.produce(b"after", nonblocking=True)
            await producer.flush()
            stats = producer.stats
            assert (stats.produced, stats.acked, stats.failed) == (2, 2, 0)

    asyncio.run(main())


def _routers(partitioner: Any, keyless: str, connections: int) -> tuple[Any, Any]:
    """A Python and a C router over the same partitioner, each with its own keyless state."""
    resolved = partitioners.resolve(partitioner)
    key_hash = partitioners.modulo_hash(resolved)
    made = []
    for kind in (PyRouter, _fast.speedups.Router):  # type: ignore[union-attr]
        keyless_partitioner = partitioners.resolve_keyless(keyless)
        if isinstance(keyless_partitioner, partitioners.StickyPartitioner):
            keyless_partitioner = partitioners.StickyPartitioner(random.Random(7))
        made.append(kind(resolved, key_hash, keyless_partitioner, connections))
    return made[0], made[1]


@needs_admission
@settings(max_examples=80, deadline=None)
@given(
    routes=st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.one_of(st.none(), st.binary(max_size=12)),
            st.sampled_from([None, None, None, 0, 3]),
            st.sampled_from([None, 1, 4, 7]),
        ),
        min_size=1,
        max_size=40,
    ),
    connections=st.sampled_from([1, 2, 3]),
    partitioner=st.sampled_from(["xxhash", "murmur2", "crc32", _custom_partitioner]),
    keyless=st.sampled_from(["round_robin", "sticky"]),
)
def test_the_c_router_routes_as_the_python_router(
    routes: list[tuple[str, bytes | None, int | None, int | None]],
    connections: int,
    partitioner: Any,
    keyless: str,
) -> None:
    python, c = _routers(partitioner, keyless, connections)
    for topic, key, partition, num_partitions in routes:
        if partition is not None and (num_partitions is None or partition >= num_partitions):
            continue  # the producer refuses these before routing
        expected = python.route(topic, key, partition, num_partitions)
        assert c.route(topic, key, partition, num_partitions) == expected


@needs_admission
def test_the_routers_refuse_a_partitioner_returning_no_int_alike() -> None:
    def bad(key: bytes, num_partitions: int) -> Any:
        return "three"

    python, c = (
        kind(bad, None, partitioners.RoundRobinPartitioner(), 2)
        for kind in (PyRouter, _fast.speedups.Router)  # type: ignore[union-attr]
    )
    for router in (python, c):
        with pytest.raises(pk.ConfigurationError, match="not a partition number"):
            router.route("t", b"k", None, 4)
        with pytest.raises(pk.ConfigurationError, match="not a partition number"):
            router.route("t", b"k", None, None)  # unpartitioned: the key picks the connection


class _Watched:
    """A window core that records what it was asked to watch."""

    def watch(self, record: Any) -> None:
        self.watched.append(record)  # type: ignore[attr-defined]


@needs_admission
@settings(max_examples=40, deadline=None)
@given(
    admits=st.lists(
        st.tuples(
            st.binary(max_size=6),
            st.one_of(st.none(), st.binary(max_size=4)),
            st.sampled_from([None, 0, 2]),
            st.sampled_from([None, (("h", b"1"),)]),
            st.sampled_from([None, "id"]),
            st.sampled_from([0, 1]),
            st.booleans(),  # settle the oldest before this one
        ),
        max_size=30,
    ),
    untrack=st.booleans(),
)
def test_the_c_window_core_admits_as_the_python_one(
    admits: list[tuple[Any, ...]], untrack: bool
) -> None:
    cores = []
    for base in (PyWindowCore, _fast.speedups.WindowCore):  # type: ignore[union-attr]
        core = type("Core", (_Watched, base), {"__slots__": ("watched",)})(100, 5.0, untrack)
        core.watched = []
        cores.append(core)
    for value, key, partition, headers, msg_id, connection, settle in admits:
        records = []
        for core in cores:
            if settle and core.pending:
                del core.pending[next(iter(core.pending))]
            records.append(
                core.admit(value, key, "t", partition, headers, msg_id, connection, None)
            )
        python_record, c_record = records
        assert python_record[:DEADLINE] == c_record[:DEADLINE]
        assert python_record[DEADLINE + 1 :] == c_record[DEADLINE + 1 :]
        assert abs(python_record[DEADLINE] - c_record[DEADLINE]) < 1.0
    python, c = cores
    assert list(python.pending) == list(c.pending)
    assert python.peak_in_flight == c.peak_in_flight
    assert [r[0] for r in python.watched] == [r[0] for r in c.watched]
