"""produce_batch(values, keys=..., ...) is N nonblocking produces in order: the same placement,
per-key order, headers, outcomes and accounting, on every backend (and, in CI, without the C
speedups too); a bad message raises naming its index before any of the batch is admitted."""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

import anyio
import pytest
from conftest import BackendCase
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import producerkit as pk
from producerkit.backends import spec_for

pytestmark = pytest.mark.anyio

pyarrow = pytest.importorskip("pyarrow")


def _spec(backend: Any) -> Any:
    return spec_for(backend.url.split(":", 1)[0])


async def _stored(backend: Any, topic: str, producer: pk.Producer, count: int) -> list[Any]:
    """What the broker stored of ``topic``, in each partition's order, as comparable tuples."""
    if backend.name == "memory":
        return [
            (r.partition, r.key, r.value, r.headers) for r in producer.backend.store.topic(topic)
        ]
    from conftest import read_jetstream, read_kafka

    if backend.kafka:
        records = await read_kafka(backend.url, topic, count)
        return [
            (r["partition"], r["key"], r["value"], tuple(r["header_pairs"]) or None)
            for r in records
        ]
    records = await read_jetstream(backend.url, topic, count)
    return [(r["subject"], None, r["value"], None) for r in records]


messages = st.lists(
    st.tuples(st.binary(min_size=1, max_size=12), st.sampled_from([b"a", b"b", b"c", None])),
    min_size=1,
    max_size=40,
)


#: Producer settings the equivalence must hold under, each changing what a message goes
#: through (serializers, routing, the window's waits, the connections it is handed to).
PRODUCER_SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "value serializer": {"value_serializer": lambda value: b"<" + value + b">"},
    "key serializer": {"key_serializer": lambda key: key + b"!"},
    "partitioner": {"partitioner": lambda key, partitions: len(key) % partitions},
    "window of 3": {"max_in_flight_messages": 3},
    "two connections": {"connections": 2},
}


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=messages,
    chunk=st.sampled_from([1, 7, 1000]),
    setting=st.sampled_from(sorted(PRODUCER_SETTINGS)),
)
async def test_a_batch_is_n_produces_in_order(
    backend: Any, topic: str, batch: list[tuple[bytes, bytes | None]], chunk: int, setting: str
) -> None:
    """The same messages through produce_batch (in chunks) and through produce(), to two
    topics, under one of PRODUCER_SETTINGS: the same stored messages and partitions, per-key
    order, counts, and nothing failed."""
    spec = _spec(backend)
    subject = f"b{uuid.uuid4().hex[:12]}"  # hypothesis runs many examples in one test call
    options = {**backend.options, **PRODUCER_SETTINGS[setting]}
    results = []
    for mode in ("single", "batch"):
        name = f"{subject}{mode}"
        outcomes: list[pk.Outcome] = []
        async with pk.Producer(
            backend.url, topic=name, on_outcome=outcomes.append, **options
        ) as producer:
            if mode == "single":
                for value, key in batch:
                    await producer.produce(value, key=key, nonblocking=True)
            else:
                for start in range(0, len(batch), chunk):
                    part = batch[start : start + chunk]
                    await producer.produce_batch(
                        [value for value, _ in part], keys=[key for _, key in part]
                    )
            await producer.flush()
            stats = producer.stats
            assert (stats.produced, stats.acked, stats.failed) == (len(batch), len(batch), 0)
            assert sum(len(o.numbers) for o in outcomes) == len(batch)
            stored = (
                await _stored(backend, name, producer, len(batch)) if spec.stores_records else []
            )
        results.append(stored)
    # A keyless message's partition is the keyless partitioner's choice of the moment.
    single, batched = (
        [r if r[1] is not None else (None, *r[1:]) for r in stored] for stored in results
    )
    if backend.name == "memory" or backend.kafka:
        assert sorted(single, key=repr) == sorted(batched, key=repr)
        for key in {r[1] for r in single} - {None}:  # per-key order
            assert [r for r in single if r[1] == key] == [r for r in batched if r[1] == key]
    elif backend.name == "jetstream":
        single_values, batched_values = [r[2] for r in single], [r[2] for r in batched]
        if options.get("connections", 1) > 1:  # a stream keeps no order across connections
            single_values.sort()
            batched_values.sort()
        assert single_values == batched_values


async def test_every_argument_as_a_column(backend: Any, topic: str) -> None:
    subject = topic.replace("-", "")
    seen: list[Any] = []
    options: dict[str, Any] = dict(backend.options)
    async with pk.Producer(
        backend.url, topic=subject, on_delivery=lambda result, context: seen.append(context),
        **options,
    ) as producer:  # fmt: skip
        await producer.produce_batch(
            [b"v0", "v1", bytearray(b"v2")],
            keys=[b"k", "k", None],
            headers=[{"h": b"0"}, None, [("h", "2"), ("h", b"2b")]],
            msg_ids=["id-0", None, "id-2"],
            contexts=["c0", "c1", "c2"],
        )
        await producer.flush()
        assert producer.stats.acked == 3
    assert sorted(seen) == ["c0", "c1", "c2"]


async def test_arrow_columns(backend: Any, topic: str) -> None:
    import pyarrow as pa

    subject = topic.replace("-", "")
    values = pa.array([f"v{i}" for i in range(50)], pa.string())
    keys = pa.chunked_array([pa.array([b"k%d" % (i % 3) for i in range(50)], pa.large_binary())])
    async with pk.Producer(backend.url, topic=subject, **backend.options) as producer:
        await producer.produce_batch(values, keys=keys)
        await producer.flush()
        assert producer.stats.acked == 50
        if backend.name == "memory":
            assert [r.value for r in producer.backend.store.topic(subject)] == [
                b"v%d" % i for i in range(50)
            ]


@pytest.mark.parametrize(
    ("values", "keys", "match"),
    [
        ([b"ok", 5, b"ok"], None, r"message 1: value must be bytes"),
        ([b"ok", b"ok"], [b"k", object()], r"message 1: key must be bytes"),
        ([b"ok"] * 3 + [b"x" * (2 << 20)], None, r"message 3: message of \d+ bytes"),
        ([b"ok", b"ok"], [b"k"], r"keys has 1 items for 2 values"),
        (b"not a column", None, r"values must be a sequence"),
    ],
)
async def test_a_bad_message_raises_naming_its_index_before_any_is_admitted(
    backend: BackendCase, topic: str, values: Any, keys: Any, match: str
) -> None:
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        with pytest.raises(pk.MessageError, match=match):
            await producer.produce_batch(values, keys=keys)
        assert producer.stats.produced == 0
        await producer.produce_batch([b"after"])
        await producer.flush()
        assert producer.stats.acked == 1


@pytest.mark.parametrize("connections", [1, 2])
async def test_a_partitioner_raising_mid_batch_keeps_the_messages_before_it(
    backend: BackendCase, topic: str, connections: int
) -> None:
    """The partitioner raises at message 5 of a plain chunk: the five before it are admitted
    and acked, the call raises what the partitioner raised, and the producer goes on.
    (``partitions=3`` where the backend takes it, so that every backend asks the partitioner.)"""

    def partitioner(key: bytes, partitions: int) -> int:
        if key == b"bad":
            raise ValueError("no partition for this key")
        return len(key) % partitions

    acked: list[Any] = []

    def on_delivery(result: pk.Delivery | pk.Failure, context: Any) -> None:
        if isinstance(result, pk.Delivery):
            acked.append(context)

    options = dict(backend.options)
    if "partitions" in backend.spec.options:
        options["partitions"] = 3
    keys = [b"k%d" % i for i in range(5)] + [b"bad"] + [b"k" for _ in range(4)]
    async with pk.Producer(
        backend.url,
        topic=topic,
        partitioner=partitioner,
        connections=connections,
        on_delivery=on_delivery,
        timeout=10,
        **options,
    ) as producer:
        await producer.produce(b"first", key=b"k", context="first")
        with pytest.raises(Exception, match="no partition for this key"):
            await producer.produce_batch(
                [b"v%d" % i for i in range(10)], keys=keys, contexts=list(range(10))
            )
        await producer.produce_batch([b"after"], keys=[b"k"], contexts=["after"])
        await producer.flush()
        stats = producer.stats
        assert (stats.produced, stats.acked, stats.failed) == (7, 7, 0)
    assert sorted(acked, key=str) == sorted(["first", "after", *range(5)], key=str)
    if backend.spec.stores_records and backend.spec.partitioned:  # else partitions are subjects
        stored = [record["value"] for record in await backend.read(topic, 7)]
        assert sorted(stored) == sorted([b"first", b"after"] + [b"v%d" % i for i in range(5)])


async def test_values_changed_while_a_batch_waits_for_room(backend: Any, topic: str) -> None:
    """The caller's list changes while produce_batch waits for the window (a value becomes
    text): the changed message is produced as it is at its turn (the core's Admission, C or
    Python, takes each as its turn comes and checks it again), the others as they were, and
    every message is accounted for."""
    if not backend.spec.stores_records:
        pytest.skip(f"{backend.name}:// stores nothing to read back")
    subject = topic.replace("-", "")
    values: list[Any] = [b"v%d" % i for i in range(40)]

    def change() -> None:
        values[30] = "text 30"

    options = {**backend.options, "max_in_flight_messages": 4}
    async with pk.Producer(backend.url, topic=subject, **options) as producer:
        asyncio.get_running_loop().call_soon(change)  # runs at produce_batch's first wait
        await producer.produce_batch(values, keys=[b"k"] * 40)
        await producer.flush()
        assert (producer.stats.produced, producer.stats.acked) == (40, 40)
    stored = [record["value"] for record in await backend.read(subject, 40)]
    assert stored[:30] + stored[31:] == [b"v%d" % i for i in range(40) if i != 30]
    if not backend.real:  # acked at once: no wait, the list may change after the call
        assert stored[30] in (b"v30", b"text 30")
    else:  # the Admission took it at its turn, after the change
        assert stored[30] == b"text 30"


async def test_a_tombstone_in_a_batch(backend: BackendCase, topic: str) -> None:
    """A None value in a batch is a tombstone where the backend takes them; elsewhere the batch
    raises naming the message and the backend's reason, and none of it is admitted."""
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        if not backend.spec.takes_tombstones:
            refusal = re.escape(backend.spec.tombstone_refusal or "")
            with pytest.raises(pk.MessageError, match=f"message 1: value is None.*{refusal}"):
                await producer.produce_batch([b"v", None], keys=[b"k", b"k"])
            assert producer.stats.produced == 0
            return
        await producer.produce_batch([b"v", None], keys=[b"k", b"k"])
        await producer.flush()
        assert producer.stats.acked == 2
    if backend.spec.stores_records:
        assert [r["value"] for r in await backend.read(topic, 2)] == [b"v", None]


async def test_a_batch_larger_than_the_window_waits_and_drains_to_half(
    backend: BackendCase, topic: str
) -> None:
    options = {**backend.options, "max_in_flight_messages": 10}
    async with pk.Producer(backend.url, topic=topic, timeout=10, **options) as producer:
        await producer.produce_batch([b"%d" % i for i in range(95)])
        await producer.flush()
        stats = producer.stats
        assert (stats.produced, stats.acked, stats.failed) == (95, 95, 0)
        assert stats.peak_in_flight <= 10


def test_a_sync_batch_keeps_its_thread_order_and_raises_at_the_call(
    backend: BackendCase, topic: str
) -> None:
    options = {**backend.options, "max_in_flight_messages": 7}
    with pk.SyncProducer(backend.url, topic=topic, timeout=10, **options) as sync:
        for number in range(5):
            sync.produce(b"single-%d" % number, key=b"k", nonblocking=True)
        sync.produce_batch([b"batch-%d" % number for number in range(30)], keys=[b"k"] * 30)
        sync.produce(b"after", key=b"k", nonblocking=True)
        with pytest.raises(pk.MessageError, match="message 2: value must be bytes"):
            sync.produce_batch([b"a", b"b", 3])
        sync.flush()
    stats = sync.stats
    assert (stats.produced, stats.acked, stats.failed) == (36, 36, 0)
    assert stats.peak_in_flight <= 7
    if backend.spec.stores_records:  # one key, one connection: stored in the thread's order
        values = [record["value"] for record in anyio.run(backend.read, topic, 36)]
        assert values == [b"single-%d" % n for n in range(5)] + [
            b"batch-%d" % n for n in range(30)
        ] + [b"after"]


@pytest.mark.parametrize("keys_serialized", [False, True], ids=["values", "values-and-keys"])
async def test_serializers_trace_and_stamps_apply_to_a_batch_as_to_single_produces(
    backend: Any, topic: str, keys_serialized: bool
) -> None:
    """A batch's values and keys go through the producer's serializers, its messages carry the
    span's traceparent, and on_delivery's Delivery has a timestamp exactly where a single
    produce's has: the same messages stored both ways (a key serializer takes the batch
    through the checked path, a value serializer alone through the C path)."""
    otel_sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    tracer = otel_sdk_trace.TracerProvider().get_tracer("producerkit-tests")
    subject = topic.replace("-", "")
    values = [b"%d" % n for n in range(6)]  # bytes: plain, as the C path takes them
    keys = [b"a", b"b", b"a", None, b"b", b"a"]
    options: dict[str, Any] = dict(
        backend.options, value_serializer=lambda value: b"value-" + value, propagate_trace=True
    )
    if keys_serialized:
        options["key_serializer"] = lambda key: b"key-" + key
    results = []
    for mode in ("single", "batch"):
        name = f"{subject}{mode}"
        stamped: list[bool] = []

        def delivered(result: pk.Delivery, context: Any, stamped: list[bool] = stamped) -> None:
            stamped.append(result.timestamp is None)

        async with pk.Producer(
            backend.url, topic=name, on_delivery=delivered, **options
        ) as producer:
            with tracer.start_as_current_span("publish"):
                if mode == "single":
                    for value, key in zip(values, keys, strict=True):
                        await producer.produce(value, key=key, nonblocking=True)
                else:
                    await producer.produce_batch(values, keys=keys)
            await producer.flush()
            assert (producer.stats.acked, producer.stats.failed) == (6, 0)
        stored = await backend.read(name, 6) if backend.spec.stores_records else []
        results.append(
            (
                sorted(stamped),
                sorted((r["value"], r["key"], sorted(r["headers"])) for r in stored),
            )
        )
    assert results[0] == results[1]
    if backend.spec.stores_records:
        stored_values = sorted(value for value, _, _ in results[1][1])
        assert stored_values == sorted(b"value-%d" % n for n in range(6))
        assert all("traceparent" in names for _, _, names in results[1][1])
        stored_keys = {key for _, key, _ in results[1][1]} - {None}  # None: no keys stored
        assert stored_keys in (set(), {b"key-a", b"key-b"} if keys_serialized else {b"a", b"b"})


async def test_a_serializer_raising_in_a_batch_names_the_message(
    backend: BackendCase, topic: str
) -> None:
    def serializer(value: Any) -> bytes:
        if value == "bad":
            raise ValueError("cannot serialize this one")
        return str(value).encode()

    async with pk.Producer(
        backend.url, topic=topic, value_serializer=serializer, timeout=10, **backend.options
    ) as producer:
        with pytest.raises(pk.SerializationError, match=r"message 2: value_serializer failed"):
            await producer.produce_batch(["a", "b", "bad", "c"], keys=[b"k"] * 4)
        assert producer.stats.produced == 0
        await producer.produce_batch(["after"])
        await producer.flush()
        assert (producer.stats.produced, producer.stats.acked) == (1, 1)
    if backend.spec.stores_records:
        assert [r["value"] for r in await backend.read(topic, 1)] == [b"after"]
