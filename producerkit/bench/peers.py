"""The raw clients producerkit is compared with, each behind the open-loop :class:`Target` seam.

- ``aiokafka``: ``await producer.send()`` per message (it returns a future; acks through its
  done-callback), at aiokafka's defaults (``linger_ms=0``, ``acks=1``, not idempotent);
  ``aiokafka-idempotent`` the same with ``enable_idempotence=True`` (acks all), the price of
  idempotence on the broker, seen through one client: run only where named (``--peers``), as
  Tansu 0.6 answers aiokafka's InitProducerId with an error;
- ``confluent-kafka``: librdkafka's defaults (linger 5 ms, acks all), ``produce(...,
  on_delivery=...)`` with a thread blocked in ``poll()`` (so acks are timed when librdkafka reports
  them, not when the event loop next gets round to polling); ``confluent-kafka-linger0`` the
  same with ``linger.ms=0``. Both keep librdkafka's per-second statistics (round trip to the
  broker, time in its queues, messages per request) in ``diagnostics``;
- ``confluent-kafka-aio``: confluent-kafka's asyncio producer (``confluent_kafka.aio.AIOProducer``,
  2.13+) at its defaults: ``await produce()`` gives a delivery future; it hands messages to
  librdkafka 1,000 at a time, or after 1 s without a new one;
- ``kafka-python``: kafka-python 3's ``KafkaProducer`` at its defaults (idempotent, acks all,
  linger 0), ``send()`` per message, acks from its sender thread;
- ``nats-py``: JetStream ``publish_async`` (a future per message, at most ``limit`` pending);
- ``nats-jetstream-extra`` and ``natsio-jetstream-batch``: the JetStream fast publishers (ADR-50
  fast batches) of nats-jetstream-extra (on nats-core) and of natsio-jetstream-batch (on
  natsio), at their defaults (a flow of 100, 2 ack windows outstanding): one batch from the
  first send to the next flush, a message acked once an ``add`` reports the server's ack
  sequence past it, the rest when ``flush`` ends the batch. Both packages need Python 3.13 or
  newer: these peers run where ``producerkit bench`` itself runs on 3.13 with them installed
  (docs/benchmarks.md); the stream is created allowing fast batches if there is none.

A peer whose client is not installed is left out of :func:`peers_for` (``missing_peers`` says
why); :func:`make_peer` raises :class:`~producerkit.errors.MissingDependencyError` for it.

``compression`` (``make_peer``, ``run_peer``) gives the Kafka peers a codec, as
``compression_type`` / ``compression.type``, so that they compress as producerkit does.

Other suites reuse them (``benches/throughput.py``)::

    timings = await run_peer("aiokafka", "kafka://127.0.0.1:9092", "t", messages, rate=0,
                             count=100_000)

``messages`` is a list of ``(key, value)`` pairs, cycled; ``on_ack(index, ok)`` (optional) is
called once per message besides the timing. The result is a
:class:`~producerkit.bench.openloop.RunTimings` (per-message due/send/ack nanoseconds) that
:func:`producerkit.bench.report.analyze` turns into percentiles.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import importlib.util
import json
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from producerkit._urls import parse_url
from producerkit.bench.openloop import (
    PERCENTILES,
    AckCallback,
    RunTimings,
    Target,
    run_open_loop,
)
from producerkit.errors import ConfigurationError, MissingDependencyError

__all__ = [
    "PEERS",
    "make_peer",
    "median_ratios",
    "missing_peers",
    "peers_for",
    "round_ratios",
    "run_peer",
]


def _ignore(index: int, ok: bool) -> None:
    pass


class AiokafkaPeer:
    name = "aiokafka"
    settings: dict[str, Any] = {"linger_ms": 0, "acks": 1, "enable_idempotence": False}

    def __init__(
        self, url: str, topic: str, limit: int = 1000, compression: str | None = None
    ) -> None:
        self.bootstrap = parse_url(url).server_strings()
        self.topic = topic
        self.compression = compression
        self.on_ack: AckCallback = _ignore

    async def start(self) -> None:
        from aiokafka import AIOKafkaProducer

        self.producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, compression_type=self.compression, **self.settings
        )
        await self.producer.start()

    def send(self, index: int, key: bytes | None, value: bytes) -> Awaitable[Any]:
        return self._send(index, key, value)

    async def _send(self, index: int, key: bytes | None, value: bytes) -> None:
        on_ack = self.on_ack
        future = await self.producer.send(self.topic, value, key=key)
        future.add_done_callback(
            lambda done: on_ack(index, not done.cancelled() and done.exception() is None)
        )

    async def send_wait(self, index: int, key: bytes | None, value: bytes) -> bool:
        try:
            await (await self.producer.send(self.topic, value, key=key))
        except Exception:
            return False
        return True

    async def flush(self) -> None:
        await self.producer.flush()

    async def close(self) -> None:
        await self.producer.stop()


class AiokafkaIdempotentPeer(AiokafkaPeer):
    name = "aiokafka-idempotent"
    settings = {"linger_ms": 0, "acks": "all", "enable_idempotence": True}


class ConfluentPeer:
    """confluent-kafka at librdkafka's defaults; ``settings`` (subclasses) changes some."""

    name = "confluent-kafka"
    settings: dict[str, Any] = {}

    def __init__(
        self, url: str, topic: str, limit: int = 1000, compression: str | None = None
    ) -> None:
        self.bootstrap = ",".join(parse_url(url).server_strings())
        self.topic = topic
        self.compression = compression
        self.on_ack: AckCallback = _ignore
        self._stop = threading.Event()
        #: librdkafka's statistics, one entry a second: see :func:`librdkafka_interval`.
        self.diagnostics: dict[str, Any] = {"librdkafka_intervals": []}

    async def start(self) -> None:
        import confluent_kafka

        self.producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "statistics.interval.ms": 1000,
                "stats_cb": self._statistics,
                **self.settings,
                **({"compression.type": self.compression} if self.compression else {}),
            }
        )
        self._poller = threading.Thread(target=self._poll, name="confluent-poll", daemon=True)
        self._poller.start()
        # Learn the topic's metadata before the clock starts.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            None, functools.partial(self.producer.list_topics, self.topic, 10)
        )

    def _poll(self) -> None:
        # poll() returns as soon as a delivery report is served, not after the timeout.
        while not self._stop.is_set():
            self.producer.poll(0.05)

    def _statistics(self, text: str) -> None:
        self.diagnostics["librdkafka_intervals"].append(librdkafka_interval(json.loads(text)))

    def _delivered(self, index: int, err: Any, msg: Any) -> None:
        self.on_ack(index, err is None)

    def send(self, index: int, key: bytes | None, value: bytes) -> Awaitable[Any] | None:
        try:
            self.producer.produce(
                self.topic, value, key, on_delivery=functools.partial(self._delivered, index)
            )
        except BufferError:
            return self._send_when_room(index, key, value)
        return None

    async def _send_when_room(self, index: int, key: bytes | None, value: bytes) -> None:
        while True:
            await asyncio.sleep(0.001)
            try:
                self.producer.produce(
                    self.topic, value, key, on_delivery=functools.partial(self._delivered, index)
                )
                return
            except BufferError:
                continue

    async def send_wait(self, index: int, key: bytes | None, value: bytes) -> bool:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()

        def delivered(err: Any, msg: Any) -> None:
            loop.call_soon_threadsafe(_set_once, future, err is None)

        self.producer.produce(self.topic, value, key, on_delivery=delivered)
        return await future

    async def flush(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.producer.flush, 60)

    async def close(self) -> None:
        await self.flush()
        self._stop.set()
        self._poller.join()


class ConfluentLingerZeroPeer(ConfluentPeer):
    name = "confluent-kafka-linger0"
    settings = {"linger.ms": 0}


class ConfluentAIOPeer:
    """confluent-kafka's ``AIOProducer`` at its defaults (see the module docstring)."""

    name = "confluent-kafka-aio"

    def __init__(
        self, url: str, topic: str, limit: int = 1000, compression: str | None = None
    ) -> None:
        self.bootstrap = ",".join(parse_url(url).server_strings())
        self.topic = topic
        self.compression = compression
        self.on_ack: AckCallback = _ignore

    async def start(self) -> None:
        from confluent_kafka.aio import AIOProducer

        codec = {"compression.type": self.compression} if self.compression else {}
        self.producer = AIOProducer({"bootstrap.servers": self.bootstrap, **codec})
        await self.producer.list_topics(self.topic, 10)

    def send(self, index: int, key: bytes | None, value: bytes) -> Awaitable[Any]:
        return self._send(index, key, value)

    async def _send(self, index: int, key: bytes | None, value: bytes) -> None:
        on_ack = self.on_ack
        future = await self.producer.produce(self.topic, value, key)
        future.add_done_callback(
            lambda done: on_ack(index, not done.cancelled() and done.exception() is None)
        )

    async def send_wait(self, index: int, key: bytes | None, value: bytes) -> bool:
        try:
            await (await self.producer.produce(self.topic, value, key))
        except Exception:
            return False
        return True

    async def flush(self) -> None:
        await self.producer.flush()

    async def close(self) -> None:
        await self.producer.close()


class KafkaPythonPeer:
    """kafka-python 3's ``KafkaProducer`` at its defaults (see the module docstring)."""

    name = "kafka-python"

    def __init__(
        self, url: str, topic: str, limit: int = 1000, compression: str | None = None
    ) -> None:
        self.bootstrap = parse_url(url).server_strings()
        self.topic = topic
        self.compression = compression
        self.on_ack: AckCallback = _ignore

    async def start(self) -> None:
        # Through import_module: kafka-python and natsio ship no type information.
        KafkaProducer = importlib.import_module("kafka").KafkaProducer
        loop = asyncio.get_running_loop()
        self.producer = await loop.run_in_executor(
            None,
            functools.partial(
                KafkaProducer, bootstrap_servers=self.bootstrap, compression_type=self.compression
            ),
        )
        # Learn the topic's metadata before the clock starts.
        await loop.run_in_executor(None, self.producer.partitions_for, self.topic)

    def send(self, index: int, key: bytes | None, value: bytes) -> None:
        # Called from kafka-python's sender thread, as confluent-kafka's from its poll thread.
        on_ack = self.on_ack
        future = self.producer.send(self.topic, value, key=key)
        future.add_callback(lambda _: on_ack(index, True))
        future.add_errback(lambda _: on_ack(index, False))

    async def send_wait(self, index: int, key: bytes | None, value: bytes) -> bool:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        sent = self.producer.send(self.topic, value, key=key)
        sent.add_callback(lambda _: loop.call_soon_threadsafe(_set_once, future, True))
        sent.add_errback(lambda _: loop.call_soon_threadsafe(_set_once, future, False))
        return await future

    async def flush(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.producer.flush, 60)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.producer.close, 30)


def librdkafka_interval(stats: dict[str, Any]) -> dict[str, Any]:
    """One statistics callback of librdkafka, cut to what explains its latency (ms): the round
    trip of its requests (``rtt``), the time messages waited in its partition queues
    (``int_latency``) and in the broker's send buffer (``outbuf_latency``), and the produce
    requests and messages sent so far, summed over the brokers."""
    brokers = [b for b in stats.get("brokers", {}).values() if b.get("nodeid", -1) >= 0]
    cut: dict[str, Any] = {
        "produce_requests": sum(b.get("req", {}).get("Produce", 0) for b in brokers),
        "messages": stats.get("txmsgs", 0),
    }
    for window in ("rtt", "int_latency", "outbuf_latency"):
        busiest = max(brokers, key=lambda b: b.get(window, {}).get("cnt", 0), default=None)
        if busiest is not None:
            for q in ("p50", "p99"):
                cut[f"{window}_{q}_ms"] = busiest[window].get(q, 0) / 1000
    return cut


def _set_once(future: asyncio.Future[bool], ok: bool) -> None:
    if not future.done():
        future.set_result(ok)


class NatsPeer:
    name = "nats-py"

    def __init__(
        self, url: str, topic: str, limit: int = 1000, compression: str | None = None
    ) -> None:  # compression: a Kafka codec, not NATS's
        parsed = parse_url(url)
        self.servers = [f"nats://{server}" for server in parsed.server_strings()]
        self.topic = topic
        self.limit = limit
        self.on_ack: AckCallback = _ignore

    async def start(self) -> None:
        import nats
        import nats.js.errors

        self.nc = await nats.connect(servers=self.servers)
        self.js = self.nc.jetstream(publish_async_max_pending=self.limit)
        try:
            await self.js.find_stream_name_by_subject(self.topic)
        except nats.js.errors.NotFoundError:
            await self.js.add_stream(
                name=_stream_name(self.topic), subjects=[self.topic, f"{self.topic}.>"]
            )

    def send(self, index: int, key: bytes | None, value: bytes) -> Awaitable[Any]:
        return self._send(index, value)

    async def _send(self, index: int, value: bytes) -> None:
        on_ack = self.on_ack
        future = await self.js.publish_async(self.topic, value)
        future.add_done_callback(
            lambda done: on_ack(index, not done.cancelled() and done.exception() is None)
        )

    async def send_wait(self, index: int, key: bytes | None, value: bytes) -> bool:
        try:
            await self.js.publish(self.topic, value)
        except Exception:
            return False
        return True

    async def flush(self) -> None:
        if self.js.publish_async_pending():
            await self.js.publish_async_completed()

    async def close(self) -> None:
        await self.nc.close()


class _FastPublisherPeer:
    """A JetStream fast publisher (ADR-50): one fast batch from the first send to the next
    flush. ``add`` returns the server's ack sequence so far (the flow acks it has read): every
    message of the batch up to it is acked then; ``flush`` ends the batch, and its final ack
    covers the rest. Subclasses give the client: connect, the stream, a publisher, its end."""

    name = ""

    def __init__(
        self, url: str, topic: str, limit: int = 1000, compression: str | None = None
    ) -> None:  # limit: the library's flow control bounds what is in flight
        self.servers = [f"nats://{server}" for server in parse_url(url).server_strings()]
        self.topic = topic
        self.on_ack: AckCallback = _ignore
        self._publisher: Any = None
        self._unacked: collections.deque[int] = collections.deque()  # indexes, in batch order
        self._acked = 0  # batch sequences acked so far

    def send(self, index: int, key: bytes | None, value: bytes) -> Awaitable[Any]:
        return self._send(index, value)

    async def _send(self, index: int, value: bytes) -> None:
        if self._publisher is None:
            self._publisher = self._new_publisher()
            self._acked = 0
        self._unacked.append(index)
        try:
            progress = await self._publisher.add(self.topic, value)
        except Exception:
            self._fail_batch()
            return
        self._ack_through(progress.ack_sequence)

    async def send_wait(self, index: int, key: bytes | None, value: bytes) -> bool:
        # A batch of one, of its own (a publisher is for one task at a time; the driver times it).
        publisher = self._new_publisher()
        try:
            await publisher.add(self.topic, value)
            await self._end_batch(publisher, 1)
        except Exception:
            return False
        return True

    def _ack_through(self, sequence: int) -> None:
        unacked, on_ack = self._unacked, self.on_ack
        while self._acked < sequence and unacked:
            self._acked += 1
            on_ack(unacked.popleft(), True)

    def _fail_batch(self) -> None:
        while self._unacked:
            self.on_ack(self._unacked.popleft(), False)
        self._publisher = None

    async def flush(self) -> None:
        if self._publisher is None:
            return
        try:
            await self._end_batch(self._publisher, self._acked + len(self._unacked))
        except Exception:
            self._fail_batch()
            return
        self._ack_through(self._acked + len(self._unacked))
        self._publisher = None

    def _new_publisher(self) -> Any:
        raise NotImplementedError

    async def _end_batch(self, publisher: Any, count: int) -> None:
        """End ``publisher``'s batch of ``count`` messages, raising if the server did not store
        all of them."""
        raise NotImplementedError


class NatsJetstreamExtraPeer(_FastPublisherPeer):
    """nats-jetstream-extra's ``fast_publish`` (on nats-core's client) at its defaults."""

    name = "nats-jetstream-extra"

    async def start(self) -> None:
        from nats.client import connect
        from nats.jetstream import new

        self.client = await connect(self.servers[0])
        self.js = new(self.client)
        if not await _any(self.js.stream_names(self.topic)):
            await self.js.create_stream(
                name=_stream_name(self.topic),
                subjects=[self.topic, f"{self.topic}.>"],
                allow_batched=True,
            )

    def _new_publisher(self) -> Any:
        from nats.jetstream_extra import fast_publish

        return fast_publish(self.js)

    async def _end_batch(self, publisher: Any, count: int) -> None:
        ack = await publisher.close()  # raises for a batch the server ended early
        if ack.batch_size not in (None, count):
            raise RuntimeError(f"the batch ended with {ack!r}, not {count} messages stored")

    async def close(self) -> None:
        await self.flush()
        await self.client.close()


class NatsioFastPublisherPeer(_FastPublisherPeer):
    """natsio with natsio-jetstream-batch's ``fast_publisher`` at its defaults."""

    name = "natsio-jetstream-batch"

    async def start(self) -> None:
        natsio = importlib.import_module("natsio")
        StreamConfig = importlib.import_module("natsio.jetstream").StreamConfig
        ALLOW_BATCHED = importlib.import_module("natsio.jetstream_batch").ALLOW_BATCHED
        self.client = await natsio.connect(*self.servers)
        self.js = self.client.jetstream()
        if not await _any(self.js.stream_names(subject=self.topic)):
            config = StreamConfig(
                name=_stream_name(self.topic),
                subjects=[self.topic, f"{self.topic}.>"],
                extra={ALLOW_BATCHED: True},
            )
            await self.js.create_stream(config)

    def _new_publisher(self) -> Any:
        return importlib.import_module("natsio.jetstream_batch").fast_publisher(self.js)

    async def _end_batch(self, publisher: Any, count: int) -> None:
        ack = await publisher.close()  # raises for a batch the server ended early
        if ack is None or ack.size != count:
            raise RuntimeError(f"the batch ended with {ack!r}, not {count} messages stored")

    async def close(self) -> None:
        await self.flush()
        await self.client.close()


async def _any(names: Any) -> bool:
    """Whether the async iterator ``names`` (a client's stream names for a subject) has one."""
    async for _ in names:
        return True
    return False


def _stream_name(topic: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in topic)


PEERS: dict[str, Callable[[str, str, int, str | None], Target]] = {
    "aiokafka": AiokafkaPeer,
    "aiokafka-idempotent": AiokafkaIdempotentPeer,
    "confluent-kafka": ConfluentPeer,
    "confluent-kafka-linger0": ConfluentLingerZeroPeer,
    "confluent-kafka-aio": ConfluentAIOPeer,
    "kafka-python": KafkaPythonPeer,
    "nats-py": NatsPeer,
    "nats-jetstream-extra": NatsJetstreamExtraPeer,
    "natsio-jetstream-batch": NatsioFastPublisherPeer,
}

#: The module each peer imports, and what to install for it.
_NEEDS = {
    "aiokafka": ("aiokafka", "pip install aiokafka"),
    "aiokafka-idempotent": ("aiokafka", "pip install aiokafka"),
    "confluent-kafka": ("confluent_kafka", "pip install confluent-kafka"),
    "confluent-kafka-linger0": ("confluent_kafka", "pip install confluent-kafka"),
    "confluent-kafka-aio": ("confluent_kafka.aio", "pip install 'confluent-kafka>=2.13'"),
    "kafka-python": ("kafka", "pip install 'kafka-python>=3'"),
    "nats-py": ("nats.js", "pip install nats-py"),
    "nats-jetstream-extra": (
        "nats.jetstream_extra",
        "pip install nats-jetstream-extra (Python 3.13 or newer)",
    ),
    "natsio-jetstream-batch": (
        "natsio.jetstream_batch",
        "pip install natsio-jetstream-batch (Python 3.13 or newer)",
    ),
}

_BY_SCHEME = {
    "kafka": (
        "aiokafka",
        "confluent-kafka",
        "confluent-kafka-linger0",
        "confluent-kafka-aio",
        "kafka-python",
    ),
    "jetstream": ("nats-py", "nats-jetstream-extra", "natsio-jetstream-batch"),
}


def peers_for(url: str) -> tuple[str, ...]:
    """The installed peers that speak this URL's protocol (none for memory://, null://, core
    nats://); :func:`missing_peers` gives the others."""
    return tuple(
        name for name in _BY_SCHEME.get(parse_url(url).scheme, ()) if _missing(name) is None
    )


def missing_peers(url: str) -> dict[str, str]:
    """The peers of this URL's protocol that are not installed here, each with what to do."""
    named = {name: _missing(name) for name in _BY_SCHEME.get(parse_url(url).scheme, ())}
    return {name: why for name, why in named.items() if why is not None}


def _missing(name: str) -> str | None:
    module, install = _NEEDS[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing, or is another one
        found = False
    return None if found else f"{module} is not importable here: {install}"


def make_peer(
    name: str, url: str, topic: str, limit: int = 1000, compression: str | None = None
) -> Target:
    factory = PEERS.get(name)
    if factory is None:
        raise ConfigurationError(f"unknown peer {name!r}: use one of {', '.join(PEERS)}")
    missing = _missing(name)
    if missing is not None:
        raise MissingDependencyError(f"peer {name!r}: {missing}")
    return factory(url, topic, limit, compression)


async def run_peer(
    name: str,
    url: str,
    topic: str,
    messages: Sequence[tuple[bytes | None, bytes]],
    rate: float,
    on_ack: AckCallback | None = None,
    *,
    count: int | None = None,
    duration: float | None = None,
    mode: str = "nonblocking",
    limit: int = 1000,
    warmup: int = 100,
    compression: str | None = None,
) -> RunTimings:
    """Run one peer on the open-loop schedule (``rate`` 0: as fast as it goes) and time it."""
    peer = make_peer(name, url, topic, limit, compression)
    await peer.start()
    try:
        if on_ack is None:
            return await run_open_loop(
                peer, messages, rate=rate, count=count, duration=duration, mode=mode, warmup=warmup
            )
        return await run_open_loop(
            _Tee(peer, on_ack),
            messages,
            rate=rate,
            count=count,
            duration=duration,
            mode=mode,
            warmup=warmup,
        )
    finally:
        await peer.close()


class _Tee:
    """A target that reports each ack to the driver and to the caller's ``on_ack``."""

    def __init__(self, inner: Target, extra: AckCallback) -> None:
        self.inner = inner
        self.name = inner.name
        self.extra = extra

    @property
    def on_ack(self) -> AckCallback:
        return self.inner.on_ack

    @on_ack.setter
    def on_ack(self, callback: AckCallback) -> None:
        extra = self.extra

        def both(index: int, ok: bool) -> None:
            callback(index, ok)
            if index >= 0:
                extra(index, ok)

        self.inner.on_ack = both

    async def start(self) -> None:
        await self.inner.start()

    def send(self, index: int, key: bytes | None, value: bytes) -> Awaitable[Any] | None:
        return self.inner.send(index, key, value)

    async def send_wait(self, index: int, key: bytes | None, value: bytes) -> bool:
        ok = await self.inner.send_wait(index, key, value)
        if index >= 0:
            self.extra(index, ok)
        return ok

    async def flush(self) -> None:
        await self.inner.flush()

    async def close(self) -> None:
        await self.inner.close()


RATIO_MEASURES = ("response_time", "ack_latency", "send_delay")


def round_ratios(ours: dict[str, Any], peers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """producerkit's result over each peer's from the same round: per measure, the ratio of each
    percentile (None where the peer's is 0), and the ratio of throughputs."""
    ratios: dict[str, Any] = {}
    for name, theirs in peers.items():
        by_measure: dict[str, Any] = {}
        for measure in RATIO_MEASURES:
            mine, other = ours["percentiles"][measure], theirs["percentiles"][measure]
            by_measure[measure] = {
                q: (mine[f"{q}_ms"] / other[f"{q}_ms"] if other.get(f"{q}_ms") else None)
                for q in PERCENTILES
            }
        peer_rate = theirs["summary"]["throughput_msgs"]
        by_measure["throughput"] = (
            ours["summary"]["throughput_msgs"] / peer_rate if peer_rate else 0
        )
        ratios[name] = by_measure
    return ratios


def median_ratios(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over rounds of every ratio :func:`round_ratios` gives."""
    from statistics import median

    out: dict[str, Any] = {}
    for name in rounds[0]:
        by_measure: dict[str, Any] = {}
        for measure in RATIO_MEASURES:
            by_measure[measure] = {}
            for q in PERCENTILES:
                known = [r[name][measure][q] for r in rounds if r[name][measure][q] is not None]
                by_measure[measure][q] = median(known) if known else None
        by_measure["throughput"] = median(r[name]["throughput"] for r in rounds)
        out[name] = by_measure
    return out
