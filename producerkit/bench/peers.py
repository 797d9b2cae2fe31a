"""The raw clients producerkit is compared with, each behind the open-loop :class:`Target` seam.

- ``aiokafka``: ``await producer.send()`` per message (it returns a future; acks through its
  done-callback), ``linger_ms=0``, ``acks=1`` (producerkit's defaults);
- ``confluent-kafka``: librdkafka's defaults (linger 5 ms, acks all), ``produce(...,
  on_delivery=...)`` with a thread blocked in ``poll()`` (so acks are timed when librdkafka reports
  them, not when the event loop next gets round to polling); ``confluent-kafka-linger0`` the
  same with ``linger.ms=0``. Both keep librdkafka's per-second statistics (round trip to the
  broker, time in its queues, messages per request) in ``diagnostics``;
- ``nats-py``: JetStream ``publish_async`` (a future per message, at most ``limit`` pending).

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
import functools
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
from producerkit.errors import ConfigurationError

__all__ = ["PEERS", "make_peer", "median_ratios", "peers_for", "round_ratios", "run_peer"]


def _ignore(index: int, ok: bool) -> None:
    pass


class AiokafkaPeer:
    name = "aiokafka"

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
            bootstrap_servers=self.bootstrap,
            linger_ms=0,
            acks=1,
            enable_idempotence=False,
            compression_type=self.compression,
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
            name = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.topic)
            await self.js.add_stream(name=name, subjects=[self.topic, f"{self.topic}.>"])

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


PEERS: dict[str, Callable[[str, str, int, str | None], Target]] = {
    "aiokafka": AiokafkaPeer,
    "confluent-kafka": ConfluentPeer,
    "confluent-kafka-linger0": ConfluentLingerZeroPeer,
    "nats-py": NatsPeer,
}

_BY_SCHEME = {
    "kafka": ("aiokafka", "confluent-kafka", "confluent-kafka-linger0"),
    "jetstream": ("nats-py",),
}


def peers_for(url: str) -> tuple[str, ...]:
    """The peers that speak this URL's protocol (none for memory://, null://, core nats://)."""
    return _BY_SCHEME.get(parse_url(url).scheme, ())


def make_peer(
    name: str, url: str, topic: str, limit: int = 1000, compression: str | None = None
) -> Target:
    factory = PEERS.get(name)
    if factory is None:
        raise ConfigurationError(f"unknown peer {name!r}: use one of {', '.join(PEERS)}")
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
