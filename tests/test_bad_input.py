"""Bad input: each is a producerkit error naming the problem, raised at the call, and the
producer stays usable. Hypothesis fuzzes URLs, options and message fields: nothing may raise
anything but a producerkit error (or succeed).
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import BackendCase
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import producerkit as pk
from producerkit.testing.brokers import create_kafka_topic, start_nats
from producerkit.testing.kafka_cluster import KafkaClusterError
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio

# ---------------------------------------------------------------------- construction

BAD_CONSTRUCTION: list[tuple[str, dict[str, Any], str]] = [
    # (url, keywords, a word the message must contain)
    ("foo://127.0.0.1:9092", {}, "scheme"),
    ("kafka:/127.0.0.1", {}, "malformed"),
    ("127.0.0.1:9092", {}, "malformed"),
    ("kafka://", {}, "host"),
    ("kafka://127.0.0.1:abc", {}, "port"),
    ("kafka://127.0.0.1:0", {}, "port"),
    ("kafka://127.0.0.1:65536", {}, "port"),
    ("kafka://127.0.0.1:", {}, "port"),
    ("kafka://127.0.0.1:9092,", {}, "host"),
    ("kafka://bad host:9092", {}, "host"),
    ("kafka://127.0.0.1/orders", {}, "path"),
    ("kafka://127.0.0.1?linger_ms", {}, "query"),
    ("kafka://127.0.0.1?linger_ms=1&linger_ms=2", {}, "twice"),
    ("null://", {"max_in_flight_messages": 0}, "max_in_flight_messages"),
    ("null://", {"max_in_flight_messages": -5}, "max_in_flight_messages"),
    ("null://", {"max_in_flight_messages": 2.5}, "max_in_flight_messages"),
    ("null://", {"max_in_flight_messages": True}, "max_in_flight_messages"),
    ("null://", {"timeout": 0}, "timeout"),
    ("null://", {"timeout": -1.0}, "timeout"),
    ("null://", {"timeout": math.nan}, "timeout"),
    ("null://", {"timeout": math.inf}, "timeout"),
    ("null://", {"timeout": "30"}, "timeout"),
    ("kafka://127.0.0.1", {"timeout": None}, "timeout"),  # found by the fuzzer: was a TypeError
    ("kafka://127.0.0.1", {"connections": None}, "connections"),  # likewise
    ("null://", {"stats_interval": None}, "stats_interval"),
    ("null://", {"connections": 0}, "connections"),
    ("null://", {"connections": -1}, "connections"),
    ("null://", {"bogus": 1}, "bogus"),
    ("null://?bogus=1", {}, "bogus"),
    ("kafka://127.0.0.1", {"lingerms": 5}, "lingerms"),
    ("kafka://127.0.0.1", {"linger_ms": "soon"}, "linger_ms"),
    ("kafka://127.0.0.1", {"linger_ms": -5}, "linger_ms"),
    ("kafka://127.0.0.1?max_request_size=-1", {}, "max_request_size"),
    ("kafka://127.0.0.1", {"acks": "2"}, "acks"),
    ("kafka://127.0.0.1", {"preset": "fastest"}, "preset"),
    ("nats://127.0.0.1", {"partitions": 0}, "partitions"),
    ("nats://127.0.0.1", {"pending_size": -1}, "pending_size"),
    ("jetstream://127.0.0.1", {"stream_storage": "disk"}, "stream_storage"),
    ("memory://", {"partitions": 0}, "partitions"),
    ("memory://", {"partitions": -3}, "partitions"),
    ("null://", {"partitions": 0}, "partitions"),
    ("null://", {"topic": ""}, "topic"),
    ("null://", {"topic": 7}, "topic"),
    ("kafka://127.0.0.1", {"topic": "bad topic"}, "topic"),
    ("nats://127.0.0.1", {"topic": "orders.*"}, "subject"),
    ("null://", {"partitioner": "fastest"}, "partitioner"),
    ("null://", {"keyless": "everywhere"}, "keyless"),
    ("null://", {"on_error": "print"}, "on_error"),
    ("null://", {"connections": 0}, "connections"),
    ("kafka://127.0.0.1", {"connections": 9_967_788_991}, "connections"),  # was a MemoryError
]


@pytest.mark.parametrize(("url", "kwargs", "word"), BAD_CONSTRUCTION)
def test_bad_construction_is_a_configuration_error(
    url: str, kwargs: dict[str, Any], word: str
) -> None:
    with pytest.raises(pk.ConfigurationError, match=f"(?i){word}"):
        pk.Producer(url, **kwargs)
    with pytest.raises(pk.ConfigurationError):
        pk.SyncProducer(url, **kwargs)  # raised before its loop thread starts


@pytest.mark.parametrize(
    ("url", "typo", "meant"),
    [
        ("null://", "max_inflight", "'max_in_flight_messages'"),
        ("kafka://127.0.0.1", "max_inflight", "'max_in_flight_messages'"),
        ("kafka://127.0.0.1", "max_inflight", "'max_batches_in_flight' (this backend's option)"),
        ("jetstream://127.0.0.1", "timout", "'timeout' (a Producer setting)"),
        ("kafka://127.0.0.1", "linger", "'linger_ms' (this backend's option)"),
    ],
)
def test_a_mistyped_keyword_suggests_the_producers_settings_too(
    url: str, typo: str, meant: str
) -> None:
    """A typo of a Producer keyword lands among the backend options (``**options``): the hint
    searches the Producer's own settings as well as the backend's options."""
    with pytest.raises(pk.ConfigurationError) as caught:
        pk.Producer(url, topic="t", **{typo: 5})
    assert f"unknown option {typo!r}" in str(caught.value)
    assert "did you mean" in str(caught.value) and meant in str(caught.value)


def test_a_mistyped_toml_setting_suggests_the_setting(tmp_path: Any) -> None:
    from producerkit import settings

    path = tmp_path / "producerkit.toml"
    path.write_text("url = 'null://'\nmax_inflight_messages = 5\n")
    with pytest.raises(pk.ConfigurationError, match="did you mean 'max_in_flight_messages'"):
        settings.load(path, environ={})


@pytest.mark.parametrize("url", [None, b"null://", 9092, ["kafka://127.0.0.1"]])
def test_url_of_the_wrong_type(url: Any) -> None:
    with pytest.raises(pk.ConfigurationError, match="str"):
        pk.Producer(url)


# ---------------------------------------------------------------------- produce


def _bad_messages(backend: str) -> list[tuple[dict[str, Any], type[pk.ProducerkitError], str]]:
    """(produce keywords, error, a word of its message); the value defaults to b"v"."""
    cases: list[tuple[dict[str, Any], type[pk.ProducerkitError], str]] = [
        ({"value": 1}, pk.MessageError, "value"),
        ({"value": None}, pk.MessageError, "value"),
        ({"value": [b"v"]}, pk.MessageError, "value"),
        ({"value": {"a": 1}}, pk.MessageError, "value"),
        ({"value": "\ud800"}, pk.MessageError, "value"),  # a lone surrogate is not UTF-8
        ({"key": 1}, pk.MessageError, "key"),
        ({"key": ["k"]}, pk.MessageError, "key"),
        ({"key": "\udfff"}, pk.MessageError, "key"),
        ({"headers": "h=1"}, pk.MessageError, "headers"),
        ({"headers": 5}, pk.MessageError, "headers"),
        ({"headers": {"h": 1}}, pk.MessageError, "header"),
        ({"headers": {"h": ["x"]}}, pk.MessageError, "header"),
        ({"headers": {"h": "\ud800"}}, pk.MessageError, "header"),
        ({"headers": {1: b"x"}}, pk.MessageError, "header"),
        ({"headers": {"": b"x"}}, pk.MessageError, "header"),
        ({"headers": {"\ud800": b"x"}}, pk.MessageError, "header"),
        ({"headers": [("h", b"x", b"y")]}, pk.MessageError, "header"),
        ({"topic": ""}, pk.MessageError, "topic"),
        ({"topic": 5}, pk.MessageError, "topic"),
        ({"topic": b"orders"}, pk.MessageError, "topic"),
        ({"topic": "\ud800"}, pk.MessageError, "topic"),
        ({"partition": -1}, pk.MessageError, "partition"),
        ({"partition": 3}, pk.MessageError, "partition"),  # every partitioned case has 3
        ({"partition": True}, pk.MessageError, "partition"),
        ({"partition": 1.0}, pk.MessageError, "partition"),
        ({"partition": "0"}, pk.MessageError, "partition"),
        ({"msg_id": ""}, pk.MessageError, "msg_id"),
        ({"msg_id": 5}, pk.MessageError, "msg_id"),
        ({"value": b"x" * (1024 * 1024 + 1)}, pk.MessageTooLarge, "larger"),
        ({"value": b"x" * 1000, "key": b"k" * (1024 * 1024)}, pk.MessageTooLarge, "larger"),
    ]
    if backend == "kafka":
        cases += [
            ({"topic": "bad topic"}, pk.MessageError, "topic"),
            ({"topic": "a/b"}, pk.MessageError, "topic"),
            ({"topic": "x" * 250}, pk.MessageError, "topic"),
            ({"topic": ".."}, pk.MessageError, "topic"),
        ]
    if backend in ("nats", "jetstream"):
        cases += [
            ({"headers": {"h": None}}, pk.MessageError, "header"),  # Kafka keeps None values
            ({"topic": "orders.*"}, pk.MessageError, "subject"),
            ({"topic": "orders.>"}, pk.MessageError, "subject"),
            ({"topic": "or ders"}, pk.MessageError, "subject"),
            ({"topic": "orders..eu"}, pk.MessageError, "subject"),
            ({"topic": ".orders"}, pk.MessageError, "subject"),
            ({"topic": "orders."}, pk.MessageError, "subject"),
            ({"headers": {"bad name": "x"}}, pk.MessageError, "header"),
            ({"headers": {"h": b"\xff\xfe"}}, pk.MessageError, "header"),
            ({"headers": {"h": "line\r\nbreak"}}, pk.MessageError, "header"),
        ]
    return cases


@pytest.fixture
async def partitioned(backend: BackendCase) -> BackendCase:
    """The backend with 3 partitions: ``partitions=3`` where it takes that option, a fresh
    3-partition topic on Kafka (none on JetStream: a plain subject has no partitions)."""
    if backend.cluster is not None:  # the mock has no CreateTopics: made through its own API
        with contextlib.suppress(KafkaClusterError):  # made by an earlier test
            backend.cluster.create_topic("bad-input-3", 3)
    elif backend.spec.partitioned and backend.broker is not None:
        await create_kafka_topic(backend.url, "bad-input-3", 3, exist_ok=True)
    if "partitions" in backend.spec.options:
        return backend.with_options(partitions=3)
    return backend


async def test_bad_messages_are_refused_at_the_call(partitioned: BackendCase) -> None:
    """Every row raises its error at produce() (blocking and nonblocking), nothing is counted,
    and the producer then publishes normally."""
    backend = partitioned
    kafka_topic = backend.spec.partitioned and (backend.broker or backend.cluster) is not None
    topic = "bad-input-3" if kafka_topic else f"bad-{uuid.uuid4().hex[:8]}"
    cases = _bad_messages("kafka" if backend.kafka else backend.name)
    if not backend.spec.partitioned and "partitions" not in backend.options:
        # no partitions at all here (a plain JetStream subject)
        cases = [c for c in cases if "partition" not in c[0]] + [
            ({"partition": 0}, pk.MessageError, "partitions=N"),
        ]
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        await producer.produce(b"first")
        for kwargs, error, word in cases:
            kwargs = {"value": b"v", **kwargs}
            for nonblocking in (False, True):
                with pytest.raises(error, match=f"(?i){word}"):
                    await producer.produce(**kwargs, nonblocking=nonblocking)
            stats = producer.stats
            assert stats.produced == 1 and stats.in_flight == 0, (kwargs, stats)
        delivery = await producer.produce(b"still usable", key=b"k", headers={"h": "1"})
        assert delivery is not None and delivery.topic == topic
    stats = producer.stats
    assert (stats.produced, stats.acked, stats.failed) == (2, 2, 0)


async def test_produce_after_close(backend: BackendCase, topic: str) -> None:
    producer = pk.Producer(backend.url, topic=topic, timeout=10, **backend.options)
    await producer.produce(b"v")
    await producer.close()
    with pytest.raises(pk.ProducerClosed, match="close"):
        await producer.produce(b"late")
    with pytest.raises(pk.ProducerClosed):
        await producer.produce(b"late", nonblocking=True)
    with pytest.raises(pk.ProducerClosed):
        await producer.start()
    sync = pk.SyncProducer(backend.url, topic=topic, timeout=10, **backend.options)
    sync.produce(b"v")
    sync.close()
    with pytest.raises(pk.ProducerClosed):
        sync.produce(b"late")


async def test_a_partition_where_the_backend_has_none(backend: BackendCase, topic: str) -> None:
    """partition= on a backend without partitions (a NATS subject without ``partitions=N``,
    null://) is a MessageError naming the option that gives them; elsewhere it is taken."""
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        if backend.spec.partitioned:
            delivery = await producer.produce(b"v", partition=0)
            assert delivery is not None and delivery.partition == 0
        else:
            with pytest.raises(pk.MessageError, match="partitions=N"):
                await producer.produce(b"v", partition=0)
            assert producer.stats.produced == 0
        await producer.produce(b"v")


async def test_the_connections_max_message_size_is_the_limit(
    backend: BackendCase, topic: str
) -> None:
    """What the connection says it takes (Kafka's max_request_size, the NATS server's
    max_payload, memory's and null's option) bounds value + key + headers, at the call."""
    async with pk.Producer(backend.url, topic=topic, timeout=10, **backend.options) as producer:
        await producer.produce(b"first")
        limit = producer.backend.max_message_size
        assert limit == 1024 * 1024  # each backend's default (NATS: the server's)
        for nonblocking in (False, True):
            with pytest.raises(pk.MessageTooLarge, match="larger"):
                await producer.produce(b"x" * limit, nonblocking=nonblocking)
            with pytest.raises(pk.MessageTooLarge):
                await producer.produce(
                    b"x" * (limit // 2), headers={"h": "y" * (limit // 2)}, nonblocking=nonblocking
                )
            with pytest.raises(pk.MessageTooLarge):
                await producer.produce(
                    b"x" * (limit // 2), key=b"k" * (limit // 2), nonblocking=nonblocking
                )
        assert producer.stats.produced == 1
        assert await producer.produce(b"x" * (limit // 2)) is not None
        assert producer.stats.failed == 0


async def test_kafka_max_request_size_is_the_limit(kafka_broker: SessionBroker, topic: str) -> None:
    async with pk.Producer(kafka_broker.url, topic=topic, max_request_size=10_000) as producer:
        assert producer.backend.max_message_size == 10_000
        with pytest.raises(pk.MessageTooLarge, match="larger"):
            await producer.produce(b"x" * 10_000)
        with pytest.raises(pk.MessageTooLarge):
            await producer.produce(b"x" * 6_000, headers={"h": b"y" * 6_000})
        assert await producer.produce(b"x" * 5_000) is not None


@pytest.mark.brokers  # starts a broker of its own
@pytest.mark.parametrize("scheme", ["nats", "jetstream"])
async def test_nats_max_payload_comes_from_the_server(
    scheme: str, tmp_path: Any, topic: str
) -> None:
    """A server configured with max_payload 4096: the producer reads it from INFO and refuses
    larger messages at the call."""
    config = tmp_path / "nats.conf"
    config.write_text("max_payload: 4096\n")
    with start_nats(
        jetstream=scheme == "jetstream", workdir=tmp_path, extra_args=["-c", str(config)]
    ) as broker:
        options = {"create_stream": True} if scheme == "jetstream" else {}
        url = f"{scheme}://{broker.host_port}"
        async with pk.Producer(url, topic=topic, **options) as producer:
            assert producer.backend.max_message_size == 4096
            with pytest.raises(pk.MessageTooLarge, match="larger"):
                await producer.produce(b"x" * 4096)
            with pytest.raises(pk.MessageTooLarge):
                await producer.produce(b"x" * 2000, headers={"h": "y" * 2500})
            assert await producer.produce(b"x" * 1000) is not None
            assert producer.stats.failed == 0


# ---------------------------------------------------------------------- fuzzing

SCHEMES = ["kafka", "nats", "jetstream", "memory", "null", "KAFKA", "http", "", "kafka+ssl"]
HOSTS = st.one_of(
    st.sampled_from(["127.0.0.1", "localhost", "[::1]", "h", "", "a b", "[::1", "h:1:2", "é"]),
    st.text(max_size=12),
)
PORTS = st.one_of(st.none(), st.integers(-5, 70_000).map(str), st.text(max_size=6))
OPTION_NAMES = st.sampled_from(
    [
        "linger_ms",
        "acks",
        "max_request_size",
        "max_batch_size",
        "preset",
        "partitions",
        "pending_size",
        "create_stream",
        "stream_storage",
        "max_message_size",
        "request_timeout_ms",
        "enable_idempotence",
        "compression_type",
        "name",
        "client_id",
        "bogus",
        "",
    ]
)
OPTION_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=10),
    st.binary(max_size=5),
    st.lists(st.integers(), max_size=2),
)


@st.composite
def urls(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return draw(st.text(max_size=40))
    scheme = draw(st.sampled_from(SCHEMES))
    servers = []
    for _ in range(draw(st.integers(1, 3))):
        host, port = draw(HOSTS), draw(PORTS)
        servers.append(host if port is None else f"{host}:{port}")
    query = "&".join(
        f"{draw(OPTION_NAMES)}={draw(st.text(max_size=6))}" for _ in range(draw(st.integers(0, 3)))
    )
    tail = draw(st.sampled_from(["", "/", "/topic", "#frag", "?", "?&"]))
    url = f"{scheme}://{','.join(servers)}{tail}"
    return f"{url}?{query}" if query else url


@settings(max_examples=400, deadline=None)
@given(
    url=urls(),
    options=st.dictionaries(OPTION_NAMES, OPTION_VALUES, max_size=3),
    limit=st.one_of(st.just(1000), OPTION_VALUES),
    timeout=st.one_of(st.just(30.0), OPTION_VALUES),
    connections=st.one_of(st.just(1), OPTION_VALUES),
)
async def test_fuzz_urls_and_options(
    url: str, options: dict[str, Any], limit: Any, timeout: Any, connections: Any
) -> None:
    """Constructing a producer either works or raises a producerkit ConfigurationError; for
    memory:// and null:// the constructed producer also starts, publishes and closes."""
    try:
        producer = pk.Producer(
            url,
            topic="t",
            max_in_flight_messages=limit,
            timeout=timeout,
            connections=connections,
            **options,
        )
    except pk.ConfigurationError:
        return
    except pk.ProducerkitError as exc:  # pragma: no cover - reported as a failure below
        pytest.fail(f"construction raised {type(exc).__name__}, not ConfigurationError: {exc}")
    if url.lower().startswith(("memory://", "null://")):
        async with producer:
            await producer.produce(b"v", key=b"k")


TEXT_OR_BYTES = st.one_of(st.binary(max_size=20), st.text(max_size=20))
ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(),
    TEXT_OR_BYTES,
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
HEADERS = st.one_of(
    st.none(),
    st.dictionaries(
        st.one_of(st.text(max_size=8), st.integers()),
        st.one_of(TEXT_OR_BYTES, ANYTHING),
        max_size=3,
    ),
    st.lists(st.tuples(st.text(max_size=5), TEXT_OR_BYTES), max_size=2),
    ANYTHING,
)


def _fuzz_fields(valid_topics: list[str]) -> Any:
    return st.fixed_dictionaries(
        {
            "value": st.one_of(TEXT_OR_BYTES, ANYTHING),
            "key": st.one_of(st.none(), TEXT_OR_BYTES, ANYTHING),
            "headers": HEADERS,
            "topic": st.one_of(
                st.none(),
                st.sampled_from(valid_topics),
                st.sampled_from(["", "a b", "a.*", "a.>", "..", "a/b", "x" * 300, "\ud800"]),
                ANYTHING,
            ),
            "partition": st.one_of(st.none(), st.integers(-2, 4), ANYTHING),
            "msg_id": st.one_of(st.none(), st.text(max_size=5), ANYTHING),
        }
    )


@pytest.fixture
def fuzz_producer(backend: BackendCase) -> Iterator[tuple[pk.SyncProducer, list[str]]]:
    """One SyncProducer per backend for every example; its topics exist (or are created)."""
    topic = f"fuzz-{uuid.uuid4().hex[:8]}"
    options = {**backend.options}
    if "partitions" in backend.spec.options:
        options["partitions"] = 3
    with pk.SyncProducer(backend.url, topic=topic, timeout=5, **options) as producer:
        producer.produce(b"first")
        yield producer, [topic]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzz_message_fields(
    fuzz_producer: tuple[pk.SyncProducer, list[str]], data: st.DataObject
) -> None:
    """Random values, keys, headers, topics, partitions and msg_ids: produce() succeeds or raises
    a producerkit error, and the accounting stays exact."""
    producer, topics = fuzz_producer
    fields = data.draw(_fuzz_fields(topics))
    nonblocking = data.draw(st.booleans())
    before = producer.stats
    with contextlib.suppress(pk.ProducerkitError):
        producer.produce(**fields, nonblocking=nonblocking)
    stats = producer.stats
    assert stats.produced == stats.acked + stats.failed + stats.in_flight
    assert stats.produced - before.produced <= 1
