"""Chaos: open-loop keyed load through a fault proxy, random faults, then every message checked
against what the broker stored.

    python benches/chaos.py --minutes M --seed S
        --backend kafka|jetstream|kafka-cluster|kafka-apache|jetstream-cluster
        [--preset throughput] [--rate N] [--json PATH] [--plot PATH]

The broker is started here from the installed wheels, behind a ``BrokerFaults`` proxy that the
producer connects through: Tansu with memory storage (a topic of ``--partitions`` partitions,
created with aiokafka's admin client) or nats-server with JetStream on file storage in a temp dir
(``create_stream=True, stream_storage="file"``, each message with a unique ``msg_id``). Or
(``kafka-cluster``) librdkafka's mock cluster of 3 brokers in this process
(``producerkit.testing.KafkaCluster``, recording the idempotent Produce batches), a topic of
``--partitions`` partitions with replication 3, behind the cluster's own fault proxy. Or
(``kafka-apache``) three real Apache Kafka nodes (``producerkit.testing.ApacheKafka``, each a
broker and a KRaft controller, run from the Maven Central jars: Java 17+), a topic of
``--partitions`` partitions with replication 3 and ``min.insync.replicas`` 2, behind the fault
proxy in front of node 1 (Metadata rewritten: every connection passes through it). Or
(``jetstream-cluster``) three nats-servers routed as one JetStream cluster
(``producerkit.testing.JetStreamCluster``, not advertising each other to clients), the producer
given all three through the fault proxy (a listener each) and creating its stream R3 on file
storage (``create_stream=True, stream_replicas=3``); messages carry a ``msg_id`` in alternate
runs of ID_RUN (the others, without one, go in fast batches where they come in bursts).

1. Capacity: without faults, the producer publishes as fast as it can for ``--capacity-seconds``
   to a topic of its own; the load runs at half that rate (or at ``--rate``).
2. Load: message i is due at ``t0 + i / rate`` whatever happened to message i-1 (open loop: while
   produce() blocks the schedule runs on, and the messages due meanwhile are sent late, in a
   burst). Each has one of ``--keys`` keys, chosen at random (seeded); its value carries its id,
   its key and its sequence number within the key. ``produce(nonblocking=True)`` with the id as
   ``context``; ``on_delivery`` records each outcome (offset, or error type and
   ``possibly_stored``) with its ``time.monotonic()`` stamp, and each produce() call is timed.
3. Faults (seeded): after a quiet gap of 5-20 s, one of the proxy's stall, blackhole, reset,
   refuse, slow, or (JetStream: its file store survives) kill -9 of the broker and a restart,
   lasting 1-10 s, or on the cluster one of its own (``ClusterFaults``: every leader moved; a
   leader's broker down, its partitions moved 2 s later, up again 1-10 s after that; bursts of
   retriable Produce errors, rarely a sequence error), or on Apache Kafka one of its nodes'
   (``ApacheFaults``: kill -9 of a node leading partitions, restarted 1-10 s later, the window
   open until it is back in every ISR; every leader moved, a reassignment and a preferred
   election a partition), or on the JetStream cluster its servers' (``JetStreamFaults``: kill
   -9 of any server, restarted 1-10 s later, the window open until it is healthy again; the
   stream's leader stepped down); modes are drawn from a shuffled bag, so
   each comes before any repeats. None starts unless it ends ``timeout + 3`` s before the load
   does. Windows come from the proxy's log (and the cluster faults' own).
4. End: stop producing, clear the faults, close the producer (every message now has an outcome),
   stop the proxy, let the broker settle, and read everything back with another client straight
   from the broker (aiokafka consumers, a partition each, to the high watermark; their Fetch wait
   made for Tansu's memory store, see READ_WAIT / nats-py pull consumer). The cluster's mock
   keeps only the last 5 MB of each partition, so its topic is read while the load runs
   (``LiveReader``), and duplicates and per-key order are judged on the log Apache Kafka would
   have kept (``KafkaReplay``): the mock stores an idempotent producer's retried batch again and
   a batch past a sequence gap at once, where Kafka would not. Apache Kafka keeps everything and
   judges the producer's sequences itself: its topic is read at the end by a confluent-kafka
   consumer (librdkafka: a client apart from producerkit's) with ``isolation.level`` at
   ``read_committed``, every partition to its high watermark. The JetStream cluster's stream
   is read like one server's, straight from the servers.

Exit code 0 when every must-be-0 check holds (see ``CHECKS`` and docs/reliability.md, "Chaos
runs"), 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import platform
import random
import socket
import struct
import sys
import time
import uuid
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import producerkit as pk
from producerkit.testing.brokers import (
    BrokerFaults,
    LocalBroker,
    create_kafka_topic,
    start_kafka,
    start_nats,
)
from producerkit.testing.proxy import FaultLog, FaultProxy

if TYPE_CHECKING:
    from producerkit.testing.apache_kafka import ApacheKafka
    from producerkit.testing.kafka_cluster import KafkaCluster
    from producerkit.testing.nats_cluster import JetStreamCluster
    from producerkit.testing.transaction_view import BatchLog

    Cluster = KafkaCluster | ApacheKafka | JetStreamCluster

VALUE_SIZE = 100
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
CLUSTER_BROKERS = 3
#: The cluster's default rate cap (msg/s): the mock keeps the last 5 MB of each partition and
#: answers each partition entry of a Fetch with one batch, found by walking the partition's
#: batches from the oldest (about 0.5 ms at the end of 5 MB of one-record batches), in the one
#: thread that also takes the producer's requests; the live read-back keeps up at this rate
#: (2,000 msg/s: within 1,600 records of the end over 4 minutes) on this 2-core machine.
CLUSTER_MAX_RATE = 2000.0
REPLICATION = 3
#: Apache Kafka's topic: a write is acked once 2 of its 3 replicas hold it (acks=all), so one
#: node down at a time loses nothing acked.
MIN_INSYNC_REPLICAS = 2
#: Apache Kafka's default rate cap (msg/s): three JVMs and the producer share this machine's 2
#: cores, and the topic is read back at the end (some 16 MB of log a minute on each node at
#: this rate). At 5,000 msg/s (load 15 on this machine) a node killed after 20 minutes had not
#: rejoined the ISR a minute after its restart.
APACHE_MAX_RATE = 2000.0
#: Apache Kafka's topic's log segments: a node killed replays its active segments from the last
#: recovery point on restart (Kafka's default segment of 1 GB: all of it), before it serves.
SEGMENT_BYTES = 16 * 1024 * 1024
#: The JetStream cluster's default rate cap (msg/s): three nats-servers store every message
#: three times (R3, file storage) on the same 2 cores as the producer and the proxy, and a
#: server killed catches up on what it missed before it reports itself healthy.
JETSTREAM_CLUSTER_MAX_RATE = 2000.0
#: On the JetStream cluster messages i with ``(i // ID_RUN) % 2 == 0`` carry a msg_id (sent
#: one by one, each PubAck'd; duplicates among them must be 0) and the others none (in fast
#: batches where a burst brings 8 or more at once; a lost PubAck fails them possibly stored).
ID_RUN = 1000
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
#: A produce() call may block at most this long past the producer's timeout.
BLOCK_LIMIT = 1.0
SETTLE = 2.0
#: A read-back ends after this many empty polls of 1 s in a row, once it has read as far as the
#: broker said it holds (else after GIVE_UP_POLLS: what is missing is then reported as such).
QUIET_POLLS = 3
GIVE_UP_POLLS = 30
#: How long reading back a JetStream cluster's stream waits out "no responders" in a row (an
#: election after the last fault).
ELECTION_WAIT_S = 60.0
#: Tansu's memory store answers a Fetch with at most 5 MB, and for each partition it serves
#: lists every batch stored in that partition (about 1 us each) before it reads any, again for
#: each further piece of the 5 MB, until the Fetch's max wait is up: a listing still running then
#: brings nothing. At aiokafka's 500 ms a partition of a million batches (a 30-minute run)
#: is never served; at 20 s a Fetch lists it ten times. So: READ_WAIT s, doubled while a
#: partition gets nothing (up to READ_WAIT_MAX), READ_PARALLEL partitions at a time.
READ_WAIT = 5.0
READ_WAIT_MAX = 80.0
READ_PARALLEL = 2
FETCH_BYTES = 5 * 1024 * 1024
#: The cluster's live read-back reads on to the end offsets for at most this long after the load.
FINISH_WAIT = 120.0
#: ... and asks for this many offsets a partition in one Fetch (the mock answers each entry with
#: the one batch holding it, and a Fetch a partition would cap the read at the round trips).
FETCH_AHEAD = 32
#: Messages shown per failed check.
EXAMPLES = 20
SAMPLE_EVERY = 0.5
#: Sent (blocking) before the load, so the load's topic is known and its stream made.
WARM_UP = b"warm-up"

# Each message's state.
PENDING, ACKED, FAILED_UNSTORED, FAILED_STORED, RAISED = range(5)


class Ledger:
    """Every message of the load by id: when produce() was called for it, when it settled and
    how (arrays, one entry per message, preallocated), and everything reported twice."""

    def __init__(self, capacity: int, t0: float) -> None:
        self.t0 = t0
        self.sent = 0
        # Seconds since t0 as float32 (0.2 ms apart at 30 minutes) and offsets as uint32 (+1,
        # 0: none): some 15 bytes a message, so a 30-minute run fits in memory.
        self.send_at = array("f", bytes(4 * capacity))
        self.settle_at = array("f", bytes(4 * capacity))
        self.status = bytearray(capacity)
        self.error = bytearray(capacity)  # index into error_names, for the failed
        self.partition = array("b", bytes(capacity))
        self.offset = array("I", bytes(4 * capacity))
        self.error_names: list[str] = [""]
        #: each error type's first message, as the Failure gave it
        self.first_errors: dict[str, str] = {}
        self.double_outcomes = 0
        self.duplicate_acks = 0  # Delivery.duplicate: JetStream recognised the msg_id
        self.longest_call = 0.0
        self.longest_call_at = 0.0
        self.latest_send = 0.0  # the most a message was sent after its due time
        self.stopped = False  # the load ends before its schedule does (a harness error)

    @property
    def nbytes(self) -> int:
        arrays = (self.send_at, self.settle_at, self.partition, self.offset)
        return sum(a.itemsize * len(a) for a in arrays) + 2 * len(self.status)

    def on_delivery(self, result: pk.Delivery | pk.Failure, context: Any) -> None:
        if context is None:
            return  # the capacity run
        i: int = context
        if self.status[i] != PENDING:
            self.double_outcomes += 1
            return
        self.settle_at[i] = time.monotonic() - self.t0
        if isinstance(result, pk.Delivery):
            self.status[i] = ACKED
            self.partition[i] = -1 if result.partition is None else result.partition
            self.offset[i] = 0 if result.offset is None else result.offset + 1
            self.duplicate_acks += result.duplicate
        else:
            self.fail(
                i, result.exception, FAILED_STORED if result.possibly_stored else FAILED_UNSTORED
            )

    def describe(self, i: int) -> dict[str, Any]:
        """One message's record, for the examples of a failed check."""
        status = ("pending", "acked", "failed", "failed, possibly stored", "raised")
        offset = self.offset[i]
        return {
            "id": i,
            "status": status[self.status[i]],
            "sent_s": round(self.send_at[i], 4),
            "settled_s": round(self.settle_at[i], 4),
            "error": self.error_names[self.error[i]] or None,
            "partition": self.partition[i],
            "offset": offset - 1 if offset else None,
        }

    def fail(self, i: int, exception: BaseException, status: int) -> None:
        self.status[i] = status
        self.settle_at[i] = time.monotonic() - self.t0
        name = type(exception).__name__
        if name not in self.error_names:
            self.error_names.append(name)
            self.first_errors[name] = str(exception)[:400]
        self.error[i] = self.error_names.index(name)


class Stored:
    """What the broker holds, read back: copies per message id, whether a copy sits where its
    Delivery said, and per-key order among first copies. Filled by :meth:`visit` record by
    record, or at once by :meth:`from_positions` (the cluster's live read-back); then
    ``positions`` (partition -> the message id + 1 at each offset, 0: none of this run's) and
    each message's ``key`` and ``sequence`` are kept too, for :func:`kafka_view`."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.copies = bytearray(ledger.sent)
        self.at_offset = bytearray(ledger.sent)
        self.records = 0
        self.warm_ups = 0
        self.duplicates = 0
        self.unknown = 0
        self.order_violations = 0
        #: (id, stored offset, the id and stored offset of the later one it came after)
        self.order_examples: list[tuple[int, int, int, int]] = []
        self._last: dict[tuple[int, int], tuple[int, int, int]] = {}  # seq, id, offset
        self.positions: dict[int, Any] | None = None
        self.key: Any = None
        self.sequence: Any = None

    def visit(self, partition: int, offset: int, value: bytes) -> None:
        if value == WARM_UP:
            self.warm_ups += 1
            return
        self.records += 1
        try:
            i_text, key_text, seq_text, _ = value.split(b" ", 3)
            i, key, seq = int(i_text), int(key_text), int(seq_text)
        except ValueError:
            self.unknown += 1
            return
        ledger = self.ledger
        if not 0 <= i < ledger.sent:
            self.unknown += 1
            return
        if ledger.partition[i] == partition and ledger.offset[i] == offset + 1:
            self.at_offset[i] = 1
        copies = self.copies[i]
        if copies:
            self.duplicates += 1
            self.copies[i] = min(copies + 1, 255)
            return  # order is judged on first copies: a retry's second copy is a duplicate
        self.copies[i] = 1
        last = self._last.get((partition, key))
        if last is not None and seq < last[0]:
            self.order_violations += 1
            if len(self.order_examples) < EXAMPLES:
                self.order_examples.append((i, offset, last[1], last[2]))
        else:
            self._last[(partition, key)] = (seq, i, offset)

    @classmethod
    def from_positions(
        cls, ledger: Ledger, read: dict[str, Any], positions: dict[int, Any]
    ) -> Stored:
        """The same figures as :meth:`visit` gives, at once, from what the live read-back
        kept: ``positions`` (partition -> message id + 1 per offset, numpy), ``read``'s
        ``key``, ``sequence``, ``records``, ``warm_ups`` and ``unknown`` (ids past the
        messages sent count as unknown too)."""
        import numpy as np

        stored = cls(ledger)
        n = ledger.sent
        stored.positions, stored.key, stored.sequence = positions, read["key"], read["sequence"]
        stored.records, stored.warm_ups = read["records"], read["warm_ups"]
        stored.unknown = read["unknown"]
        everything = [ids[ids > 0].astype(np.int64) - 1 for ids in positions.values()]
        ids = np.concatenate(everything) if everything else np.zeros(0, np.int64)
        stored.unknown += int((ids >= n).sum())
        copies = np.bincount(ids[ids < n], minlength=n)[:n]
        stored.copies = bytearray(np.minimum(copies, 255).astype(np.uint8).tobytes())
        stored.duplicates = int(np.maximum(copies - 1, 0).sum())
        # A copy where the Delivery said: the message at its partition and offset is it.
        partition = np.frombuffer(ledger.partition, np.int8)[:n]
        offset = np.frombuffer(ledger.offset, np.uint32)[:n].astype(np.int64) - 1
        at = np.zeros(n, bool)
        for p, column in positions.items():
            mine = np.flatnonzero((partition == p) & (offset >= 0) & (offset < len(column)))
            at[mine] = column[offset[mine]] == mine + 1
        stored.at_offset = bytearray(at.astype(np.uint8).tobytes())
        # Per-key order among first copies, partition by partition, in offset order.
        key, sequence = np.asarray(read["key"]), np.asarray(read["sequence"])
        for _, column in sorted(positions.items()):
            where = np.flatnonzero((column > 0) & (column <= n))
            messages = column[where].astype(np.int64) - 1
            _, first = np.unique(messages, return_index=True)
            first.sort()
            firsts, at_offsets = messages[first], where[first]
            by_key = np.argsort(key[firsts], kind="stable")
            ordered = firsts[by_key]
            composite = (key[ordered].astype(np.int64) << 32) | sequence[ordered].astype(np.int64)
            highest = np.maximum.accumulate(composite)
            behind = np.flatnonzero(composite < np.concatenate(([-1], highest[:-1])))
            stored.order_violations += len(behind)
            for k in behind[: EXAMPLES - len(stored.order_examples)]:
                j = k - 1  # the highest before it, in its key's run
                while composite[j] != highest[k - 1]:
                    j -= 1
                stored.order_examples.append(
                    (
                        int(ordered[k]),
                        int(at_offsets[by_key[k]]),
                        int(ordered[j]),
                        int(at_offsets[by_key[j]]),
                    )
                )
        return stored


# --------------------------------------------------------------------------- faults


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
        self, cluster: KafkaCluster, topic: str, partitions: int, rng: random.Random
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


# --------------------------------------------------------------------------- load


def rss_mb(pid: int | None = None) -> float:
    """The resident memory of this process (or ``pid``): psutil's, else /proc's VmRSS."""
    try:
        import psutil  # type: ignore[import-untyped]

        return float(psutil.Process(pid).memory_info().rss) / 1e6
    except ImportError:
        pass
    except psutil.Error:
        return math.nan
    try:
        with open(f"/proc/{pid or 'self'}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1e3
    except OSError:
        pass
    return math.nan


class Messages:
    """Message i: one of ``keys`` keys (seeded), a value that carries ``"i key seq "`` (seq: the
    message's number within its key) padded to VALUE_SIZE, and on JetStream a unique msg_id
    (with ``id_runs``, only where :func:`has_msg_id`)."""

    def __init__(self, keys: int, seed: str, jetstream: bool, id_runs: bool = False) -> None:
        self._rng = random.Random(seed)
        self._keys = [b"key-%03d" % k for k in range(keys)]
        self._sequences = [0] * keys
        self._nonce = uuid.uuid4().hex[:8] if jetstream else None
        self._id_runs = id_runs
        self._pad = b"x" * VALUE_SIZE

    def make(self, i: int) -> tuple[bytes, bytes, str | None]:
        key = self._rng.randrange(len(self._keys))
        seq = self._sequences[key]
        self._sequences[key] = seq + 1
        head = b"%d %d %d " % (i, key, seq)
        with_id = self._nonce is not None and (not self._id_runs or has_msg_id(i))
        msg_id = f"{self._nonce}-{i}" if with_id else None
        return self._keys[key], head + self._pad[: VALUE_SIZE - len(head)], msg_id


def has_msg_id(i: Any) -> Any:
    """Whether message ``i`` (an int, or a numpy array of them) carries a msg_id where ids come
    in runs (the JetStream cluster): the even runs of ID_RUN."""
    return (i // ID_RUN) % 2 == 0


async def measure_capacity(
    producer: pk.Producer, topic: str, seconds: float, messages: Messages
) -> float:
    """Messages/s acked, publishing as fast as the producer takes them for ``seconds`` (the
    same messages and per-message work as the load, to a topic of its own)."""
    produce, monotonic = producer.produce, time.monotonic
    started = monotonic()
    count = 0
    while monotonic() - started < seconds:
        key, value, msg_id = messages.make(count)
        await produce(value, key=key, topic=topic, nonblocking=True, msg_id=msg_id)
        count += 1
    await producer.flush()
    return count / (monotonic() - started)


async def send_load(
    producer: pk.Producer, ledger: Ledger, rate: float, seconds: float, messages: Messages
) -> None:
    """The open-loop schedule: message i is due at ``t0 + i / rate``, for ``seconds``."""
    produce, monotonic, sleep, make = producer.produce, time.monotonic, asyncio.sleep, messages.make
    t0, count = ledger.t0, math.ceil(rate * seconds)
    send_at = ledger.send_at
    for i in range(count):
        if ledger.stopped:
            return
        due = t0 + i / rate
        now = monotonic()
        if due > now:
            await sleep(due - now)
            now = monotonic()
        elif i % 256 == 0:
            await sleep(0)  # behind schedule: let acks and the sampler in
            now = monotonic()
        key, value, msg_id = make(i)
        send_at[i] = now - t0
        ledger.sent = i + 1
        if now - due > ledger.latest_send:
            ledger.latest_send = now - due
        try:
            await produce(value, key=key, nonblocking=True, context=i, msg_id=msg_id)
        except Exception as exc:  # never admitted: nobody else will report it
            ledger.fail(i, exc, RAISED)
        took = monotonic() - now
        if took > ledger.longest_call:
            ledger.longest_call, ledger.longest_call_at = took, now - t0


async def sample(
    producer: pk.Producer,
    ledger: Ledger,
    active: Callable[[], tuple[str, ...]],
    samples: list[dict[str, Any]],
    live: LiveReader | None = None,
) -> None:
    """Every SAMPLE_EVERY s: the producer's stats and the RSS; every 10 s a progress line."""
    baseline = producer.stats
    next_line = 10.0
    while True:
        stats = producer.stats
        t = time.monotonic() - ledger.t0
        samples.append(
            {
                "t": round(t, 2),
                "in_flight": stats.in_flight,
                "produced": stats.produced - baseline.produced,
                "acked": stats.acked - baseline.acked,
                "failed": stats.failed - baseline.failed,
                "rss_mb": round(rss_mb(), 1),
                **({"read_lag": live.lag} if live is not None else {}),
            }
        )
        if t >= next_line:
            next_line += 10.0
            print(
                f"  t={t:6.0f}s sent={ledger.sent:,} acked={stats.acked - baseline.acked:,} "
                f"failed={stats.failed - baseline.failed:,} in flight={stats.in_flight:,} "
                f"faults={','.join(active()) or '-'}"
                + (f" read lag={live.lag:,} margin={live.margin}" if live else ""),
                flush=True,
            )
        await asyncio.sleep(SAMPLE_EVERY)


# --------------------------------------------------------------------------- read back


async def read_kafka(url: str, topic: str, visit: Callable[[int, int, bytes], None]) -> int:
    """Every record of ``topic``, each partition from offset 0 in offset order, until its
    position reaches the high watermark its Fetch responses give (Tansu's ListOffsets can name
    an end short of the records it serves; it deletes nothing, so its log starts at 0).
    READ_PARALLEL partitions at a time, one consumer each; returns the sum of the high
    watermarks (the offsets the broker assigned)."""
    from aiokafka import TopicPartition

    consumer = await _kafka_consumer(url, READ_WAIT)
    try:
        await consumer.topics()  # fetches the metadata partitions_for_topic reads
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
    finally:
        await consumer.stop()
    limit = asyncio.Semaphore(READ_PARALLEL)
    reads = (read_kafka_partition(url, TopicPartition(topic, p), visit, limit) for p in partitions)
    return sum(await asyncio.gather(*reads))


async def _kafka_consumer(url: str, wait: float) -> Any:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        bootstrap_servers=url.removeprefix("kafka://"),
        enable_auto_commit=False,
        group_id=None,
        auto_offset_reset="none",  # a reset would read records twice: fail instead
        fetch_max_wait_ms=int(wait * 1000),
        request_timeout_ms=int(wait * 1000) + 30_000,
        max_partition_fetch_bytes=FETCH_BYTES,
        fetch_max_bytes=FETCH_BYTES,
    )
    await consumer.start()
    return consumer


async def read_kafka_partition(
    url: str, tp: Any, visit: Callable[[int, int, bytes], None], limit: asyncio.Semaphore
) -> int:
    """One partition from offset 0 to its high watermark, with a consumer whose Fetch waits
    READ_WAIT s, doubled (a new consumer, from where the last one got to) while the partition is
    behind and a Fetch brings nothing for 3 waits; gives up past READ_WAIT_MAX, and what is
    missing is then reported as such. Holds ``limit`` until it first reaches the high watermark
    (the quiet polls after that cost the broker nothing). Returns the high watermark (or how far
    it got)."""
    position, wait, end = 0, READ_WAIT, None
    await limit.acquire()
    held = True
    try:
        while True:
            consumer = await _kafka_consumer(url, wait)
            try:
                consumer.assign([tp])
                consumer.seek(tp, position)
                progress, quiet = time.monotonic(), 0
                while time.monotonic() - progress < 3 * wait:
                    try:
                        batches = await consumer.getmany(tp, timeout_ms=1000, max_records=50_000)
                    except Exception as exc:  # an error is a Fetch that brought nothing
                        print(
                            f"  read-back {tp.partition}: {type(exc).__name__}: {exc}", flush=True
                        )
                        await asyncio.sleep(1.0)
                        batches = {}
                    for record in batches.get(tp, ()):
                        if record.offset >= position:  # never one twice, whatever the client does
                            visit(tp.partition, record.offset, record.value or b"")
                            position = record.offset + 1
                            progress = time.monotonic()
                    end = consumer.highwater(tp)
                    if end is None or position < end:
                        quiet = 0
                        continue
                    if held:
                        limit.release()
                        held = False
                    quiet += 1
                    if quiet >= QUIET_POLLS:
                        return int(end)
            finally:
                await consumer.stop()
            if wait * 2 > READ_WAIT_MAX:
                print(
                    f"  read-back {tp.partition}: gave up at offset {position:,} (high watermark"
                    f" {end}) after Fetches of up to {wait:g} s brought nothing",
                    flush=True,
                )
                return position if end is None else max(int(end), position)
            wait *= 2
            print(
                f"  read-back {tp.partition}: stuck at {position:,}: Fetch wait {wait:g} s",
                flush=True,
            )
    finally:
        if held:
            limit.release()


def read_committed(
    bootstrap: str, topic: str, partitions: int, visit: Callable[[int, int, bytes], None]
) -> int:
    """Every record of ``topic`` on Apache Kafka, read by a confluent-kafka consumer (librdkafka:
    a client apart from producerkit's) with ``isolation.level=read_committed``, each partition
    from its first offset in offset order, until every partition reached the high watermark
    asked for first and QUIET_POLLS polls of 1 s in a row brought nothing (or GIVE_UP_POLLS did
    before that: what is missing is then reported as such); returns the sum of the high
    watermarks (the offsets the brokers assigned)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-read-{uuid.uuid4().hex[:8]}",  # never joined: assign() only
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 100,
            "log_level": 3,
        }
    )
    try:
        ends = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        ]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        positions = [0] * partitions

        def reached() -> bool:
            return all(position >= end for position, end in zip(positions, ends, strict=True))

        quiet = 0
        while quiet < (QUIET_POLLS if reached() else GIVE_UP_POLLS):
            messages = consumer.consume(10_000, timeout=1.0)
            quiet = 0 if messages else quiet + 1
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.fatal():
                        raise HarnessError(f"the read-back failed: {error.str()}")
                    continue
                partition, offset = message.partition() or 0, message.offset() or 0
                visit(partition, offset, message.value() or b"")
                positions[partition] = offset + 1
        if not reached():
            print(f"  read-back: stopped at {positions}, short of {ends}", flush=True)
        return sum(ends)
    finally:
        consumer.close()


class ServedBatch(NamedTuple):
    """A record batch as the mock stored it: where, and the producer's stamp on it."""

    partition: int
    base_offset: int
    producer_id: int
    epoch: int
    base_sequence: int
    record_count: int


# Kafka's Fetch v5 (record batches, the log start offset, fixed-width fields) as the live
# read-back speaks it.
_FETCH = struct.Struct(">hhih")  # api key, version, correlation id, client id length
_FETCH_HEAD = struct.Struct(">iiiib")  # replica, max wait ms, min bytes, max bytes, isolation
_FETCH_PARTITION = struct.Struct(">iqqi")  # partition, offset, log start, partition max bytes
_PARTITION_HEAD = struct.Struct(">ihqqq")  # partition, error, high watermark, stable, log start
_BATCH_HEAD = struct.Struct(">qiib")  # base offset, batch length, leader epoch, magic
_I32 = struct.Struct(">i")
_CLIENT_ID = b"chaos-live-read"
OFFSET_OUT_OF_RANGE = 1
COMPRESSION_MASK = 0x07
CONTROL_BATCH = 0x20


def fetch_request(
    correlation_id: int, topic: str, at: list[tuple[int, int]], wait_ms: int
) -> bytes:
    """A Fetch v5 request for ``topic``'s partitions at these offsets."""
    name = topic.encode()
    body = b"".join(
        (
            _FETCH.pack(1, 5, correlation_id, len(_CLIENT_ID)),
            _CLIENT_ID,
            _FETCH_HEAD.pack(-1, wait_ms, 1, FETCH_BYTES, 0),
            _I32.pack(1),
            struct.pack(">h", len(name)),
            name,
            _I32.pack(len(at)),
            *(_FETCH_PARTITION.pack(p, offset, -1, FETCH_BYTES) for p, offset in at),
        )
    )
    return _I32.pack(len(body)) + body


def fetch_response(frame: bytes) -> Iterator[tuple[int, int, int, int, bytes]]:
    """``(partition, error code, high watermark, log start offset, records)`` of a Fetch v5
    response (the frame after its size prefix)."""
    pos = 8  # correlation id, throttle time
    (topics,) = _I32.unpack_from(frame, pos)
    pos += 4
    for _ in range(topics):
        (length,) = struct.unpack_from(">h", frame, pos)
        pos += 2 + length
        (partitions,) = _I32.unpack_from(frame, pos)
        pos += 4
        for _ in range(partitions):
            partition, error, high, _, start = _PARTITION_HEAD.unpack_from(frame, pos)
            pos += _PARTITION_HEAD.size
            (aborted,) = _I32.unpack_from(frame, pos)
            pos += 4 + 16 * max(aborted, 0)
            (size,) = _I32.unpack_from(frame, pos)
            pos += 4
            records = frame[pos : pos + max(size, 0)]
            pos += max(size, 0)
            yield partition, error, high, start, records


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, position after it)."""
    shift = result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def record_batches(
    partition: int, records: bytes
) -> Iterator[tuple[ServedBatch, list[tuple[int, bytes]]]]:
    """Each whole record batch (magic 2) in a partition's records: its header and its
    ``(offset, value)`` pairs (a batch cut short at the end is left out: it comes again)."""
    pos, end = 0, len(records)
    while pos + 61 <= end:
        base_offset, length, _, magic = _BATCH_HEAD.unpack_from(records, pos)
        stop = pos + 12 + length
        if stop > end:
            return
        if magic == 2:
            (attributes,) = struct.unpack_from(">h", records, pos + 21)
            producer_id, epoch, sequence, count = struct.unpack_from(">qhii", records, pos + 43)
            if attributes & COMPRESSION_MASK:
                raise HarnessError("the live read-back reads uncompressed batches only")
            values: list[tuple[int, bytes]] = []
            at = pos + 61
            for _ in range(count if not attributes & CONTROL_BATCH else 0):
                size, at = _varint(records, at)
                following = at + size
                _, at = _varint(records, at + 1)  # attributes (1 byte), timestamp delta
                delta, at = _varint(records, at)
                key_size, at = _varint(records, at)
                value_size, at = _varint(records, at + max(key_size, 0))
                values.append((base_offset + delta, records[at : at + max(value_size, 0)]))
                at = following
            yield (
                ServedBatch(partition, base_offset, producer_id, epoch, sequence, count),
                values,
            )
        pos = stop


class LiveReader:
    """Reads ``topic`` of the cluster from offset 0 while the load runs, in a process of its own
    (``_read_live``: the GIL of this one is the producer's, the proxy's and the recorders'),
    straight from the mock brokers' own ports (not through the recorders or the fault proxy):
    a Fetch v5 connection per broker, asking for the partitions it leads (:meth:`move` tells
    it where they went). The mock keeps only the last 5 MB (or 100,000 batches) of each
    partition, so a read after a long run would find most of it gone, and it answers each
    partition entry of a Fetch with one batch: each Fetch asks for FETCH_AHEAD offsets a
    partition (a reader asking for one batch a round trip fell behind 2,000 msg/s). One that
    falls behind by the whole 5 MB loses records, a harness error (OFFSET_OUT_OF_RANGE below
    the log start). It keeps which message sits at each offset, each message's key
    and sequence, and each batch's header (producer id, epoch, base sequence, as the mock
    stored it); :meth:`finish` reads on to each partition's high watermark as a Fetch after
    the call gives it, then hands them over (:attr:`result`)."""

    def __init__(
        self,
        addresses: tuple[str, ...],
        topic: str,
        leaders: dict[int, int],
        capacity: int,
    ) -> None:
        import multiprocessing
        import tempfile

        context = multiprocessing.get_context("spawn")
        self.partitions = len(leaders)
        self._leaders = context.Array("i", [leaders[p] for p in range(self.partitions)])
        #: per partition the records behind its high watermark, then the margin over the
        #: oldest record the mock keeps (-1: it dropped none yet), then the Fetches made
        self._status = context.Array("q", [0] * self.partitions + [-1, 0])
        self._finish = context.Event()
        self._out = Path(tempfile.mkdtemp(prefix="chaos-read-")) / "read.npz"
        self._process = context.Process(
            target=_read_live,
            args=(addresses, topic, capacity, self._leaders, self._status, self._finish),
            kwargs={"out": str(self._out)},
            name="chaos-live-reader",
            daemon=True,
        )
        self.errors: list[str] = []
        self.result: dict[str, Any] = {}

    def start(self) -> None:
        self._process.start()

    def move(self, leaders: dict[int, int]) -> None:
        for partition, broker in leaders.items():
            self._leaders[partition] = broker

    @property
    def lag(self) -> int:
        """The most records a partition's read is behind its high watermark, now."""
        return int(max(self._status[: self.partitions]))

    @property
    def margin(self) -> int | None:
        """The fewest records the read was ahead of the oldest the mock keeps (None: it
        dropped none)."""
        margin = self._status[self.partitions]
        return None if margin < 0 else int(margin)

    async def finish(self, wait: float = FINISH_WAIT) -> int:
        """Read on to the high watermarks (the load is over), at most ``wait`` s; returns their
        sum (the offsets the cluster assigned)."""
        import numpy as np

        self._finish.set()
        await asyncio.to_thread(self._process.join, wait + 30.0)
        if self._process.is_alive():
            self._process.terminate()
            self.errors.append(f"the read-back did not end within {wait + 30:g} s")
            return 0
        if not self._out.exists():
            self.errors.append(f"the read-back process ended ({self._process.exitcode}) unread")
            return 0
        with np.load(self._out) as saved:
            result = {name: saved[name] for name in saved.files}
        self._out.unlink()
        self._out.parent.rmdir()
        summary = json.loads(str(result.pop("summary")))
        self.errors += summary.pop("errors")
        self.result = {**summary, **result}
        return int(sum(end or 0 for end in summary["ends"]))

    def positions(self) -> dict[int, Any]:
        """Partition -> the message id + 1 at each offset read (0: none of this run's)."""
        return {p: self.result[f"ids{p}"] for p in range(self.partitions)}

    def served(self) -> Iterator[ServedBatch]:
        """Every batch read, partition by partition, in offset order."""
        for p in range(self.partitions):
            columns = self.result[f"batches{p}"]
            for base_offset, producer, epoch, sequence, count in columns.T.tolist():
                yield ServedBatch(p, base_offset, producer, epoch, sequence, count)


class _Broker:
    """The live reader's connection to one broker: its socket, the bytes of the answer coming,
    and the (partition, offset) entries of the Fetch it was asked (None: nothing asked)."""

    __slots__ = ("after_finish", "asked", "buffer", "since", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.asked: list[tuple[int, int]] | None = None
        self.after_finish = False
        self.since = 0.0


def _read_live(
    addresses: tuple[str, ...],
    topic: str,
    capacity: int,
    leaders: Any,
    status: Any,
    finish: Any,
    out: str,
) -> None:
    """The live read-back's process (see LiveReader): Fetches on every broker at once, one
    outstanding each, until finished; then the whole read into ``out`` (an .npz)."""
    import selectors

    import numpy as np

    partitions = len(leaders)
    positions = [0] * partitions
    highs = [0] * partitions
    ends: list[int | None] = [None] * partitions
    ids = [array("I") for _ in range(partitions)]
    keys = array("H", bytes(2 * capacity))
    sequences = array("I", bytes(4 * capacity))
    batches = [[array("q") for _ in range(5)] for _ in range(partitions)]
    counts = {"records": 0, "warm_ups": 0, "unknown": 0, "fetches": 0, "reconnects": 0}
    errors: list[str] = []
    max_lag = 0
    selector = selectors.DefaultSelector()
    brokers: dict[int, _Broker] = {}
    retry_at: dict[int, float] = {}
    correlation_id = 0
    deadline = math.inf
    finishing = stop = False

    def drop(broker: int) -> None:
        connection = brokers.pop(broker)
        selector.unregister(connection.sock)
        connection.sock.close()
        counts["reconnects"] += 1
        retry_at[broker] = time.monotonic() + 0.1

    def take(frame: bytes, asked: list[tuple[int, int]], after_finish: bool) -> bool:
        nonlocal max_lag
        answers = fetch_response(frame)
        broken: set[int] = set()  # partitions with an entry missing: the rest waits
        for (_, offset), (partition, error, high, start, records) in zip(
            asked, answers, strict=True
        ):
            highs[partition] = max(highs[partition], high)
            if error == OFFSET_OUT_OF_RANGE and offset < start:
                errors.append(
                    "the read-back fell behind the mock's retention (5 MB a partition) and"
                    f" lost records of partition {partition} from offset {positions[partition]}"
                )
                return False
            if error or partition in broken:  # past the end, or the leader moved
                broken.add(partition)
                continue
            column = ids[partition]
            for batch, values in record_batches(partition, records):
                end = batch.base_offset + batch.record_count
                if end <= positions[partition]:
                    continue  # asked again from inside a batch read
                if batch.base_offset > positions[partition]:
                    broken.add(partition)
                    break
                for array_, item in zip(batches[partition], batch[1:], strict=True):
                    array_.append(item)
                if end > len(column):
                    column.frombytes(bytes(4 * (end - len(column))))
                for offset, value in values:
                    if value == WARM_UP:
                        counts["warm_ups"] += 1
                        continue
                    counts["records"] += 1
                    try:
                        i_text, key_text, seq_text, _ = value.split(b" ", 3)
                        i, key, seq = int(i_text), int(key_text), int(seq_text)
                    except ValueError:
                        counts["unknown"] += 1
                        continue
                    if not 0 <= i < capacity:
                        counts["unknown"] += 1
                        continue
                    column[offset] = i + 1
                    keys[i], sequences[i] = key, seq
                positions[partition] = end
            status[partition] = high - positions[partition]
            max_lag = max(max_lag, high - positions[partition])
            if start > 0:  # the mock has dropped the partition's oldest batches
                margin = positions[partition] - start
                if status[partitions] < 0 or margin < status[partitions]:
                    status[partitions] = margin
            if after_finish:
                ends[partition] = high
        return True

    try:
        while not stop:
            now = time.monotonic()
            if not finishing and finish.is_set():
                finishing, deadline = True, now + FINISH_WAIT
            if finishing and all(
                end is not None and position >= end
                for position, end in zip(positions, ends, strict=True)
            ):
                break
            if now > deadline:
                errors.append(
                    f"the read-back stopped at {positions}, short of the high watermarks"
                    f" {ends}, after {FINISH_WAIT:g} s"
                )
                break
            leader_of = list(leaders)
            for broker in range(1, len(addresses) + 1):
                connection = brokers.get(broker)
                if connection is not None and connection.asked is not None:
                    if now - connection.since > 10.0:  # unanswered: start again
                        drop(broker)
                    continue
                wanted = [p for p in range(partitions) if leader_of[p] == broker]
                if not wanted or now < retry_at.get(broker, 0.0):
                    continue
                try:
                    if connection is None:
                        host, _, port = addresses[broker - 1].rpartition(":")
                        sock = socket.create_connection((host, int(port)), timeout=2.0)
                        connection = brokers[broker] = _Broker(sock)
                        selector.register(sock, selectors.EVENT_READ, broker)
                    correlation_id += 1
                    at = [  # up to FETCH_AHEAD offsets a partition: the mock serves one batch each
                        (p, positions[p] + k)
                        for p in wanted
                        for k in range(max(1, min(FETCH_AHEAD, highs[p] - positions[p])))
                    ]
                    connection.sock.sendall(fetch_request(correlation_id, topic, at, 100))
                except OSError:  # a broker down: its partitions move soon
                    if broker in brokers:
                        drop(broker)
                    else:
                        retry_at[broker] = now + 0.1
                    continue
                connection.asked, connection.after_finish = at, finishing
                connection.since = now
            for selected, _ in selector.select(timeout=0.05):
                broker = selected.data
                connection = brokers[broker]
                try:
                    chunk = connection.sock.recv(1 << 20)
                except OSError:
                    chunk = b""
                if not chunk:
                    drop(broker)
                    continue
                buffer = connection.buffer
                buffer += chunk
                if len(buffer) < 4:
                    continue
                size = 4 + _I32.unpack_from(buffer)[0]
                if len(buffer) < size:
                    continue
                frame = bytes(buffer[4:size])
                del buffer[:size]
                asked, connection.asked = connection.asked or [], None
                counts["fetches"] += 1
                status[partitions + 1] = counts["fetches"]
                stop = stop or not take(frame, asked, connection.after_finish)
    except Exception as exc:  # the report says so: the read is incomplete
        errors.append(f"the read-back failed: {type(exc).__name__}: {exc}")
    finally:
        for connection in brokers.values():
            connection.sock.close()
    margin = status[partitions]
    summary = {
        **counts,
        "errors": errors,
        "ends": ends,
        "max_lag": max_lag,
        "margin": None if margin < 0 else margin,
    }
    arrays: dict[str, Any] = {
        "summary": np.array(json.dumps(summary)),
        "key": np.frombuffer(keys, np.uint16),
        "sequence": np.frombuffer(sequences, np.uint32),
    }
    for p in range(partitions):
        arrays[f"ids{p}"] = np.frombuffer(ids[p], np.uint32)
        arrays[f"batches{p}"] = np.array([np.frombuffer(a, np.int64) for a in batches[p]])
    np.savez(out, **arrays)


async def read_jetstream(url: str, subject: str, visit: Callable[[int, int, bytes], None]) -> int:
    """Every message of ``subject``'s stream in sequence order (partition -1, offset = stream
    sequence); returns how many the stream says it holds. On a cluster the stream (or the
    reading consumer) may still be electing a leader after the last fault: its "no responders"
    answers are waited out, up to ELECTION_WAIT_S in a row."""
    import nats
    import nats.errors
    import nats.js.errors
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    hosts = url.partition("://")[2].split(",")  # a cluster's every server
    nc = await nats.connect([f"nats://{host}" for host in hosts])
    try:
        js = nc.jetstream()

        async def stream_info() -> Any:
            deadline = time.monotonic() + ELECTION_WAIT_S
            while True:
                try:
                    stream = await js.find_stream_name_by_subject(subject)
                    return await js.stream_info(stream)
                except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.25)

        info = await stream_info()
        stream, total = info.config.name, info.state.messages
        psub = await js.pull_subscribe(
            subject,
            stream=stream,
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
        )
        got = quiet = 0
        unavailable_since: float | None = None
        # Past the stream's count too, until quiet: nothing is taken on trust.
        while quiet < (QUIET_POLLS if got >= total else GIVE_UP_POLLS):
            try:
                batch = await psub.fetch(20_000, timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                quiet += 1
                continue
            except nats.js.errors.ServiceUnavailableError:
                now = time.monotonic()
                unavailable_since = unavailable_since or now
                if now - unavailable_since > ELECTION_WAIT_S:
                    raise
                await asyncio.sleep(0.25)
                continue
            quiet = 0
            unavailable_since = None
            got += len(batch)
            for msg in batch:
                visit(-1, msg.metadata.sequence.stream, msg.data)
        await psub.unsubscribe()
        return int(total)
    finally:
        await nc.close()


# --------------------------------------------------------------------------- Kafka's view


class _Sequences:
    """One producer id's state in one partition, as Kafka's partition leader keeps it: the
    epoch, the next sequence, the last 5 batches' (base sequence, count), and here also the
    batches stored past a gap, held until the gap closes."""

    __slots__ = ("epoch", "held", "next", "recent")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.next = 0
        self.recent: list[tuple[int, int]] = []
        self.held: dict[int, Any] = {}  # base sequence -> ServedBatch

    def take(self, batch: Any) -> None:
        self.next = batch.base_sequence + batch.record_count
        self.recent = [*self.recent[-4:], (batch.base_sequence, batch.record_count)]


class KafkaReplay:
    """One partition's stored batches, in offset order, judged as Apache Kafka's partition
    leader judges an idempotent producer's (KIP-98, KIP-360), where the mock took every one.
    :meth:`add` says of each batch:

    - ``stored``: a batch without a producer id; or a producer id's first batch here, or its
      first of a newer epoch (its state starts over: sequence 0 expected); or the next sequence;
    - ``deduplicated``: its (base sequence, count) is one of the last 5 batches of that producer
      id and epoch (or one held, below): Kafka answers with the first copy's offset and does not
      store it again;
    - ``held``: its base sequence is past the next one (a gap: an earlier batch failed, waits
      for a retry, or was given up on). Kafka refuses it (OUT_OF_ORDER_SEQUENCE_NUMBER) where
      the mock stored it; producerkit sends it again after the batch that fills the gap (a retry
      in the same epoch, ``stored_late``) or, where the gap never closes, bumps its epoch (the
      mock grants a new producer id instead) and sends it again first in the new one
      (``stored_after_bump``; each such gap counted in :attr:`gaps`). Either way Kafka stores it
      once, later than the mock did, and in sequence order;
    - ``refused_old_epoch`` (an epoch older than one stored), ``refused_old_sequence`` (a
      sequence below the next one and not among the last 5 batches): refused, not stored.

    :attr:`records` counts records by verdict (a held batch's once its gap closes, or the log
    ends: :meth:`close`)."""

    def __init__(self) -> None:
        self.producers: dict[int, _Sequences] = {}
        self.records: Counter[str] = Counter()
        self.gaps = 0  # sequence gaps that never closed in their epoch

    def add(self, batch: Any) -> str:
        if batch.producer_id < 0:
            return self._count("stored", batch.record_count)
        state = self.producers.get(batch.producer_id)
        if state is None or batch.epoch > state.epoch:
            if state is not None:
                self._never_closed(state)
            state = self.producers[batch.producer_id] = _Sequences(batch.epoch)
        sequence, count = batch.base_sequence, batch.record_count
        if batch.epoch < state.epoch:
            return self._count("refused_old_epoch", count)
        held = state.held.get(sequence)
        if (sequence, count) in state.recent or (held is not None and held.record_count == count):
            return self._count("deduplicated", count)
        if sequence > state.next:
            state.held[sequence] = batch
            return "held"
        if sequence < state.next:
            return self._count("refused_old_sequence", count)
        state.take(batch)
        while state.next in state.held:
            late = state.held.pop(state.next)
            state.take(late)
            self._count("stored_late", late.record_count)
        return self._count("stored", count)

    def close(self) -> None:
        """The partition's log ends: gaps still open never closed."""
        for state in self.producers.values():
            self._never_closed(state)

    def _never_closed(self, state: _Sequences) -> None:
        if state.held:
            self.gaps += 1
            self._count("stored_after_bump", sum(b.record_count for b in state.held.values()))
            state.held.clear()

    def _count(self, verdict: str, records: int) -> str:
        self.records[verdict] += records
        return verdict


#: KafkaReplay's verdicts as kafka_view marks each record (0: in no batch read).
_STORED, _HELD, _NOT_STORED = 1, 2, 3


def kafka_view(stored: Stored, served: Iterable[ServedBatch]) -> dict[str, Any]:
    """Duplicates and per-key order as Apache Kafka would have stored what the mock stored:
    every batch read (with the header the mock stored it with) through KafkaReplay. Extra
    copies count where Kafka stores them too (``stored`` and ``held`` batches: a message
    stored under two sequences, sent twice by the producer); copies in batches Kafka
    deduplicates or refuses do not. Order, among each message's first copy Kafka stores, two
    ways: in the mock's log order, a sequence below a higher one of its key before it, unless
    that higher one sits in a held batch (Kafka stores it later, after the batch that fills its
    gap: the mock's doing, not the producer's); and in the order Kafka keeps an epoch's
    records in, their sequence numbers, a key's messages out of produce order (which also
    covers held batches among themselves). Records read that no batch read holds are taken as
    stored (``unbatched``; none expected)."""
    import numpy as np

    assert stored.positions is not None
    n = stored.ledger.sent
    key = np.frombuffer(stored.key, np.uint16)
    sequence = np.frombuffer(stored.sequence, np.uint32)
    marks = {p: np.zeros(len(column), np.uint8) for p, column in stored.positions.items()}
    # Each record's stamp: producer id (-1: none), epoch, its own sequence (base + index).
    stamps = {
        p: (np.full(len(column), -1, np.int64), np.zeros(len(column), np.int64))
        for p, column in stored.positions.items()
    }
    record_sequence = {p: np.zeros(len(column), np.int64) for p, column in stored.positions.items()}
    replays: dict[int, KafkaReplay] = {}
    codes = {"stored": _STORED, "held": _HELD}
    for batch in served:
        replay = replays.get(batch.partition)
        if replay is None:
            replay = replays[batch.partition] = KafkaReplay()
        verdict = codes.get(replay.add(batch), _NOT_STORED)
        mark = marks.get(batch.partition)
        if mark is not None:
            start, end = batch.base_offset, min(batch.base_offset + batch.record_count, len(mark))
            mark[start:end] = verdict
            producer, epoch = stamps[batch.partition]
            producer[start:end], epoch[start:end] = batch.producer_id, batch.epoch
            record_sequence[batch.partition][start:end] = np.arange(
                batch.base_sequence, batch.base_sequence + end - start
            )
    verdicts: Counter[str] = Counter()
    for replay in replays.values():
        replay.close()
        verdicts.update(replay.records)
    kept: list[Any] = []
    order_violations = in_sequence = 0  # in_sequence: those only the sequence order shows
    examples: list[int] = []
    unbatched = 0
    for partition, column in sorted(stored.positions.items()):
        ids, mark = np.frombuffer(column, np.uint32), marks[partition]
        unbatched += int(((ids > 0) & (mark == 0)).sum())
        at = np.flatnonzero((ids > 0) & (mark != _NOT_STORED))
        messages = ids[at].astype(np.int64) - 1
        held = mark[at] == _HELD
        kept.append(messages)
        _, first = np.unique(messages, return_index=True)
        first.sort()
        firsts, firsts_held = messages[first], held[first]
        producer, epoch = stamps[partition]
        where = at[first]
        behind_in_sequence = _out_of_sequence(
            firsts,
            key,
            sequence,
            producer[where],
            epoch[where],
            record_sequence[partition][where],
        )
        by_key = np.argsort(key[firsts], kind="stable")
        ordered, ordered_held = firsts[by_key], firsts_held[by_key]
        base = key[ordered].astype(np.int64) << 32
        composite = base | sequence[ordered].astype(np.int64)
        # The highest sequence of the key before each first copy, held ones left out.
        highest = np.maximum.accumulate(np.where(ordered_held, base, composite))
        before = np.concatenate(([-1], highest[:-1]))
        behind = ordered[composite < before]
        # A message behind either way counts once.
        behind_either = np.union1d(behind, behind_in_sequence)
        order_violations += len(behind_either)
        in_sequence += len(np.setdiff1d(behind_in_sequence, behind))
        examples += behind_either[: EXAMPLES - len(examples)].tolist()
    all_kept = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    kafka_copies = np.bincount(all_kept, minlength=n)[:n]
    raw_copies = np.frombuffer(stored.copies, np.uint8)[:n]
    return {
        "duplicates": int(np.maximum(kafka_copies - 1, 0).sum()),
        "order_violations": order_violations,
        "order_violations_in_sequence": in_sequence,
        "order_examples": examples,
        "records_by_verdict": dict(sorted(verdicts.items())),
        "sequence_gaps": sum(replay.gaps for replay in replays.values()),
        "unbatched_records": unbatched,
        "stored_only_in_batches_kafka_refuses": int(((raw_copies > 0) & (kafka_copies == 0)).sum()),
    }


def _out_of_sequence(
    messages: Any, key: Any, sequence: Any, producer: Any, epoch: Any, stamped: Any
) -> Any:
    """``messages`` (with a producer's stamp) out of produce order within their key when each
    producer id and epoch's are taken in the order of the sequence numbers they were stamped
    with (``stamped``), as Kafka keeps them: the ones behind a higher sequence of their key."""
    import numpy as np

    has = producer >= 0
    messages, producer, epoch, stamped = messages[has], producer[has], epoch[has], stamped[has]
    if not len(messages):
        return messages
    _, segment = np.unique(np.stack((producer, epoch)), axis=1, return_inverse=True)
    keys = key[messages].astype(np.int64)
    order = np.lexsort((stamped, keys, segment.ravel()))
    group = (segment.ravel()[order] << 16) | keys[order]
    composite = (group << 32) | sequence[messages[order]].astype(np.int64)
    highest = np.maximum.accumulate(composite)
    behind = composite < np.concatenate(([-1], highest[:-1]))
    return messages[order][behind]


def cluster_summary(batches: BatchLog, topic: str, pushed: Counter[str]) -> dict[str, Any]:
    """What the recorders saw of the producer's Produce batches: attempts, answers by error
    code, those never answered, producer ids and epochs; the errors pushed by the plan."""
    from producerkit.testing.kafka_cluster import ERROR_CODES

    names = {code: name for name, code in ERROR_CODES.items()}
    answers: Counter[str] = Counter()
    epochs: set[tuple[int, int]] = set()
    attempts = 0
    for batch in batches.produced(topic):
        attempts += 1
        epochs.add((batch.producer_id, batch.epoch))
        if not batch.answered:
            answers["never answered"] += 1
        else:
            code = batch.error_code
            answers[names.get(code, str(code)) if code else "NONE"] += 1
    return {
        "produce_batches": attempts,
        "produce_answers": dict(sorted(answers.items())),
        "producer_ids_epochs": sorted(epochs),
        "errors_pushed": dict(sorted(pushed.items())),
        "unreadable_frames": batches.unreadable,
    }


# --------------------------------------------------------------------------- report

#: name -> what it counts; each must be 0 (``blocked_past_timeout_s``: at most BLOCK_LIMIT).
CHECKS = {
    "without_outcome": "messages with no outcome after close()",
    "double_outcomes": "outcomes reported twice for one message",
    "acked_missing": "acked, not found stored",
    "acked_wrong_offset": "acked and stored, but not at the partition/offset its Delivery gave",
    "failed_unstored_found": "failed possibly_stored=False (or raised by produce), found stored",
    "stored_unknown": "stored records that are no message of this run",
    "stats_mismatch": "producer.stats acked/failed differ from the outcomes counted here",
    "duplicates_stored": "extra stored copies (must be 0 on JetStream: msg_id; and on the"
    " cluster, those Kafka would store too: idempotence)",
    "order_violations": "a key's stored first copy after a later one (must be 0: Kafka defaults;"
    " on the cluster, in the log Kafka would have)",
}
#: The cluster's too (reported): what its mock stored that Apache Kafka would not have.
CLUSTER_CHECKS = {
    "duplicates_mock_only": "extra copies the mock stored and Kafka would not: a batch stored"
    " again under the same producer id, epoch, partition and sequence (deduplicated by Kafka),"
    " or one Kafka would refuse for its sequence",
    "order_violations_mock_log": "order violations in the log as the mock stored it",
    "duplicates_without_id": "the JetStream cluster's extra stored copies of messages without a"
    " msg_id (producerkit publishes none of them again: 0 expected, reported)",
}


def analyze(
    ledger: Ledger,
    stored: Stored,
    broker_count: int,
    windows: list[dict[str, Any]],
    stats_delta: tuple[int, int],
    timeout: float,
    strict_order: bool,
    dedupes: bool,
    view: dict[str, Any] | None = None,
    with_id: Any = None,
    leader_deaths: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The checks; with ``view`` (the cluster's kafka_view) duplicates and order are judged on
    the log Kafka would have, and the raw figures are reported beside them. With ``with_id``
    (a mask of the messages that carried a msg_id) duplicates are judged among those, and
    reported among the others. With ``leader_deaths`` (seconds since t0) the time from each to
    the first ack of a message sent after it."""
    import numpy as np

    n = ledger.sent
    status = np.frombuffer(ledger.status, np.uint8)[:n]
    copies = np.frombuffer(stored.copies, np.uint8)[:n]
    at_offset = np.frombuffer(stored.at_offset, np.uint8)[:n]
    error = np.frombuffer(ledger.error, np.uint8)[:n]
    send_at = np.frombuffer(ledger.send_at, np.float32)[:n].astype(np.float64)
    settle_at = np.frombuffer(ledger.settle_at, np.float32)[:n].astype(np.float64)
    acked = status == ACKED
    failed = (status == FAILED_UNSTORED) | (status == FAILED_STORED) | (status == RAISED)
    never_written = (status == FAILED_UNSTORED) | (status == RAISED)
    failures: dict[str, dict[str, int]] = {}
    for code, name in enumerate(ledger.error_names[1:], start=1):
        of_type = failed & (error == code)
        failures[name] = {
            "possibly_stored_false": int((of_type & (status == FAILED_UNSTORED)).sum()),
            "possibly_stored_true": int((of_type & (status == FAILED_STORED)).sum()),
            "raised_by_produce": int((of_type & (status == RAISED)).sum()),
            **({} if with_id is None else {"with_msg_id": int((of_type & with_id).sum())}),
        }
    without_offset = acked & (np.frombuffer(ledger.offset, np.uint32)[:n] == 0)
    counts = {
        "produced": n,
        "acked": int(acked.sum()),
        "failed": int(failed.sum()),
        "failed_possibly_stored_false": int((status == FAILED_UNSTORED).sum()),
        "failed_possibly_stored_true": int((status == FAILED_STORED).sum()),
        "raised_by_produce": int((status == RAISED).sum()),
        "acked_as_duplicate": ledger.duplicate_acks,
        # a Delivery without an offset (Kafka: DUPLICATE_SEQUENCE_NUMBER, the broker stored the
        # batch before and names no offset, as Java and librdkafka report it too): no wrong
        # offset, and acked_missing still checks that it was stored
        "acked_without_offset": int(without_offset.sum()),
        "stored_records": stored.records,
        "stored_records_broker_count": broker_count,
        "stored_distinct": int((copies > 0).sum()),
        "failed_possibly_stored_true_found": int(((status == FAILED_STORED) & (copies > 0)).sum()),
    }
    if with_id is not None:
        counts["with_msg_id"] = int(with_id.sum())
        counts["failed_with_msg_id"] = int((failed & with_id).sum())
    masks = {  # the checks about single messages, whose examples the report shows
        "without_outcome": status == PENDING,
        "acked_missing": acked & (copies == 0),
        "acked_wrong_offset": acked & (copies > 0) & (at_offset == 0) & ~without_offset,
        "failed_unstored_found": never_written & (copies > 0),
    }
    checks = {
        **{name: int(mask.sum()) for name, mask in masks.items()},
        "double_outcomes": ledger.double_outcomes,
        "stored_unknown": stored.unknown,
        "stats_mismatch": abs(stats_delta[0] - counts["acked"])
        + abs(stats_delta[1] - counts["failed"] + counts["raised_by_produce"]),
        "duplicates_stored": stored.duplicates,
        "order_violations": stored.order_violations,
    }
    if with_id is not None:
        extra = np.maximum(copies.astype(np.int64) - 1, 0)
        checks["duplicates_stored"] = int(extra[with_id].sum())
        checks["duplicates_without_id"] = int(extra[~with_id].sum())
    if view is not None:
        checks["duplicates_stored"] = view["duplicates"]
        checks["order_violations"] = view["order_violations"]
        checks["duplicates_mock_only"] = stored.duplicates - view["duplicates"]
        checks["order_violations_mock_log"] = stored.order_violations
    examples = {
        name: [ledger.describe(int(i)) for i in np.flatnonzero(mask)[:EXAMPLES]]
        for name, mask in masks.items()
        if mask.any()
    }
    if view is not None and view["order_examples"]:
        examples["order_violations"] = [
            {**ledger.describe(i), "copies": int(copies[i])} for i in view["order_examples"]
        ]
    if stored.order_examples:  # each with the message of the same key stored before it
        examples["order_violations" if view is None else "order_violations_mock_log"] = [
            {
                **ledger.describe(i),
                "stored_offset": offset,
                "copies": int(copies[i]),
                "after": {**ledger.describe(j), "stored_offset": at, "copies": int(copies[j])},
            }
            for i, offset, j, at in stored.order_examples
        ]
    enforced = {name for name in checks if name in CHECKS}
    enforced -= {"duplicates_stored", "order_violations"}
    if dedupes:
        enforced.add("duplicates_stored")
    if strict_order:
        enforced.add("order_violations")
    blocked = ledger.longest_call - timeout
    # Recovery: from a fault's end to the first ack of a message sent after it ended.
    first_ack_from = np.minimum.accumulate(np.where(acked, settle_at, np.inf)[::-1])[::-1]

    def to_next_ack(at: float) -> float:
        """From ``at`` to the first ack of a message sent after it (inf: none)."""
        index = int(np.searchsorted(send_at, at))
        return float(first_ack_from[index] - at) if index < n else math.inf

    recoveries = []
    after_load = 0  # faults that outlasted the load (a slow leader move): nothing to recover
    for window in windows:
        end = window["end"]
        after_load += int(np.searchsorted(send_at, end)) >= n
        recovery = to_next_ack(end)
        window["recovery_s"] = round(recovery, 3) if math.isfinite(recovery) else None
        if math.isfinite(recovery):
            recoveries.append(recovery)
    leader_death = None
    if leader_deaths is not None:
        delays = [to_next_ack(at) for at in leader_deaths]
        acked_after = [delay for delay in delays if math.isfinite(delay)]
        leader_death = {
            "p50": round(float(np.median(acked_after)), 3) if acked_after else None,
            "max": round(max(acked_after), 3) if acked_after else None,
            "kills_of_the_leader": len(delays),
            "without_an_ack_after": len(delays) - len(acked_after),
            "each_s": [round(d, 3) if math.isfinite(d) else None for d in delays],
        }
    seconds = math.ceil(max(send_at.max(initial=0), settle_at.max(initial=0))) + 1
    series = {
        "sent": np.bincount(send_at.astype(int), minlength=seconds).tolist(),
        "acked": np.bincount(settle_at[acked].astype(int), minlength=seconds).tolist(),
        "failed_possibly_stored_false": np.bincount(
            settle_at[never_written].astype(int), minlength=seconds
        ).tolist(),
        "failed_possibly_stored_true": np.bincount(
            settle_at[status == FAILED_STORED].astype(int), minlength=seconds
        ).tolist(),
    }
    return {
        "counts": counts,
        "failures_by_type": failures,
        "first_errors": dict(ledger.first_errors),
        "checks": {
            name: {
                "value": value,
                "enforced": name in enforced,
                "pass": value == 0 or name not in enforced,
            }
            for name, value in checks.items()
        },
        "blocked_past_timeout_s": {
            "value": round(blocked, 3),
            "longest_call_s": round(ledger.longest_call, 3),
            "at_s": round(ledger.longest_call_at, 1),
            "limit_s": BLOCK_LIMIT,
            "pass": blocked <= BLOCK_LIMIT,
        },
        "examples": examples,
        "latest_send_s": round(ledger.latest_send, 3),
        "recovery_s": {
            "p50": round(float(np.median(recoveries)), 3) if recoveries else None,
            "max": round(max(recoveries), 3) if recoveries else None,
            "faults": len(windows),
            # sent to after the fault's end, and none of it acked
            "unrecovered": len(windows) - len(recoveries) - after_load,
            "ended_after_load": after_load,
        },
        "leader_death_to_next_ack_s": leader_death,
        "per_second": series,
    }


def print_summary(report: dict[str, Any]) -> None:
    config, result = report["config"], report["result"]
    counts = result["counts"]
    print(
        f"\nchaos {config['backend']}{' preset=' + config['preset'] if config['preset'] else ''}"
        f" seed={config['seed']} minutes={config['minutes']:g} rate={config['rate']:,.0f}/s"
        + (f" (capacity {config['capacity']:,.0f}/s)" if config["capacity"] else " (--rate)")
    )
    print(
        f"produced {counts['produced']:,}  acked {counts['acked']:,}  failed {counts['failed']:,}"
        f" (possibly_stored false {counts['failed_possibly_stored_false']:,},"
        f" true {counts['failed_possibly_stored_true']:,}, of them found stored"
        f" {counts['failed_possibly_stored_true_found']:,}; raised by produce"
        f" {counts['raised_by_produce']:,})"
        + (
            f"; acked without an offset {counts['acked_without_offset']:,}"
            if counts["acked_without_offset"]
            else ""
        )
    )
    if "with_msg_id" in counts:
        print(
            f"with a msg_id {counts['with_msg_id']:,} (in runs of {ID_RUN:,}), of them failed"
            f" {counts['failed_with_msg_id']:,}"
        )
    for name, by in sorted(result["failures_by_type"].items()):
        print(f"  {name}: {by}")
        first = result.get("first_errors", {}).get(name)
        if first:
            print(f"    the first: {first}")
    print(
        f"stored records {counts['stored_records']:,} (distinct {counts['stored_distinct']:,});"
        f" the broker's count {counts['stored_records_broker_count']:,}"
    )
    print("faults:")
    for w in report["faults"]:
        recovery = "-" if w["recovery_s"] is None else f"{w['recovery_s']:.2f}s"
        print(
            f"  {w['mode']:9} {w['start']:7.1f}s .. {w['end']:7.1f}s"
            f"  recovery {recovery:>7}  {w['detail']}"
        )
    cluster = report.get("cluster")
    if cluster and "leader_at_end" in cluster:
        print(
            f"JetStream cluster: {cluster['brokers']} nats-servers, an R{cluster['replication']}"
            f" file stream; server faults done {cluster['faults_done']}; the stream's leader at"
            f" the end n{cluster['leader_at_end']}; acked in fast batches"
            f" {cluster['fast_ingest_acked']:,}"
        )
    elif cluster and "min_insync_replicas" in cluster:
        print(
            f"Apache Kafka {cluster['version']}: {cluster['brokers']} nodes, replication"
            f" {cluster['replication']}, min.insync.replicas {cluster['min_insync_replicas']};"
            f" node faults done {cluster['faults_done']}; leaders at the end"
            f" {cluster['leaders_at_end']}"
        )
    elif cluster:
        epochs = cluster["producer_ids_epochs"]
        print(
            f"cluster: {cluster['brokers']} brokers, replication {cluster['replication']};"
            f" {cluster['produce_batches']:,} idempotent Produce batches, answered"
            f" {cluster['produce_answers']}; errors pushed {cluster['errors_pushed']};"
            f" {len(epochs)} producer id/epoch pairs {epochs[:6]}"
        )
        print(
            f"  records the mock stored, by what Kafka would have done with their batch:"
            f" {cluster['records_by_verdict']} ({cluster['sequence_gaps']} sequence gaps Kafka"
            f" would answer OUT_OF_ORDER_SEQUENCE_NUMBER); stored only where Kafka would not:"
            f" {cluster['stored_only_in_batches_kafka_refuses']:,} messages; in no batch"
            f" recorded: {cluster['unbatched_records']:,}; live read at most"
            f" {cluster['read_max_lag_records']:,} records behind and"
            + (
                " the mock dropped none"
                if cluster["read_margin_records"] is None
                else f" {cluster['read_margin_records']:,} ahead of the oldest the mock kept"
            )
        )
    rec = result["recovery_s"]
    print(
        f"recovery p50 {rec['p50']}s max {rec['max']}s ({rec['unrecovered']} without an ack after)"
    )
    death = result.get("leader_death_to_next_ack_s")
    if death is not None:
        print(
            f"from a leader's death to the next ack: p50 {death['p50'] or '-'} s"
            f" max {death['max'] or '-'} s"
            f" ({death['kills_of_the_leader']} kills of the leader's server,"
            f" {death['without_an_ack_after']} without an ack after)"
        )
    blocked = result["blocked_past_timeout_s"]
    print(
        f"longest produce() call {blocked['longest_call_s']:.3f}s at t={blocked['at_s']}s:"
        f" {blocked['value']:+.3f}s past the timeout (limit +{BLOCK_LIMIT:g}s)"
        f" {'ok' if blocked['pass'] else 'FAIL'}"
    )
    print(f"latest send behind schedule {result['latest_send_s']:.3f}s")
    print(
        f"RSS start {report['rss_mb']['start']} MB, end {report['rss_mb']['end']} MB"
        f" (of which the harness's ledger {report['rss_mb']['ledger']} MB);"
        f" the broker's {report['rss_mb']['broker_end']} MB"
    )
    print("checks:")
    for name, check in result["checks"].items():
        verdict = ("ok" if check["pass"] else "FAIL") if check["enforced"] else "(reported)"
        meaning = CHECKS.get(name) or CLUSTER_CHECKS[name]
        print(f"  {name:26} {check['value']:>8,}  {verdict:10}  {meaning}")
    for name, examples in result["examples"].items():
        print(f"  {name}, the first {len(examples)}:")
        for example in examples[:5]:
            print(f"    {example}")
    if report["harness_error"]:
        print(f"HARNESS ERROR (the run is void): {report['harness_error']}")
    print("PASS" if report["pass"] else "FAIL")


def plot(report: dict[str, Any], output: Path) -> None:
    """Send and ack rates, in flight and failures per second over time, faults shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series, samples = report["result"]["per_second"], report["samples"]
    fig, (rate_ax, flight_ax, fail_ax) = plt.subplots(
        3, 1, figsize=(12, 8), sharex=True, gridspec_kw={"height_ratios": [2, 1.2, 1.2]}
    )
    xs = list(range(len(series["sent"])))
    rate_ax.plot(xs, series["sent"], label="sent/s", linewidth=1.2)
    rate_ax.plot(xs, series["acked"], label="acked/s", linewidth=1.2)
    flight_ax.plot([s["t"] for s in samples], [s["in_flight"] for s in samples], color="tab:purple")
    fail_ax.bar(
        xs,
        series["failed_possibly_stored_false"],
        width=1.0,
        color="tab:red",
        label="possibly_stored=False",
    )
    fail_ax.bar(
        xs,
        series["failed_possibly_stored_true"],
        width=1.0,
        bottom=series["failed_possibly_stored_false"],
        color="tab:orange",
        label="possibly_stored=True",
    )
    colors = {
        "stall": "tab:blue",
        "blackhole": "black",
        "refuse": "tab:red",
        "slow": "tab:green",
        "kill": "tab:brown",
        "reset": "tab:pink",
        "leaders": "tab:olive",
        "step_down": "tab:olive",
        "broker_down": "tab:brown",
        "errors": "tab:cyan",
    }
    for w in report["faults"]:
        leader_killed = w["mode"] == "kill" and LEADER_VICTIM in w["detail"]
        color = "darkred" if leader_killed else colors.get(w["mode"], "grey")
        for ax in (rate_ax, flight_ax, fail_ax):
            if w["end"] > w["start"]:
                ax.axvspan(w["start"], w["end"], color=color, alpha=0.15, linewidth=0)
            else:
                ax.axvline(w["start"], color=color, alpha=0.6, linestyle=":")
        rate_ax.annotate(  # inside the window, at its top
            "kill leader" if leader_killed else w["mode"],
            (w["start"], 0.98),
            xycoords=("data", "axes fraction"),
            xytext=(2, 0),
            textcoords="offset points",
            fontsize=7,
            rotation=90,
            va="top",
            ha="left",
            color=color,
        )
    config = report["config"]
    name = config["backend"] + (f" preset={config['preset']}" if config["preset"] else "")
    rate_ax.set_title(f"chaos: {name}, seed {config['seed']}, {config['rate']:,.0f} msg/s offered")
    rate_ax.set_ylabel("messages/s")
    rate_ax.legend(loc="lower left", fontsize=8)
    flight_ax.set_ylabel("in flight")
    fail_ax.set_ylabel("failed/s")
    fail_ax.set_xlabel("seconds since the load started")
    fail_ax.legend(loc="upper left", fontsize=8)
    for ax in (rate_ax, flight_ax, fail_ax):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- run


def node_faults(cluster: Cluster, topic: str, partitions: int, seed: int) -> NodeFaults:
    """The cluster's own faults on ``topic`` (the JetStream cluster's: on its stream, named
    alike), seeded apart from the proxy's."""
    from producerkit.testing.kafka_cluster import KafkaCluster
    from producerkit.testing.nats_cluster import JetStreamCluster

    rng = random.Random(f"{seed}-cluster")
    if isinstance(cluster, KafkaCluster):
        return ClusterFaults(cluster, topic, partitions, rng)
    if isinstance(cluster, JetStreamCluster):
        return JetStreamFaults(cluster, topic, rng)
    return ApacheFaults(cluster, topic, partitions, rng)


async def chaos(
    args: argparse.Namespace,
    broker: LocalBroker | None,
    faults: FaultProxy,
    cluster: Cluster | None = None,
) -> dict[str, Any]:
    """One run against ``broker`` behind ``faults``, or against ``cluster`` (the mock's, Apache
    Kafka's or the JetStream cluster) behind its own fault proxy (``faults``), with its own
    faults too."""
    import numpy as np

    jetstream = args.backend in ("jetstream", "jetstream-cluster")
    id_runs = args.backend == "jetstream-cluster"
    nonce = uuid.uuid4().hex[:8]
    topic, capacity_topic = f"chaos{nonce}", f"capacity{nonce}"
    cluster_faults = (
        None if cluster is None else node_faults(cluster, topic, args.partitions, args.seed)
    )
    options: dict[str, Any] = {"timeout": args.timeout}
    if jetstream:
        options.update(create_stream=True, stream_storage="file")
        if cluster is not None:
            options["stream_replicas"] = REPLICATION
    else:
        for name in (topic, capacity_topic):
            if cluster_faults is not None:
                await asyncio.to_thread(cluster_faults.create_topic, name)
            else:
                assert broker is not None
                await create_kafka_topic(broker.url, name, args.partitions)
        if args.preset:
            options["preset"] = args.preset
    seconds = args.minutes * 60
    rate = args.rate
    rss_start = rss_mb()
    holder: list[Ledger] = []

    def on_delivery(result: pk.Delivery | pk.Failure, context: Any) -> None:
        if holder:
            holder[0].on_delivery(result, context)

    url = faults.url if cluster is None else cluster.faulty_url  # every member's, proxied
    producer = pk.Producer(url, topic=topic, on_delivery=on_delivery, **options)
    await producer.start()
    idempotent = getattr(producer.backend, "idempotent", None)
    if idempotent is not None:
        reason = getattr(producer.backend, "idempotence_reason", "")
        print(f"idempotent: {idempotent} ({reason})", flush=True)
    capacity = None
    if rate is None:
        capacity = await measure_capacity(
            producer,
            capacity_topic,
            args.capacity_seconds,
            Messages(args.keys, f"{args.seed}-capacity", jetstream, id_runs),
        )
        rate = min(capacity / 2, args.max_messages / seconds, args.max_rate or math.inf)
        capped = " (capped by --max-messages/--max-rate)" if rate < capacity / 2 else ""
        print(
            f"capacity {capacity:,.0f} msg/s: the load runs at {rate:,.0f} msg/s{capped}",
            flush=True,
        )
    await producer.produce(WARM_UP)
    baseline = producer.stats
    fast_acked_before = getattr(producer.backend, "fast_ingest_acked", 0)
    t0 = time.monotonic() + 0.01
    ledger = Ledger(math.ceil(rate * seconds) + 1, t0)
    holder.append(ledger)
    live: LiveReader | None = None
    if isinstance(cluster_faults, ClusterFaults):  # read while the load runs: the mock keeps
        live = LiveReader(  # 5 MB a partition
            cluster_faults.mock.mock_addresses,
            topic,
            dict(cluster_faults.leaders),
            len(ledger.status),
        )
        cluster_faults.watchers.append(live.move)
        live.start()
    logs = [faults.log] + ([cluster_faults.log] if cluster_faults else [])

    def active() -> tuple[str, ...]:
        return tuple(mode for log in logs for mode in log.active())

    samples: list[dict[str, Any]] = []
    sampler = asyncio.ensure_future(sample(producer, ledger, active, samples, live))
    modes = tuple(args.modes.split(",")) if args.modes else default_modes(args.backend)
    injector = asyncio.ensure_future(
        inject_faults(
            faults,
            fault_plan(random.Random(args.seed), modes),
            t0 + seconds - args.timeout - 3,
            cluster_faults,
        )
    )
    # A broken harness stops the load: the rest of the run would test nothing it claims.
    injector.add_done_callback(
        lambda task: setattr(ledger, "stopped", not task.cancelled() and bool(task.exception()))
    )
    print(f"load: {seconds:g} s at {rate:,.0f} msg/s, faults among {', '.join(modes)}", flush=True)
    harness_error = None
    try:
        messages = Messages(args.keys, f"{args.seed}-keys", jetstream, id_runs)
        await send_load(producer, ledger, rate, seconds, messages)
        try:
            await injector
        except HarnessError as exc:
            harness_error = str(exc)
            print(f"HARNESS ERROR: {exc}", flush=True)
    finally:
        injector.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await injector  # a cluster fault cut short ends its window
        await asyncio.to_thread(cluster_faults.reset if cluster_faults else faults.clear)
        closing = time.monotonic()
        with contextlib.suppress(pk.ProduceError):
            await producer.close()
        close_seconds = time.monotonic() - closing
        sampler.cancel()
    stats = producer.stats
    fast_ingest_acked = getattr(producer.backend, "fast_ingest_acked", 0) - fast_acked_before
    rss_end = rss_mb()
    if broker is not None:
        processes = [broker.process]
    elif isinstance(cluster_faults, ApacheFaults):  # the nodes' JVMs
        processes = [node.process for node in cluster_faults.kafka.nodes]
    elif isinstance(cluster_faults, JetStreamFaults):
        processes = [server.process for server in cluster_faults.jetstream.servers]
    else:
        processes = []
    pids = [process.pid for process in processes if process is not None]
    broker_rss = sum(rss_mb(pid) for pid in pids) if pids else math.nan
    windows = [
        {
            "mode": w.mode,
            "start": round(w.started - t0, 3),
            "end": round((w.ended if w.ended is not None else w.started) - t0, 3),
            "detail": w.detail,
        }
        for w in sorted((w for log in logs for w in log.windows()), key=lambda w: w.started)
        if w.mode != "latency"
    ]
    await asyncio.to_thread(faults.stop)
    await asyncio.sleep(SETTLE)
    print("reading back ...", flush=True)
    read_started = time.monotonic()
    view = cluster_report = None
    if live is not None:
        assert isinstance(cluster_faults, ClusterFaults)
        broker_count = await live.finish()
        stored = Stored.from_positions(ledger, live.result, live.positions())
        broker_count -= stored.warm_ups
        for error in live.errors:
            print(f"HARNESS ERROR: {error}", flush=True)
        harness_error = harness_error or "; ".join(live.errors[:3]) or None
        await asyncio.to_thread(cluster_faults.mock.batches.settle, 5.0)
        view = kafka_view(stored, live.served())
        cluster_report = {
            **cluster_faults.report(),
            "read_max_lag_records": live.result.get("max_lag"),
            "read_margin_records": live.result.get("margin"),
            "read_fetches": live.result.get("fetches"),
            "read_reconnects": live.result.get("reconnects"),
            "records_by_verdict": view["records_by_verdict"],
            "order_violations_in_sequence": view["order_violations_in_sequence"],
            "sequence_gaps": view["sequence_gaps"],
            "unbatched_records": view["unbatched_records"],
            "stored_only_in_batches_kafka_refuses": view["stored_only_in_batches_kafka_refuses"],
            **cluster_summary(cluster_faults.mock.batches, topic, cluster_faults.errors_pushed),
        }
    elif isinstance(cluster_faults, ApacheFaults):
        stored = Stored(ledger)
        bootstrap = cluster_faults.kafka.bootstrap_servers
        high = await asyncio.to_thread(
            read_committed, bootstrap, topic, args.partitions, stored.visit
        )
        broker_count = high - stored.warm_ups
        cluster_report = await asyncio.to_thread(cluster_faults.report)
    elif isinstance(cluster_faults, JetStreamFaults):
        stored = Stored(ledger)
        url = cluster_faults.jetstream.url
        broker_count = await read_jetstream(url, topic, stored.visit) - stored.warm_ups
        cluster_report = {
            **await asyncio.to_thread(cluster_faults.report),
            "fast_ingest_acked": fast_ingest_acked,
        }
    else:
        stored = Stored(ledger)
        reader = read_jetstream if jetstream else read_kafka
        assert broker is not None
        broker_count = await reader(broker.url, topic, stored.visit) - stored.warm_ups
    result = analyze(
        ledger,
        stored,
        broker_count,
        windows,
        (stats.acked - baseline.acked, stats.failed - baseline.failed),
        args.timeout,
        strict_order=not jetstream and args.preset is None,
        dedupes=jetstream or cluster is not None,
        view=view,
        with_id=has_msg_id(np.arange(ledger.sent)) if id_runs else None,
        leader_deaths=(
            [at - t0 for at in cluster_faults.leader_deaths]
            if isinstance(cluster_faults, JetStreamFaults)
            else None
        ),
    )
    checks_pass = all(check["pass"] for check in result["checks"].values())
    return {
        "config": {
            "backend": args.backend,
            "preset": args.preset,
            "seed": args.seed,
            "minutes": args.minutes,
            "rate": rate,
            "capacity": capacity,
            "timeout": args.timeout,
            "keys": args.keys,
            "partitions": None if jetstream else args.partitions,
            "value_size": VALUE_SIZE,
            "modes": list(modes),
            "topic": topic,
            "idempotent": idempotent,
        },
        "cluster": cluster_report,
        "environment": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "producerkit": pk.__version__,
        },
        "pass": checks_pass and result["blocked_past_timeout_s"]["pass"] and not harness_error,
        "harness_error": harness_error,
        "result": result,
        "faults": windows,
        "samples": samples,
        "producer_stats": {
            "window_waits": stats.window_waits - baseline.window_waits,
            "window_wait_seconds": round(
                stats.window_wait_seconds - baseline.window_wait_seconds, 3
            ),
            "peak_in_flight": stats.peak_in_flight,
        },
        "close_seconds": round(close_seconds, 3),
        "read_back_seconds": round(time.monotonic() - read_started, 3),
        "rss_mb": {
            "start": round(rss_start, 1),
            "end": round(rss_end, 1),
            "ledger": round(ledger.nbytes / 1e6, 1),
            "broker_end": round(broker_rss, 1),
        },
    }


def start_cluster(backend: str) -> Cluster:
    """The mock cluster (recording the Produce batches), Apache Kafka or the JetStream cluster
    (its servers naming none of each other to the producer, which reaches each through the
    proxy only), CLUSTER_BROKERS brokers, not started (``with`` starts it)."""
    if backend == "kafka-cluster":
        from producerkit.testing.kafka_cluster import KafkaCluster

        return KafkaCluster(CLUSTER_BROKERS, record_batches=True)
    if backend == "jetstream-cluster":
        from producerkit.testing.nats_cluster import JetStreamCluster

        return JetStreamCluster(CLUSTER_BROKERS, extra_args=["--no_advertise=true"])
    from producerkit.testing.apache_kafka import ApacheKafka

    return ApacheKafka(CLUSTER_BROKERS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True, help="how long the load runs")
    parser.add_argument("--seed", type=int, default=1, help="seeds the faults and the keys")
    parser.add_argument(
        "--backend",
        choices=("kafka", "jetstream", "kafka-cluster", "kafka-apache", "jetstream-cluster"),
        required=True,
        help="kafka: Tansu; kafka-cluster: librdkafka's mock cluster of 3 brokers, in-process;"
        " kafka-apache: 3 Apache Kafka nodes (Java 17+); jetstream-cluster: 3 nats-servers,"
        " an R3 stream",
    )
    parser.add_argument("--preset", choices=("throughput",), help="Kafka's preset (default: none)")
    parser.add_argument(
        "--rate", type=float, help="messages/s (default: half the capacity measured)"
    )
    parser.add_argument("--json", type=Path, help="write the whole report here")
    parser.add_argument("--plot", type=Path, help="draw the run into this PNG")
    parser.add_argument("--timeout", type=float, default=5.0, help="the producer's timeout (s)")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=6, help="of the Kafka topic")
    parser.add_argument("--capacity-seconds", type=float, default=3.0)
    parser.add_argument(
        "--max-messages",
        type=int,
        default=20_000_000,
        help="cap the measured rate so the run sends at most this many (Tansu keeps every "
        "record in memory, some 260 bytes each)",
    )
    parser.add_argument(
        "--max-rate",
        type=float,
        help="cap the measured rate at this many msg/s (default: none; kafka-cluster:"
        f" {CLUSTER_MAX_RATE:,.0f}, what the mock can serve back while the load runs;"
        f" kafka-apache: {APACHE_MAX_RATE:,.0f}; jetstream-cluster:"
        f" {JETSTREAM_CLUSTER_MAX_RATE:,.0f})",
    )
    parser.add_argument("--modes", help="faults to draw from, comma-separated (default: all)")
    args = parser.parse_args(argv)
    if args.max_rate is None:
        args.max_rate = {
            "kafka-cluster": CLUSTER_MAX_RATE,
            "kafka-apache": APACHE_MAX_RATE,
            "jetstream-cluster": JETSTREAM_CLUSTER_MAX_RATE,
        }.get(args.backend)
    if args.preset and args.backend in ("jetstream", "jetstream-cluster"):
        parser.error("--preset is a Kafka setting")
    known = default_modes(args.backend)
    unknown = set((args.modes or "").split(",")) - {"", *known}
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)} on {args.backend}: {', '.join(known)}")
    if not 1 <= args.partitions <= 127:
        parser.error("--partitions must be 1-127")
    logging.basicConfig(
        level=logging.ERROR, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    for noisy in ("aiokafka", "nats"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)

    if args.backend in ("kafka-cluster", "kafka-apache", "jetstream-cluster"):
        with start_cluster(args.backend) as cluster:
            report = asyncio.run(chaos(args, None, cluster.faults, cluster))
    else:
        starter = start_nats if args.backend == "jetstream" else start_kafka
        with starter() as broker, BrokerFaults(broker) as faults:
            report = asyncio.run(chaos(args, broker, faults))
    print_summary(report)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")
    if args.plot is not None:
        plot(report, args.plot)
        print(f"wrote {args.plot}")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
