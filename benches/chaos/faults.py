"""The faults: the plan (seeded; modes drawn from a shuffled bag), the fault proxy's, and each
cluster's own (:class:`ClusterFaults` for librdkafka's mock, :class:`ApacheFaults`,
:class:`JetStreamFaults`), applied one after the other by :func:`inject_faults`."""

from __future__ import annotations

import asyncio
import math
import random
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from producerkit.testing.brokers import BrokerFaults
from producerkit.testing.proxy import FaultLog, FaultProxy

if TYPE_CHECKING:
    from chaos.judges.kafka_recorder import RecordingKafkaCluster
    from producerkit.testing.apache_kafka import ApacheKafka
    from producerkit.testing.nats_cluster import JetStreamCluster

    Cluster = RecordingKafkaCluster | ApacheKafka | JetStreamCluster

#: The proxy's faults on both backends; ``kill`` only where the store survives it (JetStream).
PROXY_MODES = ("stall", "blackhole", "reset", "refuse", "slow")
#: The cluster's own faults (``--backend kafka-cluster``): every partition's leader moved; a
#: leader's broker down, its partitions moved MOVE_AFTER s later, back up later; bursts of
#: Produce errors. See ClusterFaults.
CLUSTER_MODES = ("leaders", "broker_down", "errors")
#: Apache Kafka's node faults (``--backend kafka-apache``): kill -9 of a node that leads
#: partitions and its restart; every partition's leader moved. See ApacheFaults.
APACHE_MODES = ("kill", "leaders")
#: The JetStream cluster's server faults (``--backend jetstream-cluster``): kill -9 of any
#: server and its restart; the stream's leader stepped down. See JetStreamFaults.
JETSTREAM_CLUSTER_MODES = ("kill", "step_down")
#: How a kill window's detail names the stream's leader as its victim (the plot marks it).
LEADER_VICTIM = "the stream's leader"
#: Faults that start and end at once (a leader move's window lasts until it is done).
INSTANT_MODES = ("reset", "leaders", "step_down")
GAP = (5.0, 20.0)
DURATION = (1.0, 10.0)
REPLICATION = 3
#: Apache Kafka's topic: a write is acked once 2 of its 3 replicas hold it (acks=all), so one
#: node down at a time loses nothing acked.
MIN_INSYNC_REPLICAS = 2
#: Apache Kafka's topic's log segments: a node killed replays its active segments from the last
#: recovery point on restart (Kafka's default segment of 1 GB: all of it), before it serves.
SEGMENT_BYTES = 16 * 1024 * 1024
#: How long a killed node may take to start again and rejoin every ISR.
RESTART_WAIT = 120.0
MOVE_AFTER = 2.0
#: ``errors``: a burst of 1-8 of these every 0.2-1 s for the fault's duration, answered to the
#: next Produce requests on any broker (each failed request stores nothing), and in 1 burst of
#: SEQUENCE_ERROR_SHARE one of SEQUENCE_ERRORS, which make an idempotent producer bump its epoch.
RETRIABLE_ERRORS = ("NOT_LEADER_OR_FOLLOWER", "NOT_ENOUGH_REPLICAS", "REQUEST_TIMED_OUT")
SEQUENCE_ERRORS = ("OUT_OF_ORDER_SEQUENCE_NUMBER", "UNKNOWN_PRODUCER_ID")
SEQUENCE_ERROR_SHARE = 0.1
BURST = (1, 8)
BURST_EVERY = (0.2, 1.0)
#: ``slow`` carries this many bytes/s each way (log-uniform).
SLOW_RATE = (20_000.0, 200_000.0)


def default_modes(backend: str) -> tuple[str, ...]:
    """Every fault the backend takes: the proxy's; JetStream's kill -9 (its file store survives
    it; Tansu's memory store would not); the cluster's own."""
    if backend == "jetstream":
        return (*PROXY_MODES, "kill")
    if backend == "kafka-cluster":
        return PROXY_MODES + CLUSTER_MODES
    if backend == "kafka-apache":
        return PROXY_MODES + APACHE_MODES
    if backend == "jetstream-cluster":
        return PROXY_MODES + JETSTREAM_CLUSTER_MODES
    return PROXY_MODES


def fault_plan(
    rng: random.Random, modes: tuple[str, ...]
) -> Iterator[tuple[float, str, float, float]]:
    """(gap before it, mode, seconds, slow's bytes/s) for ever; modes from a shuffled bag."""
    bag: list[str] = []
    while True:
        if not bag:
            bag = list(modes)
            rng.shuffle(bag)
        mode = bag.pop()
        gap = rng.uniform(*GAP)
        seconds = 0.0 if mode in INSTANT_MODES else rng.uniform(*DURATION)
        if mode == "broker_down":
            seconds += MOVE_AFTER  # down, MOVE_AFTER s to the move, then 1-10 s until up
        rate = math.exp(rng.uniform(*map(math.log, SLOW_RATE)))
        yield gap, mode, seconds, rate


class HarnessError(Exception):
    """The run does not test what it says: its verdict is FAIL, whatever the checks say."""


class NodeFaults:
    """A cluster's own faults (``modes``) on the load's ``topic`` of ``partitions`` partitions
    over brokers ``brokers``, each logged as a window in :attr:`log` (the proxy's are in its
    own); choices drawn from ``rng``. What both clusters share: their topics (``replication``
    3), where every leader moves to, which broker a fault takes down, and the reset after the
    load."""

    modes: tuple[str, ...] = ()

    def __init__(
        self,
        cluster: Cluster,
        brokers: Sequence[int],
        topic: str,
        partitions: int,
        rng: random.Random,
    ) -> None:
        self.cluster = cluster
        self.brokers = list(brokers)
        self.topic = topic
        self.partitions = partitions
        self.rng = rng
        self.log = FaultLog()

    def create_topic(self, name: str) -> None:
        raise NotImplementedError

    async def apply(self, mode: str, seconds: float) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Every broker up, the proxy's faults cleared (after the load)."""
        self.cluster.reset()

    def report(self) -> dict[str, Any]:
        return {"brokers": len(self.brokers), "replication": REPLICATION}

    def elsewhere(self, leaders: dict[int, int]) -> dict[int, int]:
        """Each partition's next leader: another broker, at random."""
        return {
            p: self.rng.choice([b for b in self.brokers if b != leader])
            for p, leader in leaders.items()
        }

    def victim(self, leaders: dict[int, int]) -> int:
        """A broker that leads partitions, at random."""
        return self.rng.choice(sorted(set(leaders.values()) - {-1}))

    @staticmethod
    def moves(before: dict[int, int], after: dict[int, int]) -> str:
        return " ".join(f"p{p}:{before[p]}->{b}" for p, b in after.items())


class ClusterFaults(NodeFaults):
    """The mock cluster's own faults: ``leaders`` moves every partition's leader to another
    broker (at once); ``broker_down`` takes a broker that leads partitions down, moves its
    partitions to the others MOVE_AFTER s later and takes it back up when the fault ends;
    ``errors`` answers bursts of the next Produce requests with retriable errors (rarely a
    sequence error) until it ends, then drops what is left of them. Leaders are kept here
    (partition p starts on broker p % N + 1, as ``create_topic`` puts it)."""

    modes = CLUSTER_MODES

    def __init__(
        self, cluster: RecordingKafkaCluster, topic: str, partitions: int, rng: random.Random
    ) -> None:
        super().__init__(cluster, cluster.broker_ids, topic, partitions, rng)
        self.mock = cluster
        self.leaders = {p: self.brokers[p % len(self.brokers)] for p in range(partitions)}
        #: told the leaders after each move
        self.watchers: list[Callable[[dict[int, int]], None]] = []
        self.errors_pushed: Counter[str] = Counter()

    def create_topic(self, name: str) -> None:
        self.mock.create_topic(name, partitions=self.partitions, replication=REPLICATION)

    async def apply(self, mode: str, seconds: float) -> None:
        if mode == "leaders":
            await self.move_leaders()
        elif mode == "broker_down":
            await self.broker_down(seconds)
        else:
            await self.request_errors(seconds)

    async def move_leaders(self) -> None:
        moved = self.elsewhere(self.leaders)
        self.log.instant("leaders", self.moves(self.leaders, moved))
        await asyncio.to_thread(self._set_leaders, moved)

    async def broker_down(self, seconds: float) -> None:
        victim = self.victim(self.leaders)
        others = [b for b in self.brokers if b != victim]
        led = sorted(p for p, b in self.leaders.items() if b == victim)
        moved = {p: others[k % len(others)] for k, p in enumerate(led)}
        window = self.log.open(
            "broker_down",
            f"broker {victim} down, its partitions "
            + " ".join(f"p{p}->{b}" for p, b in moved.items())
            + f" {MOVE_AFTER:g} s later, up after {seconds:.1f} s",
        )
        try:
            await asyncio.to_thread(self.mock.broker_down, victim)
            await asyncio.sleep(MOVE_AFTER)
            await asyncio.to_thread(self._set_leaders, moved)
            await asyncio.sleep(seconds - MOVE_AFTER)
            await asyncio.to_thread(self.mock.broker_up, victim)
        finally:
            self.log.close(window)

    async def request_errors(self, seconds: float) -> None:
        bursts: list[tuple[float, list[str]]] = []  # drawn first: the window names them all
        at = 0.0
        while at < seconds:
            burst = [self.rng.choice(RETRIABLE_ERRORS) for _ in range(self.rng.randint(*BURST))]
            if self.rng.random() < SEQUENCE_ERROR_SHARE:
                burst.insert(self.rng.randrange(len(burst) + 1), self.rng.choice(SEQUENCE_ERRORS))
            bursts.append((at, burst))
            at += self.rng.uniform(*BURST_EVERY)
        counts = Counter(error for _, burst in bursts for error in burst)
        window = self.log.open(
            "errors",
            f"{len(bursts)} bursts over {seconds:.1f} s: "
            + ", ".join(f"{name} x{n}" for name, n in sorted(counts.items())),
        )
        started = time.monotonic()
        try:
            for at, burst in bursts:
                await asyncio.sleep(max(0.0, started + at - time.monotonic()))
                await asyncio.to_thread(self.mock.fail_requests, "Produce", burst)
                self.errors_pushed.update(burst)
            await asyncio.sleep(max(0.0, started + seconds - time.monotonic()))
        finally:
            await asyncio.to_thread(self.mock.clear_request_errors, "Produce")
            self.log.close(window)

    def _set_leaders(self, moved: dict[int, int]) -> None:
        for partition, broker in moved.items():
            self.mock.set_leader(self.topic, partition, broker)
            self.leaders[partition] = broker
        for watcher in self.watchers:
            watcher(self.leaders)


class ApacheFaults(NodeFaults):
    """Apache Kafka's node faults: ``kill`` sends SIGKILL to a node that leads partitions of
    the topic (a crash: the controller fences it and elects new leaders among the ISR, ~4 s),
    starts it again after the fault's 1-10 s, on the same ports and data, and the window stays
    open until it is back in every ISR; ``leaders`` moves every partition's leader to another
    node, one partition after the other (a reassignment putting it first among the replicas,
    then a preferred election: a few seconds each, the window open meanwhile). Leaders are read
    from the cluster's metadata each time (a kill moves them too)."""

    modes = APACHE_MODES

    def __init__(self, kafka: ApacheKafka, topic: str, partitions: int, rng: random.Random) -> None:
        super().__init__(kafka, kafka.node_ids, topic, partitions, rng)
        self.kafka = kafka
        self.done: Counter[str] = Counter()

    def create_topic(self, name: str) -> None:
        self.kafka.create_topic(
            name,
            self.partitions,
            replication_factor=REPLICATION,
            min_insync_replicas=MIN_INSYNC_REPLICAS,
            config={"segment.bytes": SEGMENT_BYTES},
        )

    async def apply(self, mode: str, seconds: float) -> None:
        """Either fault; a cluster that does not do what was asked in time (a node that does not
        rejoin, a leader that does not move) is a HarnessError: the run would test less."""
        from producerkit.errors import ProducerkitError

        try:
            leaders = await asyncio.to_thread(self.kafka.leaders, self.topic)
            if mode == "leaders":
                await self.move_leaders(leaders)
            else:
                await self.kill(self.victim(leaders), leaders, seconds)
        except ProducerkitError as exc:
            raise HarnessError(f"Apache Kafka's {mode}: {exc}") from exc
        self.done[mode] += 1

    async def move_leaders(self, leaders: dict[int, int]) -> None:
        moved = self.elsewhere(leaders)
        window = self.log.open("leaders", self.moves(leaders, moved))
        try:
            for partition, node in moved.items():
                await asyncio.to_thread(self.kafka.move_leader, self.topic, partition, node)
        finally:
            self.log.close(window)

    async def kill(self, victim: int, leaders: dict[int, int], seconds: float) -> None:
        led = " ".join(f"p{p}" for p, node in leaders.items() if node == victim)
        window = self.log.open(
            "kill", f"node {victim} (leading {led}) kill -9, restarted after {seconds:.1f} s"
        )
        try:
            await asyncio.to_thread(self.kafka.kill, victim)
            await asyncio.sleep(seconds)
            await asyncio.to_thread(self.kafka.restart, victim, RESTART_WAIT)
        finally:
            self.log.close(window)

    def report(self) -> dict[str, Any]:
        return {
            **super().report(),
            "min_insync_replicas": MIN_INSYNC_REPLICAS,
            "version": self.kafka.version,
            "faults_done": dict(sorted(self.done.items())),
            "leaders_at_end": self.kafka.leaders(self.topic),
        }


class JetStreamFaults(NodeFaults):
    """The JetStream cluster's server faults on the load's stream: ``kill`` sends SIGKILL to any
    server (the stream's leader or one of its followers, at random; the producer may be
    connected to it), starts it again after the fault's 1-10 s on the same ports and store,
    and the window stays open until it reports itself healthy (back in the cluster, caught
    up); ``step_down`` asks the stream's leader to step down, the window open until another is
    elected. Each kill of the leader's server is kept in :attr:`leader_deaths`
    (``time.monotonic()``), for the time from a leader's death to the next ack."""

    modes = JETSTREAM_CLUSTER_MODES

    def __init__(self, cluster: JetStreamCluster, stream: str, rng: random.Random) -> None:
        super().__init__(cluster, cluster.server_ids, stream, 1, rng)
        self.jetstream = cluster
        self.done: Counter[str] = Counter()
        self.leader_deaths: list[float] = []

    async def apply(self, mode: str, seconds: float) -> None:
        """Either fault; a cluster that does not do what was asked in time (a server that does
        not come back, a stream without a leader) is a HarnessError."""
        from producerkit.errors import ProducerkitError

        try:
            leader = await asyncio.to_thread(self.jetstream.wait_for_leader, self.topic)
            if mode == "step_down":
                await self.step_down(leader)
            else:
                # by role, not number (who leads is the cluster's choice): a seed kills the
                # leader's server the same times in every run
                followers = [server for server in self.brokers if server != leader]
                await self.kill(self.rng.choice([leader, *followers]), leader, seconds)
        except ProducerkitError as exc:
            raise HarnessError(f"the JetStream cluster's {mode}: {exc}") from exc
        self.done[mode] += 1

    async def step_down(self, leader: int) -> None:
        window = self.log.open("step_down", f"leader n{leader} steps down")
        try:
            await asyncio.to_thread(self.jetstream.step_down, self.topic)
        finally:
            self.log.close(window)

    async def kill(self, victim: int, leader: int, seconds: float) -> None:
        role = LEADER_VICTIM if victim == leader else f"a follower (leader n{leader})"
        window = self.log.open(
            "kill", f"server n{victim}, {role}, kill -9, restarted after {seconds:.1f} s"
        )
        try:
            await asyncio.to_thread(self.jetstream.kill, victim)
            if victim == leader:
                self.leader_deaths.append(time.monotonic())
                self.done["kill_leader"] += 1
            await asyncio.sleep(seconds)
            await asyncio.to_thread(self.jetstream.restart, victim, RESTART_WAIT)
        finally:
            self.log.close(window)

    def report(self) -> dict[str, Any]:
        return {
            **super().report(),
            "faults_done": dict(sorted(self.done.items())),
            "leader_at_end": self.jetstream.leader_of(self.topic),
        }


async def inject_faults(
    faults: FaultProxy,
    plan: Iterator[tuple[float, str, float, float]],
    last_end: float,
    cluster: NodeFaults | None = None,
) -> None:
    """Apply the plan's faults one after the other until the next would end after
    ``last_end`` (``time.monotonic()``). Every control runs in a thread: kill and restart wait
    for the broker, and the proxy's controls wait for its thread. After each fault the proxy
    must accept connections again (HarnessError if not)."""
    for gap, mode, seconds, rate in plan:
        start = time.monotonic() + gap
        if start + seconds > last_end:
            return
        await asyncio.sleep(gap)
        if cluster is not None and mode in cluster.modes:
            await cluster.apply(mode, seconds)
        elif mode == "kill":
            assert isinstance(faults, BrokerFaults)
            await asyncio.to_thread(faults.kill)
            await asyncio.sleep(seconds)
            await asyncio.to_thread(faults.restart)
        elif mode == "reset":
            await asyncio.to_thread(faults.reset)
        elif mode == "slow":
            await asyncio.to_thread(faults.slow, seconds, rate)
            await asyncio.sleep(seconds)
        else:
            await asyncio.to_thread(getattr(faults, mode), seconds)
            await asyncio.sleep(seconds)
        await asyncio.to_thread(check_accepting, faults, mode)


def check_accepting(faults: FaultProxy, mode: str, wait: float = 3.0) -> None:
    """The proxy takes a connection within ``wait`` seconds (its fault over), else HarnessError."""
    host, port = faults.host_port.rsplit(":", 1)
    deadline = time.monotonic() + wait
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise HarnessError(
                    f"the fault proxy refuses connections after its {mode} ended ({exc})"
                ) from exc
            time.sleep(0.1)
