"""The load: message i due at ``t0 + i / rate`` whatever happened to message i-1 (open loop),
each of one of ``--keys`` keys with a value that carries its id, key and sequence within the
key; the :class:`Ledger` of every message's outcome; the capacity run before it; the sampler
of the producer's stats beside it."""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import producerkit as pk

if TYPE_CHECKING:
    from chaos.readback import LiveReader

VALUE_SIZE = 100
#: On the JetStream cluster messages i with ``(i // ID_RUN) % 2 == 0`` carry a msg_id (sent
#: one by one, each PubAck'd; duplicates among them must be 0) and the others none (in fast
#: batches where a burst brings 8 or more at once; a lost PubAck fails them possibly stored).
ID_RUN = 1000
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
