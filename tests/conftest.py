"""Session brokers, the event loops every async test runs on, and one fixture parametrized over
every backend.

The session brokers are producerkit's pytest plugin's own ``kafka_broker`` (Tansu, memory
storage) and ``nats_broker`` (nats-server with JetStream in a temp dir; ``.url`` is core NATS,
``.jetstream_url`` JetStream), started once per session on free loopback ports. ``async def``
tests (``pytestmark = pytest.mark.anyio``) run on anyio's pytest plugin over ``anyio_backend``:
asyncio, and asyncio with uvloop for the tests that reach a real broker (``brokers``).
``backend`` runs a test on memory, null, kafka, kafka-cluster (kafka:// on the plugin's
``kafka_cluster``, librdkafka's mock cluster of three brokers, one per test), kafka-apache
(kafka:// on the plugin's ``apache_kafka``, one real Apache Kafka node), jetstream,
jetstream-cluster (jetstream:// on the plugin's ``jetstream_cluster``, three nats-servers, the
streams a producer creates replicated on all three) and nats: a behaviour test takes it and
skips, or asserts the typed refusal, by what ``backend.spec`` declares the backend can do
(``takes_tombstones``, ``stores_records``...), never by its name; ``backend.read()`` reads back
what it stored, and on real backends ``backend.faulty_url``/``backend.faults`` put the session
broker's (or the cluster's) fault proxy in between. ``read_kafka`` and ``read_jetstream`` read a
topic back with a plain client.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from producerkit import _core
from producerkit.backends import spec_for
from producerkit.backends.base import BackendSpec
from producerkit.backends.memory import get_store
from producerkit.testing.apache_kafka import ApacheKafka
from producerkit.testing.kafka_cluster import KafkaCluster
from producerkit.testing.nats_cluster import JetStreamCluster
from producerkit.testing.proxy import FaultProxy
from producerkit.testing.pytest_plugin import (
    _SESSION_JETSTREAM_CLUSTERS,
    SessionBroker,
    _kafka_cluster,
)

#: The judges of this project's own tests (what Apache Kafka would have stored or served where
#: the broker under test does not do it) live with the chaos bench, in benches/chaos/judges, one
#: place for both: tests import them, and the bench's modules, as ``chaos.*``.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benches"))

from chaos.judges.kafka_recorder import RecordingKafkaCluster

#: This run is on the clients' public API path (``PRODUCERKIT_CLIENT_PATH=public``, a run of
#: CI), where the clients send what producerkit's own path writes itself.
ON_THE_PUBLIC_PATH = os.environ.get("PRODUCERKIT_CLIENT_PATH", "").strip().lower() == "public"

#: Kafka transactions (atomic batches, exactly-once) are producerkit's own Produce requests: on
#: the public path they are refused, typed (tests/test_transactions.py checks the refusal on
#: every run).
TRANSACTIONS_ON_THE_FAST_PATH = pytest.mark.skipif(
    ON_THE_PUBLIC_PATH,
    reason="Kafka transactions need producerkit's own Produce requests (the public path "
    "refuses them with AtomicBatchError kind='unsupported')",
)

BACKENDS = [
    "memory",
    "null",
    "kafka",
    "kafka-cluster",
    "kafka-apache",
    "jetstream",
    "jetstream-cluster",
    "nats",
]

#: The backends the ``backend`` fixture also runs on the Python core where the C one is the
#: default (``producerkit._core``): memory:// for the window, routing and admission, and Kafka
#: on Tansu for settling batches; the other backends settle through the same functions.
_PYTHON_CORE_TOO = ("memory", "kafka")


@pytest.fixture
def kafka_cluster() -> Iterator[RecordingKafkaCluster]:
    """The plugin's ``kafka_cluster`` (librdkafka's mock cluster of 3 brokers, one per test)
    reached through the recorders of benches/chaos/judges: ``read(topic,
    isolation_level="read_committed")`` and ``transactions`` tell what Apache Kafka would serve,
    which the mock does not."""
    yield from _kafka_cluster(RecordingKafkaCluster)


def _backend_params() -> list[Any]:
    default = _core.active()
    params = [pytest.param((name, default.name), id=name) for name in BACKENDS]
    if default is not _core.PYTHON:
        params += [pytest.param((name, "python"), id=f"{name}-pycore") for name in _PYTHON_CORE_TOO]
    return params


@pytest.fixture(params=_core.IMPLEMENTATIONS, ids=lambda core: f"{core.name}core")
def core(request: pytest.FixtureRequest) -> Iterator[_core.Core]:
    """Each implementation of the core this installation has (Python, and C where it was
    built), active for the test: producers made in it take that core."""
    with _core.using(request.param) as chosen:
        yield chosen


_KAFKA_BACKENDS = ("kafka", "kafka-cluster", "kafka-apache")
_JETSTREAM_BACKENDS = ("jetstream", "jetstream-cluster")
_REAL_BACKENDS = (*_KAFKA_BACKENDS, *_JETSTREAM_BACKENDS, "nats")
_BROKER_FIXTURES = (
    "kafka_broker",
    "nats_broker",
    "private_kafka_broker",
    "private_nats_broker",
    "apache_kafka",
    "apache_kafka_cluster",
    "apache_kafka_tv0",
    "jetstream_cluster",
)


#: The brokers that judge what Kafka and JetStream guarantee (their tests run on asyncio only).
_JUDGE_BACKENDS = ("kafka-apache", "jetstream-cluster")
_JUDGE_FIXTURES = ("apache_kafka", "apache_kafka_cluster", "apache_kafka_tv0", "jetstream_cluster")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups set here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``brokers`` every test that talks to a real broker through a client library: it asks
    for a session broker, or for ``backend`` on kafka/jetstream/nats. ``pytest -m brokers`` runs
    exactly these (CI runs them once more on the client libraries' public-API path).

    Only these run on uvloop too: a loop's differences show in its sockets and transports, and
    the tests of memory://, null:// and pure logic would double the suite's time for nothing, so
    their ``uvloop`` case is deselected; so is that of a backend on the Python core (``-pycore``:
    what the core changes, no loop changes), and that of the brokers there to judge a broker's
    semantics (Apache Kafka, the JetStream cluster: ``kafka-apache``, ``jetstream-cluster`` and
    the tests of their fixtures), whose client code and sockets are those the other Kafka and
    JetStream cases run on uvloop."""
    on_asyncio_only: list[pytest.Item] = []
    kept: list[pytest.Item] = []
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_worker_group(item)))
        fixtures = getattr(item, "fixturenames", ())
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        backend = params.get("backend")
        if any(name in fixtures for name in _BROKER_FIXTURES) or (
            backend is not None and backend[0] in _REAL_BACKENDS
        ):
            item.add_marker(pytest.mark.brokers)
        on_uvloop = params.get("anyio_backend") == _UVLOOP
        python_core = backend is not None and backend[1] == _core.PYTHON.name
        judge = (backend is not None and backend[0] in _JUDGE_BACKENDS) or any(
            name in fixtures for name in _JUDGE_FIXTURES
        )
        if on_uvloop and (item.get_closest_marker("brokers") is None or python_core or judge):
            on_asyncio_only.append(item)
        else:
            kept.append(item)
    if on_asyncio_only:
        config.hook.pytest_deselected(items=on_asyncio_only)
        items[:] = kept


_UVLOOP = ("asyncio", {"use_uvloop": True})


def _worker_group(item: pytest.Item) -> str:
    """Under pytest-xdist's ``--dist loadgroup``: a file's tests stay on one worker (its module
    fixtures are set up once), except that every test on the session's SparkSession goes to one
    worker (one JVM), and the two sharing a local-cluster run to one. Spark tests that start
    their own JVM in a subprocess stay with their file, free to run beside the session's."""
    fixtures = getattr(item, "fixturenames", ())
    if "spark" in fixtures:
        return "spark-session"
    if "local_cluster" in fixtures:
        return "spark-local-cluster"
    return item.nodeid.split("::", 1)[0]


_UVLOOP_MISSING = importlib.util.find_spec("uvloop") is None


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {}), id="asyncio"),
        pytest.param(
            _UVLOOP,
            id="uvloop",
            marks=pytest.mark.skipif(
                _UVLOOP_MISSING, reason='uvloop is not installed (pip install "producerkit[all]")'
            ),
        ),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """The event loops every ``pytest.mark.anyio`` test runs on: asyncio, and asyncio with
    uvloop (kept for ``brokers`` tests only, see ``pytest_collection_modifyitems``)."""
    backend: tuple[str, dict[str, Any]] = request.param
    return backend


@pytest.fixture
def topic() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


class BackendCase:
    """A backend under test: its URL, the options a test producer needs, its spec (what it can
    do: ``backend.spec.takes_tombstones``...), and how to read back what it stored.

    ``kafka-cluster`` is kafka:// on the test's ``kafka_cluster`` (librdkafka's mock cluster
    of three brokers) instead of Tansu, ``kafka-apache`` on the session's ``apache_kafka`` (one
    Apache Kafka node): ``backend.kafka`` is true for the three, ``backend.cluster`` is the mock
    cluster and ``backend.apache`` the Apache Kafka node (None elsewhere); ``backend.broker`` is
    None for both."""

    def __init__(
        self,
        name: str,
        url: str,
        options: dict[str, Any],
        broker: SessionBroker | None = None,
        cluster: KafkaCluster | None = None,
        core: _core.Core | None = None,
        apache: ApacheKafka | None = None,
        jetstream_cluster: JetStreamCluster | None = None,
    ) -> None:
        self.name = name
        #: The core its producers take (see the ``backend`` fixture): C where it was built.
        self.core = core or _core.active()
        self.url = url
        self.options = options
        self.spec: BackendSpec = spec_for(url.partition("://")[0].lower())
        #: The session broker behind a real backend (None for memory://, null:// and the
        #: Kafka cluster).
        self.broker = broker
        #: The test's Kafka cluster behind kafka-cluster (None elsewhere).
        self.cluster = cluster
        #: The session's Apache Kafka node behind kafka-apache (None elsewhere).
        self.apache = apache
        #: The session's JetStream cluster behind jetstream-cluster (None elsewhere).
        self.jetstream_cluster = jetstream_cluster
        #: memory://NAME's store, held here so that it outlives the test's producers.
        self.store = get_store(url.removeprefix("memory://")) if name == "memory" else None

    @property
    def real(self) -> bool:
        return self.name in _REAL_BACKENDS

    @property
    def hides_aborted_writes(self) -> bool:
        """Whether a reader of committed data (``read(..., committed=True)``) sees nothing of an
        aborted atomic batch here: not on Tansu 0.6 (it serves aborted records to
        ``read_committed`` readers) nor on librdkafka's mock cluster (it enforces no isolation);
        on Apache Kafka, JetStream and memory://, yes."""
        return not self.kafka or self.apache is not None

    @property
    def kafka(self) -> bool:
        """kafka:// on a real broker: Tansu (``kafka``), the mock cluster (``kafka-cluster``) or
        Apache Kafka (``kafka-apache``)."""
        return self.name in _KAFKA_BACKENDS

    @property
    def fake_append_time(self) -> bool:
        """The broker answers every Produce with a made-up LogAppendTime, which a Delivery then
        reports as its timestamp: librdkafka's mock cluster says 1234 ms (1.234 s) whatever
        the record's timestamp; it stores the record's own, as a broker does."""
        return self.cluster is not None

    @property
    def faulty_url(self) -> str:
        """``url`` through the session broker's (or cluster's) fault proxy (``faults``): real
        backends only."""
        scheme = self.url.partition("://")[0]
        return f"{scheme}://{self.faults.host_port}"

    @property
    def faults(self) -> FaultProxy:
        """The fault proxy of ``faulty_url`` (cleared after each test by the plugin): in front
        of the session broker, or of the cluster's first broker (Metadata rewritten, so every
        connection to the cluster passes through it)."""
        if self.cluster is not None:
            return self.cluster.faults
        if self.apache is not None:
            return self.apache.faults
        if self.jetstream_cluster is not None:
            return self.jetstream_cluster.faults
        assert self.broker is not None, f"{self.name}:// has no broker to put a proxy before"
        return self.broker.faults

    def with_options(self, **options: Any) -> BackendCase:
        """The same backend with more options for its producers."""
        case = BackendCase(
            self.name,
            self.url,
            {**self.options, **options},
            self.broker,
            self.cluster,
            self.core,
            self.apache,
            self.jetstream_cluster,
        )
        case.store = self.store
        return case

    async def read(
        self, topic: str, expected: int, timeout: float = 30.0, *, committed: bool = False
    ) -> list[dict[str, Any]]:
        """What the backend stored on ``topic``, read back outside the producer (a plain aiokafka
        or nats-py consumer, or memory://'s store), in partition and offset order (``committed``:
        as a ``read_committed`` Kafka consumer reads it; elsewhere the same): dicts with
        ``value``, ``key`` (None where the backend has no keys), ``headers`` (name to value,
        bytes), ``header_pairs`` (in order, where the backend keeps repeated names) and
        ``timestamp`` (epoch ms, where the backend stores one). Only for backends whose
        ``spec.stores_records``."""
        assert self.spec.stores_records, f"{self.name}:// stores nothing to read back"
        if self.kafka:
            # librdkafka's mock writes each transaction's end marker (a control batch) with a CRC
            # that does not match it (seen: its commit marker); the batches producerkit writes
            # there are checked (Apache Kafka verifies every batch's CRC as it appends it).
            checked = self.cluster is None
            return await read_kafka(
                self.url, topic, expected, timeout, committed=committed, check_crcs=checked
            )
        if self.name in _JETSTREAM_BACKENDS:
            records = await read_jetstream(self.url, topic, expected, timeout)
            for record in records:
                headers = {
                    name: value.encode() if isinstance(value, str) else value
                    for name, value in record["headers"].items()
                    if not name.startswith("Nats-")
                }
                record.update(key=None, headers=headers, header_pairs=None)
            return records
        assert self.store is not None
        return [
            {
                "partition": record.partition,
                "offset": record.offset,
                "key": record.key,
                "value": record.value,
                "headers": dict(record.headers or ()),
                "header_pairs": list(record.headers or ()),
                "timestamp": None if record.timestamp is None else round(record.timestamp * 1000),
            }
            for record in sorted(
                self.store.topic(topic), key=lambda r: (r.partition or 0, r.offset)
            )
        ]

    def __repr__(self) -> str:
        return f"<BackendCase {self.name} {self.url} ({self.core.name} core)>"


@pytest.fixture(autouse=True)
def _jetstream_cluster_streams_deleted(request: pytest.FixtureRequest) -> Iterator[None]:
    """The streams a test makes on the session's JetStream cluster are deleted after it, so
    that what one test leaves there cannot hold back another's: nats-server 2.14 and 2.15 keep
    a replica of an R3 stream that refused a ``Nats-Expected-Last-Msg-Id`` publish unhealthy
    (and the stream without a leader) once its server restarts ("stream write error: last msgid
    mismatch"), and a restart waits for every stream the server holds to be current."""
    callspec = getattr(request.node, "callspec", None)
    uses = "jetstream_cluster" in request.fixturenames or (
        callspec is not None and "jetstream-cluster" in callspec.id
    )
    if not uses:
        yield
        return
    clusters = request.config.stash.get(_SESSION_JETSTREAM_CLUSTERS, [])
    before = {id(cluster): set(cluster.stream_names()) for cluster in clusters}
    yield
    for cluster in request.config.stash.get(_SESSION_JETSTREAM_CLUSTERS, []):
        for name in set(cluster.stream_names()) - before.get(id(cluster), set()):
            cluster.delete_stream(name)


@pytest.fixture(params=_backend_params())
def backend(request: pytest.FixtureRequest) -> Iterator[BackendCase]:
    """Each behaviour test runs on every backend, and memory:// and Kafka on the Python core
    too (ids ``memory-pycore``, ``kafka-pycore``): skip (or assert the typed refusal) by what
    ``backend.spec`` declares, never by the backend's name."""
    name, core_name = request.param
    (core,) = (core for core in _core.IMPLEMENTATIONS if core.name == core_name)
    with _core.using(core):
        case = _backend_case(request, name)
        case.core = core
        yield case


def _backend_case(request: pytest.FixtureRequest, name: str) -> BackendCase:
    if name == "memory":
        return BackendCase(name, f"memory://{uuid.uuid4().hex}", {})
    if name == "null":
        return BackendCase(name, "null://", {})
    if name == "kafka":
        broker: SessionBroker = request.getfixturevalue("kafka_broker")
        return BackendCase(name, broker.url, {}, broker)
    if name == "kafka-cluster":
        cluster: KafkaCluster = request.getfixturevalue("kafka_cluster")
        return BackendCase(name, cluster.url, {}, cluster=cluster)
    if name == "kafka-apache":
        apache: ApacheKafka = request.getfixturevalue("apache_kafka")
        return BackendCase(name, apache.url, {}, apache=apache)
    if name == "jetstream-cluster":
        cluster3: JetStreamCluster = request.getfixturevalue("jetstream_cluster")
        options = {"create_stream": True, "stream_replicas": 3}
        return BackendCase(name, cluster3.url, options, jetstream_cluster=cluster3)
    broker = request.getfixturevalue("nats_broker")
    if name == "jetstream":
        return BackendCase(name, f"jetstream://{broker.host_port}", {"create_stream": True}, broker)
    return BackendCase(name, f"nats://{broker.host_port}", {}, broker)


ReadBack = Callable[..., Awaitable[list[dict[str, Any]]]]


async def read_kafka(
    url: str,
    topic: str,
    expected: int,
    timeout: float = 30.0,
    *,
    committed: bool = False,
    check_crcs: bool = True,
) -> list[dict[str, Any]]:
    """Every record of ``topic`` read with a plain aiokafka consumer, in partition order
    (``committed``: ``read_committed``, else ``read_uncommitted``; ``check_crcs``: each batch's
    CRC checked as it is read)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=url.removeprefix("kafka://"),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        isolation_level="read_committed" if committed else "read_uncommitted",
        check_crcs=check_crcs,
    )
    await consumer.start()
    records: list[dict[str, Any]] = []

    async def read(timeout_ms: int) -> None:
        batches = await consumer.getmany(timeout_ms=timeout_ms, max_records=10000)
        for tp, messages in batches.items():
            records.extend(
                {
                    "partition": tp.partition,
                    "offset": message.offset,
                    "key": message.key,
                    "value": message.value,
                    "headers": dict(message.headers or ()),
                    "header_pairs": list(message.headers or ()),
                    "timestamp": message.timestamp,
                }
                for message in messages
            )

    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(records) < expected and loop.time() < deadline:
            await read(500)
        for _ in range(2):  # a little longer, to catch duplicates beyond the expected count
            await read(200)
    finally:
        await consumer.stop()
    return records


async def read_jetstream(
    url: str, subject: str, expected: int, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """Every message on ``subject`` (a filter: ``orders`` or ``orders.>``) read with a plain
    nats-py pull consumer, in stream order."""
    import nats
    import nats.errors
    import nats.js.errors

    servers = [f"nats://{server}" for server in url.partition("://")[2].split(",")]
    nc = await nats.connect(servers)
    try:
        js = nc.jetstream()
        probe = subject.replace(".>", ".0").replace(".*", ".0")
        from nats.js.api import AckPolicy, ConsumerConfig

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:  # a cluster electing a leader (a server just killed) may not answer yet
            try:
                stream = await js.find_stream_name_by_subject(probe)
                psub = await js.pull_subscribe(
                    subject, stream=stream, config=ConsumerConfig(ack_policy=AckPolicy.NONE)
                )
                break
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                if loop.time() >= deadline:
                    raise
                await asyncio.sleep(0.5)
        records: list[dict[str, Any]] = []
        quiet = 0
        while loop.time() < deadline and (len(records) < expected or quiet < 1):
            try:
                batch = await psub.fetch(2000, timeout=0.5)
            except TimeoutError:  # nats-py may raise a plain asyncio.TimeoutError too
                quiet += 1
                continue
            except nats.js.errors.ServiceUnavailableError:  # a cluster's consumer not ready yet
                await asyncio.sleep(0.1)
                continue
            for msg in batch:
                records.append(
                    {
                        "subject": msg.subject,
                        "offset": msg.metadata.sequence.stream,
                        "value": msg.data,
                        "headers": dict(msg.headers or {}),
                    }
                )
        await psub.unsubscribe()
        return records
    finally:
        await nc.close()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One SparkSession for every Spark test of the session (one takes seconds to start):
    ``local[2,3]``, two cores and up to three attempts per task, so a retry test can fail a task
    once. Executors run this interpreter (it has producerkit; see docs/spark.md)."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("producerkit-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


#: The start of a local-cluster script: this interpreter on the executors, two executor JVMs.
_LOCAL_CLUSTER_START = """
import os, sys
os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
from pyspark.sql import SparkSession, functions as F
import producerkit.spark as pks
spark = (SparkSession.builder.master("local-cluster[2,1,1024]")
         .config("spark.ui.enabled", "false").config("spark.driver.memory", "512m").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
df = spark.range(20000, numPartitions=4).select(F.col("id").cast("string").alias("value"))
"""


def stored_on(url: str, subject: str, below: int, timeout: float = 120.0) -> Callable[[], None]:
    """A function for Spark's executors (it pickles by value) that returns once the JetStream
    stream of ``subject`` at ``url`` holds a message ``v-<n>...`` with ``n < below`` (a row of
    the task that fails, not of the others; the stream may not exist yet), or after
    ``timeout`` seconds: a test failing a task "after some of its rows were stored" waits for
    that, not for a pause."""

    def wait() -> None:
        import asyncio
        import contextlib
        import time

        import nats
        from nats.js.errors import NotFoundError

        async def until_stored() -> None:
            client = await nats.connect(url.replace("jetstream://", "nats://"))
            try:
                js = client.jetstream()
                deadline = time.monotonic() + timeout
                sequence = 1
                while time.monotonic() < deadline:
                    with contextlib.suppress(NotFoundError):
                        stream = await js.find_stream_name_by_subject(subject)
                        last = (await js.stream_info(stream)).state.last_seq
                        while sequence <= last:
                            data = (await js.get_msg(stream, sequence)).data or b""
                            if int(data.split(b"-")[1]) < below:
                                return
                            sequence += 1
                    await asyncio.sleep(0.05)
            finally:
                await client.close()

        asyncio.run(until_stored())

    return wait


def kafka_stored(
    url: str, topic: str, below: int, count: int, timeout: float = 120.0, *, at_least: int = 0
) -> Callable[[], None]:
    """A function for Spark's executors (it pickles by value) that returns once ``topic`` at
    the Kafka ``url`` holds ``count`` records ``v-<n>...`` with ``at_least <= n < below`` (rows
    of the task that fails, or of the others; open transactions' included: read uncommitted),
    or after ``timeout`` seconds: a test failing a task "after some rows were written" waits
    for that, not for a pause."""

    def wait() -> None:
        import time

        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": url.removeprefix("kafka://"),
                "group.id": f"producerkit-stored-{topic}",
                "isolation.level": "read_uncommitted",
                "enable.auto.commit": False,
                "log_level": 3,
            }
        )
        try:
            partitions = consumer.list_topics(topic, timeout=30.0).topics[topic].partitions
            consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
            seen = 0
            deadline = time.monotonic() + timeout
            while seen < count and time.monotonic() < deadline:
                for message in consumer.consume(1000, timeout=0.2):
                    value = message.value()
                    if message.error() is None and value:
                        seen += at_least <= int(value.split(b"-")[1]) < below
        finally:
            consumer.close()

    return wait


def run_local_cluster(body: str, workdir: Path) -> dict[str, list[int]]:
    """Run ``body`` on a ``local-cluster[2,1,1024]`` session (two executor JVMs) in a subprocess
    (one Python process holds one SparkContext), with ``spark``, ``F``, ``pks`` and ``df`` (20,000
    string ``value`` rows in 4 partitions) defined; ``body`` prints lines ``RESULT <name>`` and
    integers, returned as name -> integers."""
    import subprocess

    script = _LOCAL_CLUSTER_START + body + "\nspark.stop()\n"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=280, cwd=workdir
    )
    results = {
        words[1]: list(map(int, words[2:]))
        for words in (line.split() for line in done.stdout.splitlines())
        if words[:1] == ["RESULT"]
    }
    assert results, done.stderr[-3000:]
    return results
