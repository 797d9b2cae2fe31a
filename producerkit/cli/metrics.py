"""``--metrics-port PORT``: Prometheus metrics of ``producerkit produce`` and ``producerkit demo``.

Served on ``http://127.0.0.1:PORT/metrics`` by prometheus-client (``producerkit[metrics]``),
imported only when the flag is given. What is exported:

=============================================  =====================================================
``producerkit_messages_produced_total``        messages admitted by the producer
``producerkit_messages_acked_total``           messages the broker acknowledged
``producerkit_messages_failed_total{error}``   messages that failed, by exception name
``producerkit_messages_in_flight``             messages produced and not yet acked or failed
``producerkit_messages_peak_in_flight``        the most that were in flight at once
``producerkit_window_waits_total``             produce calls that waited for room in the window
``producerkit_window_wait_seconds_total``      the time they waited
``producerkit_ack_latency_seconds``            histogram: produce() to ack, per acked message
``producerkit_records_rejected_total{reason}``  input records that never became a message:
                                               unparseable, or refused by produce() (too large,
                                               not serializable)
=============================================  =====================================================

The acked and failed counts and the latencies come from the producer's ``on_outcome`` hook; the
others from ``producer.stats``. A scrape reads them all on the producer's event loop, so every
scrape is one consistent moment: ``produced == acked + failed + in_flight``. Counters accumulate
over the producers a command runs one after another (the demo runs four).
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import sys
import threading
from collections.abc import Iterator
from typing import Any

import attrs

from producerkit import Outcome, Producer, Stats, otel
from producerkit.errors import ConfigurationError, MissingDependencyError

#: Ack latency buckets, in seconds: the same bounds as the OpenTelemetry histogram's.
LATENCY_BUCKETS = otel.LATENCY_BUCKETS


@attrs.frozen
class Snapshot:
    """Every metric's value at one moment (taken on the producer's loop)."""

    produced: int = 0
    acked: int = 0
    failed: dict[str, int] = attrs.field(factory=dict)
    in_flight: int = 0
    peak_in_flight: int = 0
    window_waits: int = 0
    window_wait_seconds: float = 0.0
    latency_buckets: tuple[int, ...] = (0,) * (len(LATENCY_BUCKETS) + 1)
    latency_sum: float = 0.0
    rejected: dict[str, int] = attrs.field(factory=dict)


class Metrics:
    """The counters of one command run, and the HTTP server that exports them.

    ``observe`` is the producer's ``on_outcome`` hook; ``attach``/``detach`` bracket each
    producer's life (its stats are read while attached and folded into the totals on detach);
    ``rejected`` counts a record that never reached the producer.
    """

    def __init__(self) -> None:
        self._acked = 0
        self._failed: dict[str, int] = {}
        self._buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # the last is +Inf
        self._latency_sum = 0.0
        self._rejected: dict[str, int] = {}
        self._done = Stats(0, 0, 0, 0, 0, 0)  # producers detached so far, summed
        self._producer: Producer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()  # attach/detach against a scrape from the server thread
        self._server: Any = None

    # ------------------------------------------------------------------ fed on the loop

    def observe(self, outcome: Outcome) -> None:
        """The ``on_outcome`` hook: count the messages, and each acked one's latency."""
        if outcome.error is not None:
            name = type(outcome.error).__name__
            self._failed[name] = self._failed.get(name, 0) + len(outcome.numbers)
            return
        self._acked += len(outcome.numbers)
        settled, buckets, bounds = outcome.settled_at, self._buckets, LATENCY_BUCKETS
        total = 0.0
        for produced in outcome.produced_at:
            latency = settled - produced
            buckets[bisect.bisect_left(bounds, latency)] += 1
            total += latency
        self._latency_sum += total

    def rejected(self, error: BaseException) -> None:
        name = type(error).__name__
        self._rejected[name] = self._rejected.get(name, 0) + 1

    def attach(self, producer: Producer) -> None:
        """Read ``producer``'s stats from now on; call on its running loop."""
        with self._lock:
            self._producer = producer
            self._loop = asyncio.get_running_loop()

    def detach(self) -> None:
        """Fold the producer's final stats into the totals; call on its loop once it is closed."""
        with self._lock:
            if self._producer is not None:
                stats, done = self._producer.stats, self._done
                self._done = Stats(
                    produced=done.produced + stats.produced,
                    acked=0,
                    failed=0,
                    in_flight=0,
                    peak_in_flight=max(done.peak_in_flight, stats.peak_in_flight),
                    window_waits=done.window_waits + stats.window_waits,
                    window_wait_seconds=done.window_wait_seconds + stats.window_wait_seconds,
                )
            self._producer = self._loop = None

    # ------------------------------------------------------------------ read by a scrape

    def snapshot(self) -> Snapshot:
        """Every value at one moment: taken on the producer's loop while one is attached."""
        with self._lock:
            loop = self._loop
        if loop is not None and not loop.is_closed():
            future: concurrent.futures.Future[Snapshot] = concurrent.futures.Future()

            def take() -> None:
                try:
                    future.set_result(self._take())
                except BaseException as exc:  # pragma: no cover - reported to the scrape
                    future.set_exception(exc)

            try:
                loop.call_soon_threadsafe(take)
                return future.result(timeout=5.0)
            except (RuntimeError, concurrent.futures.TimeoutError):
                pass  # the loop closed meanwhile, or is stuck: read without it
        with self._lock:
            return self._take()

    def _take(self) -> Snapshot:
        done, producer = self._done, self._producer
        stats = producer.stats if producer is not None else Stats(0, 0, 0, 0, 0, 0)
        return Snapshot(
            produced=done.produced + stats.produced,
            acked=self._acked,
            failed=dict(self._failed),
            in_flight=stats.in_flight,
            peak_in_flight=max(done.peak_in_flight, stats.peak_in_flight),
            window_waits=done.window_waits + stats.window_waits,
            window_wait_seconds=done.window_wait_seconds + stats.window_wait_seconds,
            latency_buckets=tuple(self._buckets),
            latency_sum=self._latency_sum,
            rejected=dict(self._rejected),
        )

    def collect(self) -> Iterator[Any]:
        """prometheus-client's collector protocol: the metric families of one snapshot."""
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        now = self.snapshot()
        yield CounterMetricFamily(
            "producerkit_messages_produced", "Messages admitted by the producer", now.produced
        )
        yield CounterMetricFamily(
            "producerkit_messages_acked", "Messages the broker acknowledged", now.acked
        )
        failed = CounterMetricFamily(
            "producerkit_messages_failed", "Messages that failed, by error", labels=["error"]
        )
        for name, count in sorted(now.failed.items()):
            failed.add_metric([name], count)
        yield failed
        yield GaugeMetricFamily(
            "producerkit_messages_in_flight",
            "Messages produced, not yet acked or failed",
            now.in_flight,
        )
        yield GaugeMetricFamily(
            "producerkit_messages_peak_in_flight",
            "The most messages in flight at once",
            now.peak_in_flight,
        )
        yield CounterMetricFamily(
            "producerkit_window_waits",
            "Produce calls that waited for room in the window",
            now.window_waits,
        )
        yield CounterMetricFamily(
            "producerkit_window_wait_seconds",
            "Seconds produce calls waited for room",
            now.window_wait_seconds,
        )
        cumulative, running = [], 0
        bounds = (*map(str, LATENCY_BUCKETS), "+Inf")
        for bound, count in zip(bounds, now.latency_buckets, strict=True):
            running += count
            cumulative.append((bound, running))
        yield HistogramMetricFamily(
            "producerkit_ack_latency_seconds",
            "Seconds from produce() to the broker's ack, per acked message",
            buckets=cumulative,
            sum_value=now.latency_sum,
        )
        rejected = CounterMetricFamily(
            "producerkit_records_rejected",
            "Input records that never became a message (unparseable, or refused by produce())",
            labels=["reason"],
        )
        for name, count in sorted(now.rejected.items()):
            rejected.add_metric([name], count)
        yield rejected

    # ------------------------------------------------------------------ the server

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``host:port`` in a daemon thread; returns the port (0 picks
        a free one). ConfigurationError if prometheus-client is missing or the port is taken."""
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError as exc:
            raise MissingDependencyError(
                '--metrics-port needs prometheus-client: pip install "producerkit[metrics]"'
            ) from exc
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        try:
            self._server, _ = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise ConfigurationError(f"cannot serve metrics on {host}:{port}: {exc}") from None
        bound: int = self._server.server_port
        print(f"metrics on http://{host}:{bound}/metrics", file=sys.stderr, flush=True)
        return bound

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
