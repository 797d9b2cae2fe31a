"""Real Apache Kafka brokers (KRaft) for tests, run from the jars on Maven Central.

Tansu and librdkafka's mock cluster speak the Kafka protocol, but neither enforces all of
Kafka's rules: a ``read_committed`` consumer served only committed records, a producer fenced
when another initializes its transactional id again, an idempotent producer's retried batch
stored once, a transaction aborted by the coordinator when it outlives its timeout. An
:class:`ApacheKafka` is the broker itself::

    with ApacheKafka(brokers=3) as kafka:          # nodes 1, 2, 3; each broker and controller
        kafka.create_topic("orders", 3, replication_factor=3, min_insync_replicas=2)
        producer = Producer(kafka.url, topic="orders")      # kafka://127.0.0.1:P1,...
        kafka.kill(kafka.leader_of("orders", 0))   # SIGKILL; kafka.restart(node) brings it back
        kafka.read("orders", expected=10)          # records as dicts, read_committed

What it needs: ``java`` (17 or newer) on the PATH, and ``mvn`` the first time a version is used:
the jars (``org.apache.kafka:kafka_2.13``, ``kafka-tools`` for reassigning partitions, and
slf4j-simple for the log) are resolved by Maven into a cache directory,
``$PRODUCERKIT_CACHE``, else ``$XDG_CACHE_HOME/producerkit``, else ``~/.cache/producerkit``,
under ``apache-kafka-<version>/``, once (:mod:`producerkit.testing.maven`: a file lock keeps
parallel test workers from resolving at the same time; a marker file says the copy is
complete). Without them, :class:`~producerkit.errors.MissingDependencyError` says what to
install. A node that does not
start raises :class:`~producerkit.errors.BrokerUnavailable` with the end of its log.

The Python side needs confluent-kafka (``pip install "producerkit[pytest]"``) for the admin
and read-back calls; nothing is imported until they are used.

Each node runs in its own session (process group) on free loopback ports, with its log and data
under the cluster's work directory (``node-<id>/``): a temp directory removed by :meth:`stop`,
unless ``workdir`` was given.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Self

from producerkit.errors import BrokerUnavailable, ConfigurationError, MissingDependencyError
from producerkit.testing import maven
from producerkit.testing._kafka_metadata import node_leaders
from producerkit.testing._local_cluster import LocalCluster
from producerkit.testing.brokers import LocalBroker, free_port

if TYPE_CHECKING:
    pass

__all__ = ["ApacheKafka", "cache_dir", "resolve_jars"]

_INSTALL_PYTHON: Final = 'pip install "producerkit[pytest]"'
_SLF4J_VERSION: Final = "2.0.17"
logger = logging.getLogger(__name__)

_STARTED: Final = b"Kafka Server started"
#: What a node that could not bind a port logs, and how often a start picks new ports for that.
_PORT_TAKEN: Final = "Address already in use"
_PORT_ATTEMPTS: Final = 3

#: JVM flags for a test broker on a small machine (2 cores, several JVMs at once). The serial
#: collector uses no GC threads of its own; C1 alone (TieredStopAtLevel=1) starts a node in
#: ~2.5 s instead of ~3.9 s (measured on 2 cores) and is fast enough for test traffic.
_JVM_FLAGS: Final = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)


# ---------------------------------------------------------------------- the jars


def cache_dir(version: str) -> Path:
    """Where the jars of Apache Kafka ``version`` are kept: ``apache-kafka-<version>/`` under
    :func:`~producerkit.testing.maven.cache_root`."""
    return maven.cache_root() / f"apache-kafka-{version}"


def java_binary() -> str:
    """The ``java`` on the PATH, or :class:`~producerkit.errors.MissingDependencyError`."""
    java = shutil.which("java")
    if java is None:
        raise MissingDependencyError(f"no java on the PATH. {maven.INSTALL_JAVA}")
    return java


def resolve_jars(version: str) -> Path:
    """The directory holding every jar Apache Kafka ``version`` runs from, resolved by Maven
    into :func:`cache_dir` the first time (a few seconds, ~45 MB) and reused after
    (:func:`~producerkit.testing.maven.resolve_jars`: safe from parallel processes). ``mvn``
    missing, or Maven failing (no network, unknown version):
    :class:`~producerkit.errors.MissingDependencyError`."""
    # slf4j-api is declared so that Maven does not pick kafka's 1.7.x, which binds no 2.x
    # slf4j-simple (the broker would then log nothing). kafka-tools brings Kafka Connect's
    # runtime (Jetty, Jersey: 45 jars) that the reassignment tool does not use.
    return maven.resolve_jars(
        cache_dir(version).name,
        [
            maven.Artifact("org.apache.kafka", "kafka_2.13", version),
            maven.Artifact(
                "org.apache.kafka",
                "kafka-tools",
                version,
                excluded=("org.apache.kafka:connect-runtime",),
            ),
            maven.Artifact("org.slf4j", "slf4j-api", _SLF4J_VERSION),
            maven.Artifact("org.slf4j", "slf4j-simple", _SLF4J_VERSION),
        ],
    )


# ---------------------------------------------------------------------- one node


def _kafka_uuid() -> str:
    """A Kafka Uuid in its text form (URL-safe base64, no padding), as ``StorageTool
    random-uuid`` prints one: Kafka refuses ids starting with ``-``."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _readable_tail(text: str, lines: int = 25) -> str:
    """The last ``lines`` lines of a JVM log without stack frames (``\\tat ...``,
    ``... 3 more``), which would push the exception's message out of a short tail."""
    kept = [line for line in text.splitlines() if not re.match(r"\s+(at |\.\.\. \d+ more)", line)]
    return "\n".join(kept[-lines:])


class _Node(LocalBroker):
    """One Apache Kafka node (broker and controller), a :class:`LocalBroker` whose start waits
    until the node logged that it started, not only until its port listens."""

    def __init__(self, node_id: int, command: list[str], port: int, url: str, workdir: Path):
        super().__init__("kafka", command, port, url, workdir, owns_workdir=False)
        self.node_id = node_id
        self._started_from = 0

    def launch(self) -> None:
        """Start the process without waiting (see :meth:`wait_started`)."""
        try:
            self._started_from = self._log_path.stat().st_size
        except FileNotFoundError:
            self._started_from = 0
        super().launch()

    def wait_started(self, deadline: float) -> None:
        """Return once the node launched last logged ``Kafka Server started``; a
        :class:`BrokerUnavailable` with its log's tail if it exits or the deadline passes."""
        assert self.process is not None
        while True:
            if self.process.poll() is not None:
                raise BrokerUnavailable(
                    f"Apache Kafka node {self.node_id} exited with code "
                    f"{self.process.returncode}:\n{self.log_tail()}"
                )
            with open(self._log_path, "rb") as log:
                log.seek(self._started_from)
                if _STARTED in log.read():
                    return
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.kill()
                raise BrokerUnavailable(
                    f"Apache Kafka node {self.node_id} did not start in time:\n{tail}"
                )
            time.sleep(0.05)

    def start(self, wait: float = 60.0) -> _Node:
        self.launch()
        self.wait_started(time.monotonic() + wait)
        return self

    def stop(self, wait: float = 30.0) -> None:
        """SIGTERM (Kafka's graceful shutdown: its leaders move to other nodes first), then
        SIGKILL after ``wait`` seconds."""
        process = self.process
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(wait)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                self.kill()
        self.process = None

    def logged_since_launch(self) -> str:
        """What the node logged since it was last launched."""
        try:
            with open(self._log_path, "rb") as log:
                log.seek(self._started_from)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 25) -> str:
        """The node's first ERROR lines and their causes since its last launch (a fatal one
        at startup is followed by a long shutdown), then the last ``lines`` lines of its log."""
        text = self.logged_since_launch()
        errors = [
            line
            for line in text.splitlines()
            if " ERROR " in line or " FATAL " in line or line.startswith("Caused by:")
        ]
        first = "\n".join(errors[:6])
        tail = _readable_tail(text, lines)
        return f"first errors:\n{first}\n...\n{tail}" if first else tail


# ---------------------------------------------------------------------- the cluster


class ApacheKafka(LocalCluster):
    """Apache Kafka ``version``: ``brokers`` nodes (ids 1..N, each a broker and a KRaft
    controller) on free loopback ports, formatted with ``transaction_version`` (2: KIP-890's
    transactions v2, Kafka 4's default; 0 or 1: the older protocol). ``heap`` is each JVM's
    ``-Xmx``. ``properties`` are added to (or replace) every node's ``server.properties``.
    ``ports``: the client ports of the first nodes (the others, and the controller ports, are
    free ports). ``jvm_options``: the nodes' JVM flags after the heap's; the default is for a
    quick start on a small machine (the serial collector, C1 alone: ``-XX:TieredStopAtLevel=1``);
    a throughput bench gives flags with full tiered compilation (benches/_brokers.py).

    Nothing runs until :meth:`start` (or ``with``); :meth:`stop` stops every node and removes
    the work directory if it made it. The internal topics are replicated on every node (3 at
    most) with a min ISR of 2 when there are 3 nodes or more; a topic's ``min.insync.replicas``
    defaults to Kafka's 1 (:meth:`create_topic` sets it).
    """

    scheme = "kafka"
    _title = "Apache Kafka"

    def __init__(
        self,
        brokers: int = 1,
        *,
        version: str = "4.4.0",
        transaction_version: int = 2,
        workdir: Path | None = None,
        heap: str = "512m",
        properties: Mapping[str, str | int] | None = None,
        ports: Sequence[int] | None = None,
        jvm_options: Sequence[str] = _JVM_FLAGS,
    ) -> None:
        if brokers < 1:
            raise ConfigurationError(f"an Apache Kafka cluster has at least 1 node, not {brokers}")
        if transaction_version not in (0, 1, 2):
            raise ConfigurationError(
                f"transaction_version is 0, 1 or 2, not {transaction_version!r}"
            )
        if ports is not None and len(ports) > brokers:
            raise ConfigurationError(f"{len(ports)} ports given for {brokers} nodes")
        self.version = version
        self._transaction_version = transaction_version
        self._brokers = brokers
        self._heap = heap
        self._properties = {key: str(value) for key, value in (properties or {}).items()}
        self._ports = list(ports or ())
        self._jvm_options = list(jvm_options)
        super().__init__(workdir)
        self._nodes: dict[int, _Node] = {}
        self._admin: Any = None

    # ------------------------------------------------------------------ addresses

    @property
    def node_ids(self) -> list[int]:
        """The nodes' ids: 1..N."""
        return list(range(1, self._brokers + 1))

    @property
    def transaction_version(self) -> int:
        """The ``transaction.version`` the cluster was formatted with."""
        return self._transaction_version

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:P1,127.0.0.1:P2,...``, every node's client port (for a plain client)."""
        return ",".join(node.host_port for node in self._started_nodes())

    @property
    def url(self) -> str:
        """``kafka://127.0.0.1:P1,...``, for a :class:`producerkit.Producer`."""
        return f"kafka://{self.bootstrap_servers}"

    @property
    def nodes(self) -> list[LocalBroker]:
        """The nodes' processes, in id order (``log_tail()``, ``process``, ``freeze()``...)."""
        return list(self._started_nodes())

    def node(self, node_id: int) -> LocalBroker:
        """The process of node ``node_id``."""
        return self._node(node_id)

    # ------------------------------------------------------------------ lifecycle

    def start(self, wait: float = 90.0) -> Self:
        """Fetch the jars if needed, format every node's storage and start the nodes; returns
        once each logged that it started and the cluster's metadata names all of them.
        Raises :class:`~producerkit.errors.MissingDependencyError` without java (or mvn, the
        first time) and :class:`~producerkit.errors.BrokerUnavailable` when a node fails, after
        stopping what it started."""
        if self._nodes:
            raise ConfigurationError("this ApacheKafka is already started")
        java = java_binary()
        jars = resolve_jars(self.version)
        self._open_workdir("producerkit-apache-kafka-")
        self._java, self._classpath = java, f"{jars}/*"
        try:
            deadline = time.monotonic() + wait
            self._launch_nodes(deadline)
            self._wait(
                lambda: set(self._metadata(timeout=5).brokers) >= set(self.node_ids),
                deadline - time.monotonic(),
                "every node to join the cluster",
            )
            # Made again when needed: an idle client would hold connections to every node.
            self._admin = None
        except BaseException:
            self.stop()
            raise
        return self

    def _launch_nodes(self, deadline: float) -> None:
        """Create, format and launch every node; return once each logged that it started. A
        port chosen free that another process bound before a node did (the JVM binds seconds
        after the choice) makes that node exit: the nodes are made again on other ports, up to
        three times, where neither the ports nor the work directory were given."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self._create_nodes()
            try:
                for node in self._nodes.values():
                    node.launch()
                for node in self._nodes.values():
                    node.wait_started(deadline)
                return
            except BrokerUnavailable:
                ours = not self._ports and self._given_workdir is None
                nodes = self._nodes.values()
                taken = any(_PORT_TAKEN in node.logged_since_launch() for node in nodes)
                if not ours or not taken or attempt == _PORT_ATTEMPTS:
                    raise
                logger.info("Apache Kafka: a port was taken before a node bound it; again")
                for node in self._nodes.values():
                    node.kill()
                    shutil.rmtree(node.workdir, ignore_errors=True)
                self._nodes.clear()

    def _create_nodes(self) -> None:
        workdir = self.workdir
        given = dict(zip(self.node_ids, self._ports, strict=False))
        ports = {
            node_id: (given.get(node_id) or free_port(), free_port()) for node_id in self.node_ids
        }
        quorum = ",".join(f"127.0.0.1:{controller}" for _, controller in ports.values())
        directory_ids = {node_id: _kafka_uuid() for node_id in self.node_ids}
        initial = ",".join(
            f"{node_id}@127.0.0.1:{ports[node_id][1]}:{directory_ids[node_id]}"
            for node_id in self.node_ids
        )
        cluster_id = _kafka_uuid()
        for node_id, (port, controller) in ports.items():
            home = workdir / f"node-{node_id}"
            home.mkdir(parents=True, exist_ok=True)
            config = home / "server.properties"
            config.write_text(self._server_properties(node_id, port, controller, quorum, home))
            command = [
                self._java,
                *self._heap_flags(),
                *self._jvm_options,
                "-cp",
                self._classpath,
                "kafka.Kafka",
                str(config),
            ]
            url = f"kafka://127.0.0.1:{port}"
            self._nodes[node_id] = _Node(node_id, command, port, url, home)
        with ThreadPoolExecutor(max_workers=len(self._nodes)) as pool:
            list(
                pool.map(
                    lambda node: self._format(node, cluster_id, directory_ids, initial),
                    self._nodes.values(),
                )
            )

    def _server_properties(
        self, node_id: int, port: int, controller: int, quorum: str, home: Path
    ) -> str:
        replicas = min(self._brokers, 3)
        min_isr = 2 if replicas >= 3 else 1
        properties: dict[str, str] = {
            "process.roles": "broker,controller",
            "node.id": str(node_id),
            "controller.quorum.bootstrap.servers": quorum,
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(home / "data"),
            "num.partitions": "1",
            # The internal topics on every node (3 at most), as a production cluster has them.
            "offsets.topic.replication.factor": str(replicas),
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(min_isr),
            "share.coordinator.state.topic.replication.factor": str(replicas),
            "share.coordinator.state.topic.min.isr": str(min_isr),
            # Timing only, for quick tests; no rule of the protocol changes:
            # a group's first join does not wait 3 s for more members;
            "group.initial.rebalance.delay.ms": "0",
            # 4 partitions instead of 50 for the group and transaction state topics: their
            # first use (the first group, the first transactional producer) creates them, and
            # 50 partitions times the replicas take seconds;
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.num.partitions": "4",
            # a killed node is fenced (its partitions get new leaders) after 4 s, not 9 s;
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "4000",
            # the coordinator aborts a transaction that outlived its transaction.timeout.ms
            # within 1 s of it, not 10 s;
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
            # leaders move only when a test moves them or a node leaves, never by a periodic
            # rebalance in the middle of a test.
            "auto.leader.rebalance.enable": "false",
        }
        properties.update(self._properties)
        return "".join(f"{key}={value}\n" for key, value in properties.items())

    def _heap_flags(self) -> list[str]:
        match = re.fullmatch(r"(\d+)([kKmMgG]?)", self._heap)
        if match is None:
            raise ConfigurationError(f"heap is a JVM size like '512m' or '1g', not {self._heap!r}")
        megabytes = (
            int(match[1]) * {"k": 1 / 1024, "m": 1, "g": 1024, "": 1 / 2**20}[match[2].lower()]
        )
        # Start small (a test broker needs ~100 MB), grow up to ``heap``.
        return [f"-Xms{min(128, max(1, int(megabytes)))}m", f"-Xmx{self._heap}"]

    def _format(
        self, node: _Node, cluster_id: str, directory_ids: dict[int, str], initial: str
    ) -> None:
        if (node.workdir / "data" / "meta.properties").exists():
            return  # a given workdir that holds a formatted node: keep its data
        command = [
            self._java,
            *_JVM_FLAGS,
            "-cp",
            self._classpath,
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            cluster_id,
            "--config",
            str(node.workdir / "server.properties"),
            "--feature",
            f"transaction.version={self._transaction_version}",
        ]
        if self._brokers == 1:
            command.append("--standalone")
        else:
            command += ["--initial-controllers", initial]
        result = subprocess.run(
            command, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=node.workdir
        )
        (node.workdir / "format.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            raise BrokerUnavailable(
                f"formatting Apache Kafka node {node.node_id} failed "
                f"(exit code {result.returncode}):\n"
                f"{_readable_tail(result.stdout + result.stderr)}"
            )
        # StorageTool gave the node a directory id of its own; the quorum's must match.
        meta = node.workdir / "data" / "meta.properties"
        if self._brokers > 1:
            text = meta.read_text()
            assert directory_ids[node.node_id] in text, text

    def stop(self) -> None:
        """Stop every node and remove the work directory if this object made it. Safe to call
        again. The nodes of a temp directory are killed (SIGKILL): their data is about to go,
        and a graceful shutdown of a whole cluster takes seconds (the last nodes wait for a
        quorum that is leaving); those of a given ``workdir`` get SIGTERM together, and
        SIGKILL if still running 15 s later."""
        self._admin = None
        nodes = list(self._nodes.values())
        graceful = self._given_workdir is not None
        for node in nodes:
            if not graceful:
                node.kill()
            elif node.process is not None and node.running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15.0
        for node in nodes:
            node.stop(wait=max(0.0, deadline - time.monotonic()))
        self._nodes.clear()
        self._close_workdir()

    def __repr__(self) -> str:
        if not self._nodes:
            return f"<ApacheKafka {self.version} {self._brokers} nodes, stopped>"
        up = [node_id for node_id in self.node_ids if self.running(node_id)]
        return f"<ApacheKafka {self.version} {self.bootstrap_servers} running {up}>"

    # ------------------------------------------------------------------ node faults

    def running(self, node_id: int) -> bool:
        """Node ``node_id``'s process is alive."""
        return self._node(node_id).running

    def kill(self, node_id: int) -> None:
        """SIGKILL node ``node_id`` (a crash: no graceful shutdown). Its partitions get new
        leaders once the controller fences it (~4 s, see :meth:`wait_for_leaders`);
        :meth:`restart` brings it back."""
        self._node(node_id).kill()

    def stop_broker(self, node_id: int, wait: float = 30.0) -> None:
        """Stop node ``node_id`` gracefully (SIGTERM: its leaders move first) and wait until it
        exited (SIGKILL after ``wait`` seconds)."""
        self._node(node_id).stop(wait)

    def restart(self, node_id: int, wait: float = 60.0) -> None:
        """Start node ``node_id`` again (killing it first if it runs), on the same ports with
        the same data; returns once it is back in the cluster: started, in the metadata, and
        back in the ISR of every partition it holds a replica of. Leaders stay where they are
        (see :meth:`move_leader`)."""
        node = self._node(node_id)
        deadline = time.monotonic() + wait
        node.kill()
        node.launch()
        node.wait_started(deadline)
        self._wait(
            lambda: self._in_sync(node_id), deadline - time.monotonic(), f"node {node_id} to rejoin"
        )

    def _first_port(self) -> int:
        return self._node(self.node_ids[0]).port

    def reset(self) -> None:
        """Clear the fault proxy's faults and restart every node that is not running (see
        :meth:`restart`); nothing else when all run. Topics, records and leaders stay as they
        are. The pytest plugin calls it after each test."""
        self._clear_faults()
        for node_id in self.node_ids:
            if self._nodes and not self.running(node_id):
                self.restart(node_id)

    def _in_sync(self, node_id: int) -> bool:
        metadata = self._metadata(timeout=5)
        if node_id not in metadata.brokers:
            return False
        return all(
            node_id in partition.isrs
            for topic in metadata.topics.values()
            for partition in topic.partitions.values()
            if node_id in partition.replicas
        )

    # ------------------------------------------------------------------ topics and leaders

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 1,
        *,
        min_insync_replicas: int | None = None,
        config: Mapping[str, str | int] | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Create topic ``name`` (``config``: topic configs, e.g. ``{"retention.ms": 1000}``)
        and return once every partition has a leader. The broker's refusal (the topic exists,
        more replicas than running nodes...) is a
        :class:`~producerkit.errors.ConfigurationError` with its message."""
        from confluent_kafka.cimpl import NewTopic

        configs = {key: str(value) for key, value in (config or {}).items()}
        if min_insync_replicas is not None:
            configs["min.insync.replicas"] = str(min_insync_replicas)
        futures = self._admin_client().create_topics(
            [NewTopic(name, partitions, replication_factor, config=configs)],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        try:
            futures[name].result(timeout)
        except Exception as exc:
            raise ConfigurationError(f"creating topic {name!r}: {exc}") from exc
        self.wait_for_leaders(name, timeout=timeout)

    def leaders(self, topic: str) -> dict[int, int]:
        """Each partition of ``topic`` to its leader's node id (-1: none now), as the cluster's
        metadata says."""
        metadata = self._metadata(topic)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            raise ConfigurationError(f"no topic {topic!r}: {getattr(found, 'error', None)}")
        return {pid: partition.leader for pid, partition in sorted(found.partitions.items())}

    def leader_of(self, topic: str, partition: int) -> int:
        """The node id leading ``partition`` of ``topic`` (-1: none now)."""
        leaders = self.leaders(topic)
        if partition not in leaders:
            raise ConfigurationError(f"{topic!r} has no partition {partition}")
        return leaders[partition]

    def wait_for_leaders(
        self, topic: str, *, avoiding: Iterable[int] = (), timeout: float = 30.0
    ) -> dict[int, int]:
        """Wait until every partition of ``topic`` has a leader, none of the nodes
        ``avoiding`` (e.g. one just killed), in the metadata of every running node alike (a
        node applies the controller's changes a moment after another: a client asking it
        before then would not find the topic, or find the old leaders), and return them as
        :meth:`leaders` does."""
        excluded = set(avoiding)
        found: dict[int, int] = {}

        def elected() -> bool:
            nonlocal found
            views = self._leaders_on_each_node(topic)
            if views is None:
                return False
            found = views[0] if views else {}
            return (
                bool(found)
                and all(view == found for view in views)
                and all(leader >= 0 and leader not in excluded for leader in found.values())
            )

        self._wait(
            elected, timeout, f"every partition of {topic!r} to have a leader", not_yet=(OSError,)
        )
        return found

    def move_leader(
        self, topic: str, partition: int, to_node: int, *, timeout: float = 30.0
    ) -> None:
        """Make node ``to_node`` the leader of ``partition`` of ``topic``: reassign the replicas
        so that ``to_node`` comes first (adding it in place of the last replica if it holds
        none), then a preferred leader election; returns once it leads."""
        from confluent_kafka import ElectionType, TopicPartition

        if not self.running(to_node):
            raise ConfigurationError(f"node {to_node} is not running: it cannot lead")
        deadline = time.monotonic() + timeout
        replicas = list(self._partition(topic, partition).replicas)
        wanted = [to_node] + [node for node in replicas if node != to_node]
        if to_node not in replicas:
            wanted = wanted[: len(replicas)]
        if replicas != wanted:
            self._reassign(topic, partition, wanted)
            self._wait(
                lambda: (
                    list((found := self._partition(topic, partition)).replicas) == wanted
                    and to_node in found.isrs
                ),
                deadline - time.monotonic(),
                f"the replicas of {topic}-{partition} to become {wanted}",
            )

        def everywhere() -> bool:
            # Each node's metadata learns the new leader on its own: ask each, so that a
            # caller's next look (from any node) sees the new leader too.
            views = self._leaders_on_each_node(topic)
            return views is not None and all(view.get(partition) == to_node for view in views)

        def led() -> bool:
            if everywhere():
                return True
            futures = self._admin_client().elect_leaders(
                ElectionType.PREFERRED, [TopicPartition(topic, partition)]
            )
            # ELECTION_NOT_NEEDED, or not yet possible: look again.
            with contextlib.suppress(Exception):
                futures.result(max(1.0, deadline - time.monotonic()))
            return everywhere()

        self._wait(
            led,
            deadline - time.monotonic(),
            f"node {to_node} to lead {topic}-{partition}",
            not_yet=(OSError,),
        )

    def _leaders_on_each_node(self, topic: str) -> list[dict[int, int]] | None:
        """:meth:`leaders` as each running node's own metadata says (asked of each alone);
        None while one of them does not know ``topic``."""
        views = []
        for node_id in self.node_ids:
            if self.running(node_id):
                view = node_leaders("127.0.0.1", self._node(node_id).port, topic, timeout=5.0)
                if view is None:
                    return None
                views.append(view)
        return views

    def _reassign(self, topic: str, partition: int, replicas: list[int]) -> None:
        plan = {
            "version": 1,
            "partitions": [{"topic": topic, "partition": partition, "replicas": replicas}],
        }
        path = self.workdir / f"reassign-{topic}-{partition}.json"
        path.write_text(json.dumps(plan))
        result = subprocess.run(
            [
                self._java,
                *_JVM_FLAGS,
                "-cp",
                self._classpath,
                "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
                "--bootstrap-server",
                self.bootstrap_servers,
                "--reassignment-json-file",
                str(path),
                "--execute",
            ],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise ConfigurationError(
                f"reassigning {topic}-{partition} to {replicas} failed:\n"
                f"{_readable_tail(result.stdout + result.stderr)}"
            )

    # ------------------------------------------------------------------ reading back

    def read(
        self,
        topic: str,
        *,
        isolation: str = "read_committed",
        expected: int | None = None,
        timeout: float = 30.0,
    ) -> list[dict[str, Any]]:
        """The records of ``topic`` from the beginning of every partition, read by a
        confluent-kafka consumer with ``isolation.level=isolation`` (no group, no commits), in
        partition and offset order. Each is a dict: ``partition``, ``offset``, ``key``,
        ``value`` (bytes or None), ``headers`` (a list of (name, bytes or None) pairs, repeats
        kept) and ``timestamp`` (epoch ms, None if the record has none).

        With ``expected``: reads until that many arrived or ``timeout`` passed, then polls
        0.5 s more, so that a duplicate beyond the count shows; returns what it read (fewer
        than ``expected`` on a timeout). Without: reads until each partition's end as the
        broker serves it now (for ``read_committed``, the last stable offset: nothing from an
        open transaction's first record on), else ``TimeoutError``."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        from producerkit.testing.kafka_cluster import _as_bytes, _header_pairs

        if isolation not in ("read_committed", "read_uncommitted"):
            raise ConfigurationError(
                f"isolation is 'read_committed' or 'read_uncommitted', not {isolation!r}"
            )
        deadline = time.monotonic() + timeout
        partitions = sorted(self.leaders(topic))
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "group.id": "producerkit-apache-kafka-read",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": isolation,
                "fetch.wait.max.ms": 50,
                "log_level": 3,
            }
        )
        records: list[dict[str, Any]] = []
        pending = set(partitions)
        try:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
            while True:
                if expected is None and not pending:
                    break
                if expected is not None and len(records) >= expected:
                    deadline = min(deadline, time.monotonic() + 0.5)
                    expected = None
                    pending = set()  # the extra poll: until that short deadline
                left = deadline - time.monotonic()
                if left <= 0:
                    if expected is None and pending:
                        raise TimeoutError(
                            f"read {len(records)} records of {topic!r} in {timeout} s; "
                            f"partitions {sorted(pending)} did not reach their end"
                        )
                    break
                message = consumer.poll(min(left, 0.2))
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(message.partition())
                    elif error.fatal():
                        raise BrokerUnavailable(f"reading {topic!r}: {error.str()}")
                    continue
                timestamp_type, timestamp = message.timestamp()
                records.append(
                    {
                        "partition": message.partition(),
                        "offset": message.offset(),
                        "key": _as_bytes(message.key()),
                        "value": _as_bytes(message.value()),
                        "headers": _header_pairs(message.headers()),
                        "timestamp": timestamp if timestamp_type else None,
                    }
                )
        finally:
            consumer.close()
        records.sort(key=lambda record: (record["partition"], record["offset"]))
        return records

    # ------------------------------------------------------------------ internals

    def _started_nodes(self) -> Iterable[_Node]:
        if not self._nodes:
            raise ConfigurationError("this ApacheKafka is not started")
        return self._nodes.values()

    def _node(self, node_id: int) -> _Node:
        self._started_nodes()
        node = self._nodes.get(node_id)
        if node is None:
            raise ConfigurationError(f"no node {node_id!r}: this cluster's are {self.node_ids}")
        return node

    def _admin_client(self) -> Any:
        if self._admin is None:
            try:
                from confluent_kafka.admin import AdminClient
            except ImportError as exc:
                raise MissingDependencyError(
                    f"ApacheKafka's admin calls need confluent-kafka: {_INSTALL_PYTHON}"
                ) from exc
            self._admin = AdminClient(
                {
                    "bootstrap.servers": self.bootstrap_servers,
                    "allow.auto.create.topics": False,
                    "log_level": 3,
                }
            )
        return self._admin

    def _metadata(self, topic: str | None = None, timeout: float = 10.0) -> Any:
        """confluent-kafka's ClusterMetadata, by a Metadata request that creates no topic."""
        return self._admin_client().list_topics(topic, timeout=timeout)

    def _partition(self, topic: str, partition: int) -> Any:
        found = self._metadata(topic).topics.get(topic)
        if found is None or partition not in found.partitions:
            raise ConfigurationError(f"no partition {partition} of {topic!r}")
        return found.partitions[partition]

    def _wait(
        self,
        condition: Callable[[], bool],
        timeout: float,
        what: str,
        *,
        not_yet: tuple[type[BaseException], ...] = (),
    ) -> None:
        """:meth:`LocalCluster._wait`, where the condition's Kafka errors count as not yet."""
        from confluent_kafka import KafkaException

        super()._wait(condition, timeout, what, not_yet=(KafkaException, *not_yet))
