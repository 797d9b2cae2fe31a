"""The core's two implementations (``producerkit._core``: C where it was built, and Python)
do the same: each test of the core runs on both (the ``core`` fixture), and property tests feed
both the same inputs and compare what they do (``Router.route``, ``WindowCore.admit``,
``Admission.admit`` and ``admit_chunk``: the same records, partitions, connections, counts,
declines and errors). The produce cases run the same messages through the Admission
(nonblocking) and the checked path (blocking) on memory:// and compare what was stored."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import producerkit as pk
from producerkit import _core, partitioners
from producerkit._core import DECLINED, Core
from producerkit._fast import SPEEDUPS
from producerkit._record import Message, Record
from producerkit._routing import native_hash
from producerkit.backends.memory import MemoryConnection

pytestmark = pytest.mark.anyio

#: The tests that compare the two implementations need both.
needs_both = pytest.mark.skipif(_core.C is None, reason=f"producerkit._speedups: {SPEEDUPS}")

Produced = tuple[Any, Any, str | None, Any]  # value, key, topic, headers

# Mostly what the fused path takes (bytes, default topic), and each thing it declines.
messages = st.lists(
    st.tuples(
        st.one_of(
            st.binary(max_size=20), st.text(max_size=5), st.binary(max_size=3).map(bytearray)
        ),
        st.one_of(st.binary(max_size=8), st.text(max_size=3)),
        st.sampled_from([None, None, None, "other"]),
        st.sampled_from([None, None, None, {"h": b"1"}]),
    ),
    min_size=1,
    max_size=60,
)


def _custom_partitioner(key: bytes, num_partitions: int) -> int:
    return len(key) % num_partitions


async def _publish(nonblocking: bool, batch: list[Produced], options: dict[str, Any]) -> Any:
    async with pk.Producer("memory://", topic="main", partitions=5, **options) as producer:
        for value, key, topic, headers in batch:
            await producer.produce(
                value, key=key, topic=topic, headers=headers, nonblocking=nonblocking
            )
        await producer.flush()
        stats = producer.stats
        assert stats.produced == len(batch) == stats.acked
        return list(producer.backend.records), stats.connections


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=messages,
    connections=st.sampled_from([1, 2, 3]),
    partitioner=st.sampled_from(["xxhash", "murmur2", "crc32", _custom_partitioner]),
)
async def test_the_admission_stores_what_the_checked_path_stores(
    batch: list[Produced], connections: int, partitioner: Any
) -> None:
    options = {"connections": connections, "partitioner": partitioner}
    fused = await _publish(True, batch, options)
    python = await _publish(False, batch, options)
    assert fused == python


async def test_a_send_that_raises_fails_its_message_on_either_path(
    monkeypatch: pytest.MonkeyPatch, core: Core
) -> None:
    """A backend's send() raising is reported as that message's failure (translated), once,
    and the producer goes on: on the fused path (nonblocking) as on the Python path."""
    real_send = MemoryConnection.send

    def send(self: MemoryConnection, record: Any) -> None:
        if record.value.startswith(b"bad"):
            raise ConnectionError("the link dropped")
        real_send(self, record)

    monkeypatch.setattr(MemoryConnection, "send", send)
    async with pk.Producer("memory://", topic="t", partitions=3) as producer:
        for value in (b"ok-1", b"bad-1", b"ok-2", b"bad-2", b"ok-3"):
            await producer.produce(value, key=value, nonblocking=True)
        with pytest.raises(pk.ProduceError) as caught:
            await producer.flush()
        assert [failure.value for failure in caught.value.failures] == [b"bad-1", b"bad-2"]
        with pytest.raises(pk.DeliveryError, match="link dropped"):
            await producer.produce(b"bad-3", key=b"k")  # blocking: the Python path
        await producer.produce(b"ok-4", nonblocking=True)
        await producer.flush()
        stats = producer.stats
        assert (stats.produced, stats.acked, stats.failed, stats.in_flight) == (7, 4, 3, 0)


def _router(core: Core, partitioner: Any = partitioners.xxhash, connections: int = 1) -> Any:
    return core.Router(
        partitioner, None, partitioners.RoundRobinPartitioner().partition, connections,
        pk.ConfigurationError,
    )  # fmt: skip


async def _handed_off(record: Any, handed_off: Any) -> None:
    await handed_off


def _admission(
    core: Core, topics: dict[str, int | None], limit: int = 10, **options: Any
) -> tuple[Any, list[Any], Any]:
    """An Admission of ``core`` whose one connection keeps what it is sent: (admission, sent
    records, window core)."""
    sent: list[Any] = []
    window = core.WindowCore(limit, 5.0, lambda record: None)
    admission = core.Admission(
        _router(core), window, (sent.append,), lambda record, exc: None, _handed_off, topics,
        "t", options.pop("max_payload", 1000), **options,
    )  # fmt: skip
    return admission, sent, window


def test_the_admission_declines_all_but_plain_messages_to_known_topics(core: Core) -> None:
    """Its whole decline rule: it returns DECLINED, having counted nothing, for anything but a
    plain nonblocking message with room in the window."""
    admission, sent, window = _admission(core, {"t": 3})
    plain = (b"v", b"k", None, None, None, None, None, None, None)
    declined = [
        ("text", None, None, None, None, None, None, None, None),  # converted in Python
        (b"v", "k", None, None, None, None, None, None, None),  # so is a str key
        (b"v", None, "unseen", None, None, None, None, None, None),  # topic not learned yet
        (b"v", None, None, 1, None, None, None, None, None),  # an explicit partition
        (b"v", None, None, None, {"h": b"1"}, None, None, None, None),  # headers
        (b"v", None, None, None, None, "id-1", None, None, None),  # msg_id
        (b"v", None, None, None, None, None, "context", None, None),  # context
        (b"v", None, None, None, None, None, None, object(), None),  # an expectation
        (b"v", None, None, None, None, None, None, None, 1.5),  # a timestamp
        (b"x" * 1001, None, None, None, None, None, None, None, None),  # over max_payload
    ]
    for call in declined:
        assert admission.admit(*call) is DECLINED, call
    assert not sent and not window.pending
    assert admission.admit(*plain) is None
    assert len(sent) == 1 and sent[0].topic == "t" and sent[0].partition in range(3)


def test_the_admission_declines_when_the_window_is_full(core: Core) -> None:
    admission, sent, window = _admission(core, {"t": 1}, limit=2)
    plain = (b"v", None, None, None, None, None, None, None, None)
    assert admission.admit(*plain) is None and admission.admit(*plain) is None
    assert window.full() and admission.admit(*plain) is DECLINED  # the window's own limit
    window.handed += 1  # one handed over by another thread holds room too
    del window.pending[next(iter(window.pending))]
    assert window.full() and admission.admit(*plain) is DECLINED
    assert len(sent) == 2


def test_a_handed_over_message_is_admitted_into_its_reserved_room(core: Core) -> None:
    """A window full of messages handed over by other threads, nothing admitted: each is
    admitted into its own reserved room (else nothing in flight could ever free room for
    them), the reservation passing to the record, so in flight stays what it was; a message
    with no reservation still finds the window full."""
    admission, sent, window = _admission(core, {"t": 1}, limit=2)
    plain = (b"v", None, None, None, None, None, None, None, None)
    window.handed = 2  # Handoff.put reserved both: the window is full
    assert window.full() and admission.admit(*plain) is DECLINED
    assert admission.admit(*plain, True) is None  # the Admission's way
    assert (len(window.pending), window.taken) == (1, 1)
    record = window.admit(Message(b"w", None, "t", None, None, None, None), 0, 0, None, None, True)
    assert record is not None and (len(window.pending), window.taken) == (2, 2)
    assert window.full() and admission.admit(*plain) is DECLINED
    assert len(sent) == 1


def test_the_admission_serializes_adds_the_trace_and_carries_the_context(core: Core) -> None:
    """With a value serializer, trace headers and on_delivery, a message is still taken whole:
    its value serialized, the trace context's pairs as its headers (counted in its size), its
    context and a CreateTime on its record; a serializer or trace that raises, or pairs of the
    wrong shape, decline with nothing counted (the checked path then says what is wrong)."""
    pairs: Any = (("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"),)

    def serialize(value: Any) -> bytes:
        if value == "boom":
            raise ValueError("boom")
        return repr(value).encode()

    admission, sent, window = _admission(
        core, {"t": 3}, max_payload=200, takes_context=True, stamps=True,
        value_serializer=serialize, trace_headers=lambda: pairs,
    )  # fmt: skip
    before = int(time.time() * 1000)
    assert admission.admit({"n": 1}, b"k", None, None, None, None, "ctx", None, None) is None
    (record,) = sent
    assert record.value == b"{'n': 1}" and record.headers is pairs and record.context == "ctx"
    assert before <= record.timestamp <= int(time.time() * 1000)
    declined = [
        ("boom", None),  # the serializer raises
        ("x" * 140, None),  # 142 bytes of value, with the 66 of the trace: over 200
    ]
    for value, _ in declined:
        assert admission.admit(value, None, None, None, None, None, None, None, None) is (DECLINED)
    pairs = [("traceparent", "not bytes")]
    assert admission.admit(1, None, None, None, None, None, None, None, None) is DECLINED
    assert len(sent) == 1 and len(window.pending) == 1


def test_a_send_that_returns_an_awaitable_is_handed_off(core: Core) -> None:
    """What a connection's send returns to await comes back through hand_off; a send that
    raises fails its record (send_failed) and the call returns None."""
    failed: list[tuple[Any, BaseException]] = []
    pending: Any = object()

    def send(record: Any) -> Any:
        if record.value == b"bad":
            raise ConnectionError("down")
        return pending

    window = core.WindowCore(10, 5.0, lambda record: None)
    admission = core.Admission(
        _router(core), window, (send,), lambda record, exc: failed.append((record, exc)),
        lambda record, handed_off: ("handed", record.value, handed_off), {"t": 1}, "t", 100,
    )  # fmt: skip
    plain = (None, None, None, None, None, None, None, None)
    assert admission.admit(b"ok", *plain) == ("handed", b"ok", pending)
    assert admission.admit(b"bad", *plain) is None
    assert [(record.value, str(exc)) for record, exc in failed] == [(b"bad", "down")]
    assert len(window.pending) == 2  # the failed one is the window's to settle


async def test_extras_through_the_admission_match_the_checked_path(core: Core) -> None:
    """json, propagate_trace and on_delivery with a context: what a nonblocking produce (the
    Admission) stores and tells is what a blocking one (the checked path) does."""
    from opentelemetry.sdk.trace import TracerProvider

    told: list[tuple[Any, Any]] = []
    stored = []
    with TracerProvider().get_tracer("t").start_as_current_span("span"):
        for nonblocking in (True, False):
            async with pk.Producer(
                "memory://", topic="t", partitions=3, value_serializer="json",
                propagate_trace=True, on_delivery=lambda result, context: told.append(
                    (type(result).__name__, context)
                ),
            ) as producer:  # fmt: skip
                for n in range(20):
                    await producer.produce({"n": n}, key=str(n), context=n, nonblocking=nonblocking)
                await producer.flush()
                stored.append(
                    [
                        (r.topic, r.partition, r.key, r.value, r.headers)
                        for r in producer.backend.records
                    ]
                )
                assert all(r.timestamp is not None for r in producer.backend.records)
    assert stored[0] == stored[1]
    assert [name for name, _ in stored[0][0][4]] == ["traceparent"]
    assert told == [("Delivery", n) for n in range(20)] * 2


async def test_a_partitioner_returning_no_int_is_named_at_the_call_over_several_connections(
    core: Core,
) -> None:
    """With connections=2 the connection is picked from the partition: a user's partitioner
    returning a float is a ConfigurationError at the call, nothing is counted, and the producer
    goes on."""

    def halves(key: bytes, num_partitions: int) -> float:
        return 1.5

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


def _routers(partitioner: Any, keyless: str, connections: int) -> tuple[Any, Any]:
    """A Python and a C router over the same partitioner, each with its own keyless state."""
    assert _core.C is not None
    resolved = partitioners.resolve(partitioner)
    key_hash = partitioners.modulo_hash(resolved)
    made = []
    for core in (_core.PYTHON, _core.C):
        keyless_partitioner = partitioners.resolve_keyless(keyless)
        if isinstance(keyless_partitioner, partitioners.StickyPartitioner):
            keyless_partitioner = partitioners.StickyPartitioner(random.Random(7))
        address = native_hash(key_hash) if core is _core.C else 0
        router = core.Router(
            resolved, key_hash, keyless_partitioner.partition, connections,
            pk.ConfigurationError, native_hash=address,
        )  # fmt: skip
        made.append(router)
    return made[0], made[1]


@needs_both
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


@needs_both
def test_the_c_router_hashes_keys_of_every_length_in_c_as_xxhash_does() -> None:
    """The default partitioner's hash in C (xxHash's XXH3_64bits_withSeed, found in the xxhash
    package): every key length XXH3 treats apart lands where xxh3_64_intdigest puts it."""
    import ctypes

    import xxhash

    address = native_hash(xxhash.xxh3_64_intdigest)
    assert address, "the xxhash package's extension exports XXH3_64bits_withSeed"
    python, c = _routers("xxhash", "round_robin", 3)
    generator = random.Random(3)
    for size in [*range(0, 260), 1000, 5000]:
        key = generator.randbytes(size)
        for count in (1, 7, 12):
            assert c.route("t", key, None, count) == python.route("t", key, None, count)
    # Another function with the same signature is refused at construction.
    extension = xxhash._xxhash  # type: ignore[attr-defined]
    wrong = ctypes.cast(ctypes.CDLL(extension.__file__).XXH64, ctypes.c_void_p).value
    assert _core.C is not None
    with pytest.raises(ValueError, match="native_hash differs"):
        _core.C.Router(
            partitioners.xxhash, xxhash.xxh3_64_intdigest,
            partitioners.RoundRobinPartitioner().partition, 1, pk.ConfigurationError,
            native_hash=wrong,
        )  # fmt: skip
    assert native_hash(partitioners.murmur2) == 0  # no C function for other hashes


@needs_both
def test_the_routers_refuse_a_partitioner_returning_no_int_alike(core: Core) -> None:
    def bad(key: bytes, num_partitions: int) -> Any:
        return "three"

    for router in (_router(core, bad, 2),):
        with pytest.raises(pk.ConfigurationError, match="not a partition number"):
            router.route("t", b"k", None, 4)
        with pytest.raises(pk.ConfigurationError, match="not a partition number"):
            router.route("t", b"k", None, None)  # unpartitioned: the key picks the connection


@needs_both
def test_the_c_core_leaves_a_record_untracked_by_the_gc_when_it_holds_no_references() -> None:
    """Thousands of records wait in a batching backend: tracked, each would cost the next
    young-generation collection a visit to every field."""
    import asyncio
    import gc

    assert _core.C is not None
    window = _core.C.WindowCore(10, 5.0, lambda record: None, True)
    plain = Message(b"v", b"k", "t", None, None, None, None)
    assert not gc.is_tracked(window.admit(plain, 0, 0, None))
    # A future or headers can hold references: that record stays tracked, as CPython would.
    loop = asyncio.new_event_loop()
    assert gc.is_tracked(window.admit(plain, 0, 0, loop.create_future()))
    loop.close()
    assert gc.is_tracked(window.admit(plain._replace(headers=[("h", b"1")]), 0, 0, None))
    # Without untrack (the default), every record is tracked.
    assert gc.is_tracked(_core.C.WindowCore(10, 5.0, lambda record: None).admit(plain, 0, 0, None))


@needs_both
@settings(max_examples=40, deadline=None)
@given(
    admits=st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=6)),
            st.one_of(st.none(), st.binary(max_size=4)),
            st.sampled_from([None, 0, 2]),
            st.sampled_from([None, (("h", b"1"),)]),
            st.sampled_from([None, "id"]),
            st.sampled_from([None, 1_700_000_000_000]),
            st.sampled_from([0, 1]),
            st.booleans(),  # settle the oldest before this one
        ),
        max_size=30,
    ),
    untrack=st.booleans(),
    limit=st.sampled_from([3, 100]),
)
def test_the_c_window_core_admits_as_the_python_one(
    admits: list[tuple[Any, ...]], untrack: bool, limit: int
) -> None:
    assert _core.C is not None
    watched: tuple[list[Any], list[Any]] = ([], [])
    cores = [
        implementation.WindowCore(limit, 5.0, found.append, untrack)
        for implementation, found in zip((_core.PYTHON, _core.C), watched, strict=True)
    ]
    for value, key, partition, headers, msg_id, stamp, connection, settle in admits:
        message = Message(value, key, "t", None, headers, msg_id, stamp)
        records = []
        for core in cores:
            if settle and core.pending:
                del core.pending[next(iter(core.pending))]
            records.append(core.admit(message, partition, connection, None))
        python_record, c_record = records
        if python_record is None:
            assert c_record is None  # both full
            continue
        for name in Record._fields:
            if name != "deadline":
                assert getattr(python_record, name) == getattr(c_record, name), name
        assert tuple(python_record) == (
            *tuple(c_record)[:7],
            python_record.deadline,
            *tuple(c_record)[8:],
        )
        assert abs(python_record.deadline - c_record.deadline) < 1.0
        assert python_record.deadline > time.monotonic()
    python, c = cores
    assert list(python.pending) == list(c.pending)
    assert python.peak_in_flight == c.peak_in_flight
    assert [r.seq for r in watched[0]] == [r.seq for r in watched[1]]


def _settle(pending: Any, op: str, count: int, where: float) -> None:
    """One step of settling on a core's ledger (the C Ledger or the Python dict)."""
    keys = list(pending)
    if op in ("pop", "del") and keys:
        seq = keys[int(where * len(keys))]
        if op == "pop":
            assert pending.pop(seq).seq == seq
        else:
            del pending[seq]
    elif op == "absent":  # a seq never admitted, and one settled: nothing, and no error
        for seq in ((keys[-1] if keys else 0) + count, 0, -1, 2**70, "1"):
            assert seq not in pending and pending.get(seq) is None
            assert pending.pop(seq, None) is None
            with pytest.raises(KeyError):
                pending[seq]


@needs_both
@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["admit", "churn", "pop", "del", "absent"]),
            st.integers(min_value=1, max_value=90),
            st.floats(min_value=0, max_value=1, exclude_max=True),
        ),
        max_size=40,
    )
)
def test_the_c_ledger_keeps_what_the_python_dict_keeps(
    steps: list[tuple[str, int, float]],
) -> None:
    """The C core's ledger (a ring by seq, with a dict behind it for records still in flight
    when the ring comes round to their slot) answers as the Python core's dict after any admits
    and settles: the same records in the same order, stragglers and growth included."""
    assert _core.C is not None
    cores = [
        implementation.WindowCore(100_000, 5.0, lambda record: None)
        for implementation in (_core.PYTHON, _core.C)
    ]
    message = Message(b"v", None, "t", None, None, None, None)
    for op, count, where in steps:
        for core in cores:
            if op == "admit":
                for _ in range(count):
                    core.admit(message, 0, 0, None)
            elif op == "churn":  # records in and straight out, past those that stay
                for _ in range(count * 3):
                    del core.pending[core.admit(message, 0, 0, None).seq]
            else:
                _settle(core.pending, op, count, where)
        python, c = (core.pending for core in cores)
        assert list(python) == list(c) == [record.seq for record in c.values()]
        assert len(python) == len(c) and bool(python) == bool(c)
        assert [(seq, r.seq) for seq, r in python.items()] == [(s, r.seq) for s, r in c.items()]
        assert all(seq in c and c[seq].seq == c.get(seq).seq == seq for seq in python)


@pytest.mark.skipif(_core.C is None, reason=f"producerkit._speedups: {SPEEDUPS}")
def test_a_record_still_in_flight_rounds_later_keeps_its_place_in_the_c_ledger() -> None:
    """Records that stay while thousands of others come and go (the ring comes round to their
    slots, then grows) are still found, in admission order, and settle once."""
    assert _core.C is not None
    core = _core.C.WindowCore(100_000, 5.0, lambda record: None)
    pending = core.pending
    message = Message(b"v", None, "t", None, None, None, None)
    stayed = []
    for _ in range(3):
        stayed.append(core.admit(message, 0, 0, None))
        for _ in range(1_000):
            del pending[core.admit(message, 0, 0, None).seq]
    many = [core.admit(message, 0, 0, None) for _ in range(5_000)]
    assert list(pending) == [record.seq for record in stayed + many]
    assert pending[stayed[1].seq] is stayed[1] and stayed[0].seq in pending
    assert pending.pop(stayed[1].seq) is stayed[1] and pending.pop(stayed[1].seq, None) is None
    assert _core.C.pop_run(pending, [stayed[0], many[0], stayed[0]]) == (2, None)
    assert list(pending.values()) == [stayed[2], *many[1:]]
    with pytest.raises(TypeError, match="admission"):
        pending[10**9] = stayed[2]


async def test_an_acked_run_tells_on_delivery_alike_in_c_and_python(
    core: Core, caplog: pytest.LogCaptureFixture
) -> None:
    """Each record still pending told once, at its offset, with its context and CreateTime
    (or the broker's LogAppendTime); a callback that raises is logged and the run goes on."""
    from producerkit import _window

    told: list[tuple[Any, Any]] = []

    def on_delivery(result: Any, context: Any) -> None:
        told.append((result, context))
        if context == "c1":
            raise RuntimeError("a bad callback")

    window = _window.InFlightWindow(10, 5.0, 1, None, on_delivery=on_delivery, core=core)
    message = Message(b"v", b"k", "t", None, None, None, 1_700_000_000_123)
    records = [window.admit(message, 2, 0, None, f"c{n}") for n in range(4)]
    assert all(record is not None for record in records)
    window.acked(records[2], 7)  # settled before the run: not told again
    told.clear()
    window.acked_run(records, 40)  # type: ignore[arg-type]
    window.acked_run(records[:1], None, stored_at=1_700_000_000_999)  # none pending: nothing
    assert [(d.topic, d.partition, d.offset, d.timestamp, c) for d, c in told] == [
        ("t", 2, 40, 1_700_000_000.123, "c0"),
        ("t", 2, 41, 1_700_000_000.123, "c1"),
        ("t", 2, 43, 1_700_000_000.123, "c3"),
    ]
    assert all(type(d) is pk.Delivery for d, _ in told)
    assert window.acked_count == 4 and not window.pending
    assert "on_delivery callback raised" in caplog.text
    window.stop_timer()


def _both_admissions(
    topics: dict[str, int | None], limit: int, connections: int, partitioner: Any
) -> list[tuple[Any, list[Any], Any]]:
    """A Python and a C Admission over equal routers and window cores, each connection
    keeping what it is sent: [(admission, sent records, window core)] for each."""
    assert _core.C is not None
    made = []
    for core in (_core.PYTHON, _core.C):
        sent: list[Any] = []
        window = core.WindowCore(limit, 5.0, lambda record: None)
        router = core.Router(
            partitioners.resolve(partitioner), None,
            partitioners.RoundRobinPartitioner().partition, connections, pk.ConfigurationError,
        )  # fmt: skip
        admission = core.Admission(
            router, window, (sent.append,) * connections, lambda record, exc: None,
            _handed_off, dict(topics), "t", 40,
        )  # fmt: skip
        made.append((admission, sent, window))
    return made


def _outcome(call: Callable[..., Any], *args: Any) -> Any:
    """What ``call(*args)`` returned, or the type and text of what it raised."""
    try:
        return call(*args)
    except Exception as exc:
        return (type(exc), str(exc))


def _fields(record: Any) -> tuple[Any, ...]:
    return tuple(getattr(record, name) for name in Record._fields if name != "deadline")


def _returns_a_float(key: bytes, num_partitions: int) -> Any:
    return 1.5 if key == b"!" else len(key) % num_partitions


@needs_both
@settings(max_examples=80, deadline=None)
@given(
    calls=st.lists(
        st.tuples(
            # Mostly what it takes, and each thing it declines now and then.
            st.one_of(*[st.binary(max_size=30)] * 8, st.text(max_size=3), st.none()),
            st.one_of(*[st.none(), st.binary(max_size=12)] * 4, st.just(b"!"), st.text(max_size=2)),
            st.sampled_from([*[None] * 6, "t", "u", "unknown", 7]),
            st.sampled_from([*[None] * 9, 1]),  # partition
            st.sampled_from([*[None] * 9, {"h": b"1"}]),  # headers
            st.sampled_from([False, False, False, True]),  # settle the oldest record first
        ),
        min_size=5,
        max_size=40,
    ),
    limit=st.sampled_from([3, 100]),
    connections=st.sampled_from([1, 2]),
    partitioner=st.sampled_from(["xxhash", "murmur2", _returns_a_float]),
)
@example(
    calls=[(b"v", None, None, None, None, False)] * 5, limit=3, connections=1, partitioner="xxhash"
)
def test_the_two_admissions_agree_message_for_message(
    calls: list[tuple[Any, ...]], limit: int, connections: int, partitioner: Any
) -> None:
    """The same calls into the Python and the C Admission: the same outcomes (taken, DECLINED,
    or the same error), the same records sent (partition, connection, fields), the same
    window (pending, peak)."""
    both = _both_admissions({"t": 4, "u": None}, limit, connections, partitioner)
    for value, key, topic, partition, headers, settle in calls:
        outcomes = []
        for admission, _, window in both:
            if settle and window.pending:
                del window.pending[next(iter(window.pending))]
            outcomes.append(
                _outcome(
                    admission.admit, value, key, topic, partition, headers, None, None, None, None
                )
            )
        assert outcomes[0] == outcomes[1], (value, key, topic)
    (_, python_sent, python_window), (_, c_sent, c_window) = both
    assert [_fields(r) for r in python_sent] == [_fields(r) for r in c_sent]
    assert list(python_window.pending) == list(c_window.pending)
    assert python_window.peak_in_flight == c_window.peak_in_flight


@needs_both
@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.binary(max_size=30), st.none(), st.text(max_size=2)), min_size=1, max_size=30
    ),
    keyed=st.booleans(),
    topic=st.sampled_from([None, "t", "u", "unknown"]),
    tombstones=st.booleans(),
    limit=st.sampled_from([5, 100]),
    connections=st.sampled_from([1, 2]),
    partitioner=st.sampled_from(["xxhash", _returns_a_float]),
    data=st.data(),
)
def test_the_two_admissions_agree_chunk_for_chunk(
    values: list[Any],
    keyed: bool,
    topic: str | None,
    tombstones: bool,
    limit: int,
    connections: int,
    partitioner: Any,
    data: st.DataObject,
) -> None:
    """admit_chunk from the start and from a later point, on both implementations: the same
    end, the same records by connection, the same stop (DECLINED or the same error)."""
    keys = (
        data.draw(
            st.lists(
                st.one_of(st.binary(max_size=6), st.just(b"!"), st.none()),
                min_size=len(values),
                max_size=len(values),
            )
        )
        if keyed
        else None
    )
    start = data.draw(st.sampled_from([0, len(values) // 2]))
    both = _both_admissions({"t": 3, "u": None}, limit, connections, partitioner)
    outcomes = []
    for admission, _, _ in both:
        outcome = _outcome(
            admission.admit_chunk, values, keys, topic, start, len(values), tombstones
        )
        if type(outcome) is tuple and len(outcome) >= 2 and type(outcome[1]) is list:
            end, by_connection, *stopped = outcome
            if stopped and isinstance(stopped[0], Exception):
                stopped = [(type(stopped[0]), str(stopped[0]))]
            outcome = (end, [[_fields(r) for r in rs] for rs in by_connection], *stopped)
        outcomes.append(outcome)
    assert outcomes[0] == outcomes[1]
    assert list(both[0][2].pending) == list(both[1][2].pending)
