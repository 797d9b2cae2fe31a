"""Reading back what the broker stored, with clients apart from the producer: aiokafka
consumers on Tansu, a ``read_committed`` confluent-kafka consumer on Apache Kafka, a pull
consumer on JetStream, and on librdkafka's mock cluster the live read-back while the load runs
(:class:`LiveReader`, Fetch v5 in a process of its own: the mock keeps 5 MB a partition)."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import struct
import time
import uuid
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from chaos.faults import HarnessError
from chaos.judges.kafka_wire import ServedBatch, record_batches
from chaos.workload import WARM_UP

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
