"""Chaos: open-loop keyed load through a fault proxy, random faults, then every message checked
against what the broker stored.

    python benches/chaos.py --minutes M --seed S --backend kafka|jetstream
        [--preset throughput] [--rate N] [--json PATH] [--plot PATH]

The broker is started here from the installed wheels, behind a ``BrokerFaults`` proxy that the
producer connects through: Tansu with memory storage (a topic of ``--partitions`` partitions,
created with aiokafka's admin client) or nats-server with JetStream on file storage in a temp dir
(``create_stream=True, stream_storage="file"``, each message with a unique ``msg_id``).

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
   lasting 1-10 s; modes are drawn from a shuffled bag, so each comes before any repeats. None
   starts unless it ends ``timeout + 3`` s before the load does. Windows come from the proxy's log.
4. End: stop producing, clear the faults, close the producer (every message now has an outcome),
   stop the proxy, let the broker settle, and read everything back with another client straight
   from the broker (aiokafka consumers, a partition each, to the high watermark; their Fetch wait
   made for Tansu's memory store, see READ_WAIT / nats-py pull consumer).

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
import sys
import time
import uuid
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import producerkit as pk
from producerkit.testing.brokers import (
    BrokerFaults,
    LocalBroker,
    create_kafka_topic,
    start_kafka,
    start_nats,
)

VALUE_SIZE = 100
#: The proxy's faults on both backends; ``kill`` only where the store survives it (JetStream).
PROXY_MODES = ("stall", "blackhole", "reset", "refuse", "slow")
GAP = (5.0, 20.0)
DURATION = (1.0, 10.0)
#: ``slow`` carries this many bytes/s each way (log-uniform).
SLOW_RATE = (20_000.0, 200_000.0)
#: A produce() call may block at most this long past the producer's timeout.
BLOCK_LIMIT = 1.0
SETTLE = 2.0
#: A read-back ends after this many empty polls of 1 s in a row, once it has read as far as the
#: broker said it holds (else after GIVE_UP_POLLS: what is missing is then reported as such).
QUIET_POLLS = 3
GIVE_UP_POLLS = 30
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
        self.error[i] = self.error_names.index(name)


class Stored:
    """What the broker holds, read back: copies per message id, whether a copy sits where its
    Delivery said, and per-key order among first copies."""

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


# --------------------------------------------------------------------------- faults


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
        seconds = 0.0 if mode == "reset" else rng.uniform(*DURATION)
        rate = math.exp(rng.uniform(*map(math.log, SLOW_RATE)))
        yield gap, mode, seconds, rate


class HarnessError(Exception):
    """The run does not test what it says: its verdict is FAIL, whatever the checks say."""


async def inject_faults(
    faults: BrokerFaults, plan: Iterator[tuple[float, str, float, float]], last_end: float
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
        if mode == "kill":
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


def check_accepting(faults: BrokerFaults, mode: str, wait: float = 3.0) -> None:
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
    message's number within its key) padded to VALUE_SIZE, and on JetStream a unique msg_id."""

    def __init__(self, keys: int, seed: str, jetstream: bool) -> None:
        self._rng = random.Random(seed)
        self._keys = [b"key-%03d" % k for k in range(keys)]
        self._sequences = [0] * keys
        self._nonce = uuid.uuid4().hex[:8] if jetstream else None
        self._pad = b"x" * VALUE_SIZE

    def make(self, i: int) -> tuple[bytes, bytes, str | None]:
        key = self._rng.randrange(len(self._keys))
        seq = self._sequences[key]
        self._sequences[key] = seq + 1
        head = b"%d %d %d " % (i, key, seq)
        msg_id = None if self._nonce is None else f"{self._nonce}-{i}"
        return self._keys[key], head + self._pad[: VALUE_SIZE - len(head)], msg_id


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
    producer: pk.Producer, ledger: Ledger, faults: BrokerFaults, samples: list[dict[str, Any]]
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
            }
        )
        if t >= next_line:
            next_line += 10.0
            active = ",".join(faults.log.active()) or "-"
            print(
                f"  t={t:6.0f}s sent={ledger.sent:,} acked={stats.acked - baseline.acked:,} "
                f"failed={stats.failed - baseline.failed:,} in flight={stats.in_flight:,} "
                f"faults={active}",
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


async def read_jetstream(url: str, subject: str, visit: Callable[[int, int, bytes], None]) -> int:
    """Every message of ``subject``'s stream in sequence order (partition -1, offset = stream
    sequence); returns how many the stream says it holds."""
    import nats
    import nats.errors
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc = await nats.connect(url.replace("jetstream://", "nats://"))
    try:
        js = nc.jetstream()
        stream = await js.find_stream_name_by_subject(subject)
        total = (await js.stream_info(stream)).state.messages
        psub = await js.pull_subscribe(
            subject,
            stream=stream,
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
        )
        got = quiet = 0
        # Past the stream's count too, until quiet: nothing is taken on trust.
        while quiet < (QUIET_POLLS if got >= total else GIVE_UP_POLLS):
            try:
                batch = await psub.fetch(20_000, timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                quiet += 1
                continue
            quiet = 0
            got += len(batch)
            for msg in batch:
                visit(-1, msg.metadata.sequence.stream, msg.data)
        await psub.unsubscribe()
        return int(total)
    finally:
        await nc.close()


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
    "duplicates_stored": "extra stored copies (must be 0 on JetStream only: msg_id)",
    "order_violations": "a key's stored first copy after a later one (must be 0: Kafka defaults)",
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
) -> dict[str, Any]:
    import numpy as np

    n = ledger.sent
    status = np.frombuffer(ledger.status, np.uint8)[:n]
    copies = np.frombuffer(stored.copies, np.uint8)
    at_offset = np.frombuffer(stored.at_offset, np.uint8)
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
        }
    counts = {
        "produced": n,
        "acked": int(acked.sum()),
        "failed": int(failed.sum()),
        "failed_possibly_stored_false": int((status == FAILED_UNSTORED).sum()),
        "failed_possibly_stored_true": int((status == FAILED_STORED).sum()),
        "raised_by_produce": int((status == RAISED).sum()),
        "acked_as_duplicate": ledger.duplicate_acks,
        "stored_records": stored.records,
        "stored_records_broker_count": broker_count,
        "stored_distinct": int((copies > 0).sum()),
        "failed_possibly_stored_true_found": int(((status == FAILED_STORED) & (copies > 0)).sum()),
    }
    masks = {  # the checks about single messages, whose examples the report shows
        "without_outcome": status == PENDING,
        "acked_missing": acked & (copies == 0),
        "acked_wrong_offset": acked & (copies > 0) & (at_offset == 0),
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
    examples = {
        name: [ledger.describe(int(i)) for i in np.flatnonzero(mask)[:EXAMPLES]]
        for name, mask in masks.items()
        if mask.any()
    }
    if stored.order_examples:  # each with the message of the same key stored before it
        examples["order_violations"] = [
            {
                **ledger.describe(i),
                "stored_offset": offset,
                "copies": int(copies[i]),
                "after": {**ledger.describe(j), "stored_offset": at, "copies": int(copies[j])},
            }
            for i, offset, j, at in stored.order_examples
        ]
    enforced = {name for name in checks if name not in ("duplicates_stored", "order_violations")}
    if dedupes:
        enforced.add("duplicates_stored")
    if strict_order:
        enforced.add("order_violations")
    blocked = ledger.longest_call - timeout
    # Recovery: from a fault's end to the first ack of a message sent after it ended.
    first_ack_from = np.minimum.accumulate(np.where(acked, settle_at, np.inf)[::-1])[::-1]
    recoveries = []
    for window in windows:
        end = window["end"]
        index = int(np.searchsorted(send_at, end))
        recovery = float(first_ack_from[index] - end) if index < n else math.inf
        window["recovery_s"] = round(recovery, 3) if math.isfinite(recovery) else None
        if math.isfinite(recovery):
            recoveries.append(recovery)
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
            "unrecovered": len(windows) - len(recoveries),
        },
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
    )
    for name, by in sorted(result["failures_by_type"].items()):
        print(f"  {name}: {by}")
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
    rec = result["recovery_s"]
    print(
        f"recovery p50 {rec['p50']}s max {rec['max']}s ({rec['unrecovered']} without an ack after)"
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
        print(f"  {name:24} {check['value']:>8,}  {verdict:10}  {CHECKS[name]}")
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
    }
    for w in report["faults"]:
        color = colors.get(w["mode"], "grey")
        for ax in (rate_ax, flight_ax, fail_ax):
            if w["end"] > w["start"]:
                ax.axvspan(w["start"], w["end"], color=color, alpha=0.15, linewidth=0)
            else:
                ax.axvline(w["start"], color=color, alpha=0.6, linestyle=":")
        rate_ax.annotate(  # inside the window, at its top
            w["mode"],
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


async def chaos(
    args: argparse.Namespace, broker: LocalBroker, faults: BrokerFaults
) -> dict[str, Any]:
    jetstream = args.backend == "jetstream"
    nonce = uuid.uuid4().hex[:8]
    topic, capacity_topic = f"chaos{nonce}", f"capacity{nonce}"
    options: dict[str, Any] = {"timeout": args.timeout}
    if jetstream:
        options.update(create_stream=True, stream_storage="file")
    else:
        for name in (topic, capacity_topic):
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

    producer = pk.Producer(faults.url, topic=topic, on_delivery=on_delivery, **options)
    await producer.start()
    capacity = None
    if rate is None:
        capacity = await measure_capacity(
            producer,
            capacity_topic,
            args.capacity_seconds,
            Messages(args.keys, f"{args.seed}-capacity", jetstream),
        )
        rate = min(capacity / 2, args.max_messages / seconds)
        capped = " (capped by --max-messages)" if rate < capacity / 2 else ""
        print(
            f"capacity {capacity:,.0f} msg/s: the load runs at {rate:,.0f} msg/s{capped}",
            flush=True,
        )
    await producer.produce(WARM_UP)
    baseline = producer.stats
    t0 = time.monotonic() + 0.01
    ledger = Ledger(math.ceil(rate * seconds) + 1, t0)
    holder.append(ledger)
    samples: list[dict[str, Any]] = []
    sampler = asyncio.ensure_future(sample(producer, ledger, faults, samples))
    modes = tuple(args.modes.split(",")) if args.modes else PROXY_MODES + ("kill",) * jetstream
    injector = asyncio.ensure_future(
        inject_faults(
            faults, fault_plan(random.Random(args.seed), modes), t0 + seconds - args.timeout - 3
        )
    )
    # A broken harness stops the load: the rest of the run would test nothing it claims.
    injector.add_done_callback(
        lambda task: setattr(ledger, "stopped", not task.cancelled() and bool(task.exception()))
    )
    print(f"load: {seconds:g} s at {rate:,.0f} msg/s, faults among {', '.join(modes)}", flush=True)
    harness_error = None
    try:
        messages = Messages(args.keys, f"{args.seed}-keys", jetstream)
        await send_load(producer, ledger, rate, seconds, messages)
        try:
            await injector
        except HarnessError as exc:
            harness_error = str(exc)
            print(f"HARNESS ERROR: {exc}", flush=True)
    finally:
        injector.cancel()
        await asyncio.to_thread(faults.clear)
        closing = time.monotonic()
        with contextlib.suppress(pk.ProduceError):
            await producer.close()
        close_seconds = time.monotonic() - closing
        sampler.cancel()
    stats = producer.stats
    rss_end = rss_mb()
    broker_rss = rss_mb(broker.process.pid) if broker.process is not None else math.nan
    windows = [
        {
            "mode": w.mode,
            "start": round(w.started - t0, 3),
            "end": round((w.ended if w.ended is not None else w.started) - t0, 3),
            "detail": w.detail,
        }
        for w in faults.log.windows()
        if w.mode != "latency"
    ]
    await asyncio.to_thread(faults.stop)
    await asyncio.sleep(SETTLE)
    print("reading back ...", flush=True)
    stored = Stored(ledger)
    read_started = time.monotonic()
    reader = read_jetstream if jetstream else read_kafka
    broker_count = await reader(broker.url, topic, stored.visit) - stored.warm_ups
    result = analyze(
        ledger,
        stored,
        broker_count,
        windows,
        (stats.acked - baseline.acked, stats.failed - baseline.failed),
        args.timeout,
        strict_order=not jetstream and args.preset is None,
        dedupes=jetstream,
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
        },
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True, help="how long the load runs")
    parser.add_argument("--seed", type=int, default=1, help="seeds the faults and the keys")
    parser.add_argument("--backend", choices=("kafka", "jetstream"), required=True)
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
    parser.add_argument("--modes", help="faults to draw from, comma-separated (default: all)")
    args = parser.parse_args(argv)
    if args.preset and args.backend != "kafka":
        parser.error("--preset is a Kafka setting")
    known = PROXY_MODES + ("kill",) * (args.backend == "jetstream")
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
