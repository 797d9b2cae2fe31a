"""The C twins do exactly what their Python twins do: ``_speedups.Router.route`` what
``_routing.PyRouter.route`` does, ``_speedups.WindowCore.admit`` what
``_window_core.PyWindowCore.admit`` does (and ``_speedups.Record`` reads as ``_record.Record``),
and produce()'s fused C path for plain nonblocking messages (``_speedups.Admission``) what the
Python path does: the same records, partitions, connections, counts and failures, message for
message. The produce cases run the same messages through the fused path (nonblocking) and the
Python path (blocking) on memory:// and compare what was stored."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import producerkit as pk
from producerkit import partitioners
from producerkit._fast import SPEEDUPS, speedups
from producerkit._record import Message, Record
from producerkit._routing import PyRouter, native_hash
from producerkit._window_core import PyWindowCore
from producerkit.backends.memory import MemoryConnection

pytestmark = pytest.mark.anyio

needs_speedups = pytest.mark.skipif(speedups is None, reason=f"producerkit._speedups: {SPEEDUPS}")

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
async def test_the_fused_path_stores_what_the_python_path_stores(
    batch: list[Produced], connections: int, partitioner: Any
) -> None:
    options = {"connections": connections, "partitioner": partitioner}
    fused = await _publish(True, batch, options)
    python = await _publish(False, batch, options)
    assert fused == python


async def test_a_send_that_raises_fails_its_message_on_either_path(
    monkeypatch: pytest.MonkeyPatch,
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


def _fused(topics: dict[str, int | None], limit: int = 10) -> tuple[Any, list[Any], Any]:
    """A C Admission over a C router and window core whose one connection keeps what it is
    sent: (admission, sent records, core)."""
    assert speedups is not None
    sent: list[Any] = []
    core = speedups.WindowCore(limit, 5.0, lambda record: None)
    router = speedups.Router(partitioners.xxhash, None, partitioners.RoundRobinPartitioner(), 1)
    admission = speedups.Admission(
        router, core, (sent.append,), lambda record, exc: None, topics, "t", 1000
    )
    return admission, sent, core


@needs_speedups
def test_the_fused_path_declines_all_but_plain_messages_to_known_topics() -> None:
    """Its whole decline rule: it returns DECLINED, having counted nothing, for anything but a
    plain nonblocking message with room in the window."""
    assert speedups is not None
    admission, sent, core = _fused({"t": 3})
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
        assert admission.admit(*call) is speedups.DECLINED, call
    assert not sent and not core.pending
    assert admission.admit(*plain) is None
    assert len(sent) == 1 and sent[0].topic == "t" and sent[0].partition in range(3)


@needs_speedups
def test_the_fused_path_declines_when_the_window_is_full() -> None:
    assert speedups is not None
    admission, sent, core = _fused({"t": 1}, limit=2)
    plain = (b"v", None, None, None, None, None, None, None, None)
    assert admission.admit(*plain) is None and admission.admit(*plain) is None
    assert admission.admit(*plain) is speedups.DECLINED  # the window's own limit
    core.handed += 1  # one handed over by another thread holds room too
    del core.pending[next(iter(core.pending))]
    assert admission.admit(*plain) is speedups.DECLINED
    assert len(sent) == 2


@needs_speedups
def test_the_fused_path_serializes_adds_the_trace_and_carries_the_context() -> None:
    """With a value serializer, trace headers and on_delivery, a message is still taken whole:
    its value serialized, the trace context's pairs as its headers (counted in its size), its
    context and a CreateTime on its record; a serializer or trace that raises, or pairs of the
    wrong shape, decline with nothing counted (the Python path then says what is wrong)."""
    assert speedups is not None
    sent: list[Any] = []
    core = speedups.WindowCore(10, 5.0, lambda record: None)
    router = speedups.Router(partitioners.xxhash, None, partitioners.RoundRobinPartitioner(), 1)
    pairs: Any = (("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"),)

    def serialize(value: Any) -> bytes:
        if value == "boom":
            raise ValueError("boom")
        return repr(value).encode()

    admission = speedups.Admission(
        router, core, (sent.append,), lambda record, exc: None, {"t": 3}, "t", 200,
        takes_context=True, stamps=True, value_serializer=serialize,
        trace_headers=lambda: pairs,
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
        assert admission.admit(value, None, None, None, None, None, None, None, None) is (
            speedups.DECLINED
        )
    pairs = [("traceparent", "not bytes")]
    assert admission.admit(1, None, None, None, None, None, None, None, None) is speedups.DECLINED
    assert len(sent) == 1 and len(core.pending) == 1


async def test_extras_on_the_fused_path_match_the_python_path() -> None:
    """json, propagate_trace and on_delivery with a context: what a nonblocking produce (the
    fused path) stores and tells is what a blocking one (the Python path) does."""
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


async def test_a_partitioner_returning_no_int_is_named_at_the_call_over_several_connections() -> (
    None
):
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
    assert speedups is not None
    resolved = partitioners.resolve(partitioner)
    key_hash = partitioners.modulo_hash(resolved)
    made = []
    for kind in (PyRouter, speedups.Router):
        keyless_partitioner = partitioners.resolve_keyless(keyless)
        if isinstance(keyless_partitioner, partitioners.StickyPartitioner):
            keyless_partitioner = partitioners.StickyPartitioner(random.Random(7))
        extra = {} if kind is PyRouter else {"native_hash": native_hash(key_hash)}
        made.append(kind(resolved, key_hash, keyless_partitioner, connections, **extra))
    return made[0], made[1]


@needs_speedups
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


@needs_speedups
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
    with pytest.raises(ValueError, match="native_hash differs"):
        speedups.Router(  # type: ignore[union-attr]
            partitioners.xxhash, xxhash.xxh3_64_intdigest,
            partitioners.RoundRobinPartitioner(), 1, native_hash=wrong,
        )  # fmt: skip
    assert native_hash(partitioners.murmur2) == 0  # no C function for other hashes


@needs_speedups
def test_the_routers_refuse_a_partitioner_returning_no_int_alike() -> None:
    assert speedups is not None

    def bad(key: bytes, num_partitions: int) -> Any:
        return "three"

    python, c = (
        kind(bad, None, partitioners.RoundRobinPartitioner(), 2)
        for kind in (PyRouter, speedups.Router)
    )
    for router in (python, c):
        with pytest.raises(pk.ConfigurationError, match="not a partition number"):
            router.route("t", b"k", None, 4)
        with pytest.raises(pk.ConfigurationError, match="not a partition number"):
            router.route("t", b"k", None, None)  # unpartitioned: the key picks the connection


@needs_speedups
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
    assert speedups is not None
    watched: tuple[list[Any], list[Any]] = ([], [])
    cores = [
        kind(limit, 5.0, found.append, untrack)
        for kind, found in zip((PyWindowCore, speedups.WindowCore), watched, strict=True)
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


@pytest.mark.parametrize("c_loop", [True, False], ids=["tell_run", "python"])
async def test_an_acked_run_tells_on_delivery_alike_in_c_and_python(
    c_loop: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each record still pending told once, at its offset, with its context and CreateTime
    (or the broker's LogAppendTime); a callback that raises is logged and the run goes on."""
    from producerkit import _window, _window_core

    if c_loop and speedups is None:
        pytest.skip(f"producerkit._speedups: {SPEEDUPS}")
    if not c_loop:
        monkeypatch.setattr(_window, "tell_run", _window_core.py_tell_run)
    told: list[tuple[Any, Any]] = []

    def on_delivery(result: Any, context: Any) -> None:
        told.append((result, context))
        if context == "c1":
            raise RuntimeError("a bad callback")

    window = _window.InFlightWindow(10, 5.0, 1, None, on_delivery=on_delivery)
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
