"""OpenTelemetry metrics for producers (``pip install "producerkit[otel]"``).

::

    from producerkit.otel import ProducerMetrics

    metrics = ProducerMetrics()  # the global MeterProvider, or ProducerMetrics(meter_provider)
    producer = metrics.watch(pk.Producer(url, topic="orders", on_outcome=metrics))

A :class:`ProducerMetrics` is the producer's ``on_outcome`` hook: it counts acked and failed
messages and records each ack's latency. Given the producer with
:meth:`~ProducerMetrics.watch`, it also reads the producer's :attr:`~producerkit.Producer.stats`
whenever the metrics are collected (in flight, window waits). :func:`instrumented` does both
in one call.

Everything goes through OpenTelemetry's metrics API, so any SDK and exporter (OTLP, Prometheus)
reads it; without an SDK it records nothing and costs next to nothing. Counts are kept in plain
integers and reported through observable counters at collection time, so a counter costs a
dictionary update per Outcome; only the latency histogram calls OpenTelemetry per message.
docs/observability.md lists the instruments and what they cost.
"""

from __future__ import annotations

import logging
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeVar

from producerkit._types import Outcome, Stats
from producerkit.errors import MissingDependencyError

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

    from producerkit._producer import Producer

__all__ = ["ProducerMetrics", "instrumented"]

logger = logging.getLogger("producerkit.otel")

#: With ``latency_every="auto"``: about how many latencies a second are recorded at most.
AUTO_LATENCIES_PER_SECOND: Final = 10_000

#: The attribute keys: OpenTelemetry's messaging conventions where they have one.
SYSTEM: Final = "messaging.system"  # the URL scheme: kafka, jetstream, nats, memory, null
TOPIC: Final = "messaging.destination.name"  # the Kafka topic or NATS subject
CONNECTION: Final = "producerkit.connection"  # which of the producer's connections
ERROR_TYPE: Final = "error.type"  # the exception's class name, on failures

#: Bucket bounds of ``producerkit.ack.latency``, in seconds (OpenTelemetry's default bounds are
#: for milliseconds): local brokers ack in well under a millisecond, a WAN in tens. The CLI's
#: Prometheus histogram (producerkit.cli.metrics) uses them too.
LATENCY_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

Attributes = tuple[tuple[str, Any], ...]  # sorted, so that equal sets are equal keys
Points = dict[Attributes, float]


class Watchable(Protocol):
    """A :class:`~producerkit.Producer` or :class:`~producerkit.SyncProducer`."""

    @property
    def stats(self) -> Stats: ...


P = TypeVar("P", bound=Watchable)


class ProducerMetrics:
    """Records a producer's outcomes and statistics through OpenTelemetry's metrics API.

    Pass it as the producer's ``on_outcome`` and :meth:`watch` the producer. One serves one
    backend: the hook is told of outcomes, not of the producer they came from. Its counts
    outlive it (they stay in the provider's totals), so counters never go down when producers
    come and go; for many short-lived producers, reuse one ProducerMetrics.

    Args:
        meter_provider: where the instruments are made; OpenTelemetry's global one by default.
        attributes: added to every measurement (``{"service.component": "orders"}``).
        latency_every: which acked messages' latencies ``producerkit.ack.latency`` records:
            ``"auto"`` (the default) every one while that is at most
            :data:`AUTO_LATENCIES_PER_SECOND` a second, else one in ``n`` (by message number),
            ``n`` set each second from the last second's acks, and never more than that many
            in a second; an int ``n``: always one in ``n`` (1: every one); None: none. Each
            value recorded costs a few microseconds in OpenTelemetry's SDK, which is why the
            default samples at high rates; the histogram then counts samples, and
            ``producerkit.messages.acked`` stays the exact count.
    """

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        *,
        attributes: Mapping[str, str | int | float | bool] | None = None,
        latency_every: int | Literal["auto"] | None = "auto",
    ) -> None:
        try:
            from opentelemetry import metrics
        except ImportError as exc:
            raise MissingDependencyError(
                'ProducerMetrics needs OpenTelemetry: run  pip install "producerkit[otel]"'
            ) from exc
        if latency_every not in (None, "auto") and (
            type(latency_every) is not int or latency_every < 1
        ):
            raise ValueError(
                f'latency_every must be "auto", a positive int or None, not {latency_every!r}'
            )
        provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        instruments = _Instruments.of(provider)
        self._record = instruments.latency.record
        self._auto = latency_every == "auto"
        self._every: int | None = 1 if isinstance(latency_every, str) else latency_every
        self._second_started = 0.0  # "auto": the second whose acks are being counted
        self._acks_this_second = 0
        self._recorded_this_second = 0
        self._counts = counts = _Counts(dict(attributes or {}))
        self._lock = counts.lock
        self._acked = counts.acked
        self._failed = counts.failed
        self._latency_attributes: dict[tuple[str, int], dict[str, Any]] = {}
        instruments.join(self, counts)

    # ------------------------------------------------------------------ the on_outcome hook

    def __call__(self, outcome: Outcome) -> None:
        """Count an :class:`~producerkit.Outcome`, and record each acked message's latency."""
        error = outcome.error
        if error is not None:
            failed = (outcome.topic, outcome.connection, type(error).__name__)
            with self._lock:
                self._failed[failed] = self._failed.get(failed, 0) + len(outcome.numbers)
            return
        key = (outcome.topic, outcome.connection)
        with self._lock:
            self._acked[key] = self._acked.get(key, 0) + len(outcome.numbers)
        every = self._every
        if every is None:
            return
        attributes = self._latency_attributes.get(key)
        if attributes is None:
            own = {TOPIC: key[0], CONNECTION: key[1]}
            attributes = self._latency_attributes[key] = dict(self._counts.attributes(own))
        # One record per message: OpenTelemetry's API has no way to record a value n times, or
        # n values at once (opentelemetry-specification#3369), so this loop is the cost.
        record = self._record
        settled = outcome.settled_at
        if self._auto:
            self._record_sampled(outcome, attributes)
        elif every == 1:
            for produced in outcome.produced_at:
                record(settled - produced, attributes)
        else:
            for number, produced in zip(outcome.numbers, outcome.produced_at, strict=True):
                if not number % every:
                    record(settled - produced, attributes)

    def _record_sampled(self, outcome: Outcome, attributes: dict[str, Any]) -> None:
        """``latency_every="auto"``: one in ``n`` acks (by number), ``n`` set each second from
        the last second's acks to record about AUTO_LATENCIES_PER_SECOND, and never more than
        that many in one second (so a burst costs no more than a steady rate)."""
        settled = outcome.settled_at
        if settled - self._second_started >= 1.0:
            self._every = max(1, -(-self._acks_this_second // AUTO_LATENCIES_PER_SECOND))
            self._second_started = settled
            self._acks_this_second = self._recorded_this_second = 0
        self._acks_this_second += len(outcome.numbers)
        room = AUTO_LATENCIES_PER_SECOND - self._recorded_this_second
        every = self._every or 1
        record = self._record
        recorded = 0
        for number, produced in zip(outcome.numbers, outcome.produced_at, strict=True):
            if recorded >= room:
                break
            if not number % every:
                record(settled - produced, attributes)
                recorded += 1
        self._recorded_this_second += recorded

    # ------------------------------------------------------------------ the watched producers

    def watch(self, producer: P) -> P:
        """Read ``producer``'s :attr:`~producerkit.Producer.stats` at each collection, and
        return it: ``producer = metrics.watch(pk.Producer(url, on_outcome=metrics))``.

        Also learns the producer's backend (its URL scheme) for every measurement's
        ``messaging.system``. The producer is held weakly: it is read until it is
        garbage-collected, or until :meth:`unwatch`.
        """
        system = _scheme_of(producer)
        counts = self._counts
        if counts.system not in (None, system):
            raise ValueError(
                f"this ProducerMetrics counts {counts.system}:// producers; "
                f"make another for {system}://"
            )
        with counts.lock:
            counts.system = system
            if not any(watched.ref() is producer for watched in counts.watched):
                counts.watched.append(_Watched(producer))
        self._latency_attributes = {}  # made again, with the system
        return producer

    def unwatch(self, producer: Watchable) -> None:
        """Stop reading ``producer``'s stats (its window waits so far stay counted)."""
        self._counts.unwatch(producer)

    def __repr__(self) -> str:
        counts = self._counts
        system = f"{counts.system}://" if counts.system else "no backend yet"
        return f"<ProducerMetrics {system} watching {len(counts.watched)}>"


def instrumented(
    url: str,
    *,
    meter_provider: MeterProvider | None = None,
    attributes: Mapping[str, str | int | float | bool] | None = None,
    latency_every: int | Literal["auto"] | None = "auto",
    **producer_options: Any,
) -> Producer:
    """A :class:`~producerkit.Producer` measured by a new :class:`ProducerMetrics`: the same as
    ``metrics.watch(Producer(url, on_outcome=metrics, **producer_options))``. An
    ``on_outcome`` of your own is called too, after the metrics'."""
    from producerkit._producer import Producer

    metrics = ProducerMetrics(meter_provider, attributes=attributes, latency_every=latency_every)
    hook: Callable[[Outcome], object] = metrics
    own = producer_options.pop("on_outcome", None)
    if own is not None:

        def hook(outcome: Outcome) -> None:
            metrics(outcome)
            own(outcome)

    return metrics.watch(Producer(url, on_outcome=hook, **producer_options))


# ---------------------------------------------------------------------- what collection reads


class _Watched:
    """A watched producer, weakly, with the window figures last read from it."""

    __slots__ = ("ref", "wait_seconds", "waits")

    def __init__(self, producer: Watchable) -> None:
        self.ref = weakref.ref(producer)
        self.waits = 0
        self.wait_seconds = 0.0


class _Counts:
    """What one ProducerMetrics counted, and the producers it watches: read at each collection,
    and kept in its provider's totals once the ProducerMetrics is gone."""

    def __init__(self, extra: dict[str, Any]) -> None:
        self.lock = threading.Lock()
        self.extra = extra
        self.system: str | None = None
        self.acked: dict[tuple[str, int], int] = {}  # (topic, connection) -> messages
        self.failed: dict[tuple[str, int, str], int] = {}  # (topic, connection, error type)
        self.watched: list[_Watched] = []
        # window waits of producers no longer read (gone, or unwatched)
        self.waits_before = 0
        self.wait_seconds_before = 0.0
        self._warned = False

    def attributes(self, own: dict[str, Any]) -> Attributes:
        attributes = {**self.extra, **own}
        if self.system is not None:
            attributes[SYSTEM] = self.system
        return tuple(sorted(attributes.items()))

    def unwatch(self, producer: Watchable) -> None:
        self.live_stats()  # their last figures
        with self.lock:
            for watched in [w for w in self.watched if w.ref() is producer]:
                self._forget(watched)

    def _forget(self, watched: _Watched) -> None:
        self.watched.remove(watched)
        self.waits_before += watched.waits
        self.wait_seconds_before += watched.wait_seconds

    def live_stats(self) -> list[Stats]:
        """The stats of every watched producer still alive (the others' last window figures
        are kept; what a producer did after the last collection before it was garbage-collected
        is the one thing lost, and only for the window waits)."""
        with self.lock:
            watched = list(self.watched)
        found = []
        for entry in watched:
            producer = entry.ref()
            if producer is None:
                with self.lock:
                    if entry in self.watched:
                        self._forget(entry)
                continue
            stats = producer.stats
            entry.waits, entry.wait_seconds = stats.window_waits, stats.window_wait_seconds
            found.append(stats)
        return found

    # One function per instrument, each reading one set of points.

    def acked_points(self) -> Points:
        with self.lock:
            acked = list(self.acked.items())
        return {
            self.attributes({TOPIC: topic, CONNECTION: connection}): count
            for (topic, connection), count in acked
        }

    def failed_points(self) -> Points:
        with self.lock:
            failed = list(self.failed.items())
        return {
            self.attributes({TOPIC: topic, CONNECTION: connection, ERROR_TYPE: error}): count
            for (topic, connection, error), count in failed
        }

    def produced_points(self) -> Points:
        """Acked + failed + in flight, per connection: the producer's own invariant, so that a
        producer's messages stay counted after it is gone. The counts are read before the
        stats: a message settling in between is then missed once, never counted twice."""
        by_connection: dict[int, int] = {}
        with self.lock:
            settled = [(key[1], n) for key, n in self.acked.items()]
            settled += [(key[1], n) for key, n in self.failed.items()]
        for index, count in settled:
            by_connection[index] = by_connection.get(index, 0) + count
        live = self.live_stats()
        for stats in live:
            for connection in stats.connections:
                index = connection.index
                by_connection[index] = by_connection.get(index, 0) + connection.in_flight
        if not settled and any(stats.acked + stats.failed for stats in live):
            self._warn_unhooked()
        return {self.attributes({CONNECTION: c}): n for c, n in by_connection.items()}

    def in_flight_points(self) -> Points:
        points: Points = {}
        for stats in self.live_stats():
            for connection in stats.connections:
                attributes = self.attributes({CONNECTION: connection.index})
                points[attributes] = points.get(attributes, 0) + connection.in_flight
        return points

    def waits_points(self) -> Points:
        live = self.live_stats()
        return {self.attributes({}): self.waits_before + sum(s.window_waits for s in live)}

    def wait_seconds_points(self) -> Points:
        live = self.live_stats()
        seconds = self.wait_seconds_before + sum(s.window_wait_seconds for s in live)
        return {self.attributes({}): seconds}

    def _warn_unhooked(self) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "ProducerMetrics watches a producer whose on_outcome is not this ProducerMetrics:"
                " its acked, failed and produced counts stay at 0 "
                "(Producer(url, on_outcome=metrics), or producerkit.otel.instrumented(url))"
            )


#: The counters, by name: (points, unit, description). Their totals never go down.
_COUNTERS: Final[dict[str, tuple[Callable[[_Counts], Points], str, str]]] = {
    "producerkit.messages.produced": (
        _Counts.produced_points,
        "{message}",
        "Messages the producer admitted; each ends acked or failed",
    ),
    "producerkit.messages.acked": (
        _Counts.acked_points,
        "{message}",
        "Messages the broker acknowledged",
    ),
    "producerkit.messages.failed": (
        _Counts.failed_points,
        "{message}",
        "Messages that failed, by error.type",
    ),
    "producerkit.window.waits": (
        _Counts.waits_points,
        "{wait}",
        "Times a produce() found the in-flight window full and waited",
    ),
    "producerkit.window.wait": (
        _Counts.wait_seconds_points,
        "s",
        "Seconds produce() calls spent waiting for room in the window",
    ),
}


class _Instruments:
    """The instruments of one MeterProvider, made once: OpenTelemetry answers a second request
    for an instrument name with the first instrument and drops the second one's callbacks, so
    these callbacks read every ProducerMetrics of the provider, and keep the totals of those
    that are gone."""

    _by_provider: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()
    _registry_lock = threading.Lock()

    @classmethod
    def of(cls, provider: MeterProvider) -> _Instruments:
        with cls._registry_lock:
            instruments = cls._by_provider.get(provider)
            if instruments is None:
                instruments = cls._by_provider[provider] = cls(provider)
            return instruments

    def __init__(self, provider: MeterProvider) -> None:
        from producerkit import __version__

        meter: Meter = provider.get_meter("producerkit", __version__)
        self._lock = threading.Lock()
        self._members: list[_Counts] = []
        # Counts of ProducerMetrics that are gone: appended by their finalizer (which takes no
        # lock: it may run inside any code), moved into the totals by the next collection.
        self._leaving: list[_Counts] = []
        self._retired: dict[str, Points] = {name: {} for name in _COUNTERS}
        self._reported: dict[str, Points] = {name: {} for name in _COUNTERS}
        self.latency = meter.create_histogram(
            "producerkit.ack.latency",
            unit="s",
            description="Seconds from produce() to the broker's ack, per acked message",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS,
        )
        for name, (_, unit, description) in _COUNTERS.items():
            meter.create_observable_counter(
                name, [self._counter(name)], unit=unit, description=description
            )
        meter.create_observable_gauge(
            "producerkit.messages.in_flight",
            [self._gauge(_Counts.in_flight_points)],
            unit="{message}",
            description="Messages sent or waiting to be, not yet acked or failed",
        )

    def join(self, metrics: ProducerMetrics, counts: _Counts) -> None:
        with self._lock:
            self._members.append(counts)
        weakref.finalize(metrics, self._leaving.append, counts)

    def _members_now(self) -> list[_Counts]:
        """The live members, after moving the counts of those gone into the totals (called
        with the lock held)."""
        while self._leaving:
            counts = self._leaving.pop()
            for name, (points, _, _) in _COUNTERS.items():
                _add(self._retired[name], points(counts))
            self._members.remove(counts)
        return list(self._members)

    def _counter(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        points = _COUNTERS[name][0]

        def observe(options: CallbackOptions) -> list[Observation]:
            with self._lock:
                # The members first: those gone since the last collection move into the
                # retired totals, which are copied only then.
                members = self._members_now()
                totals = dict(self._retired[name])
                for counts in members:
                    _add(totals, points(counts))
                # Never lower than last reported: stats read from another thread than the
                # producer's may miss a message on its way from in flight to settled.
                reported = self._reported[name]
                for attributes, value in totals.items():
                    reported[attributes] = max(value, reported.get(attributes, 0))
                return _observations(reported)

        return observe

    def _gauge(
        self, points: Callable[[_Counts], Points]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> list[Observation]:
            totals: Points = {}
            with self._lock:
                for counts in self._members_now():
                    _add(totals, points(counts))
            return _observations(totals)

        return observe


def _add(totals: Points, points: Points) -> None:
    for attributes, value in points.items():
        totals[attributes] = totals.get(attributes, 0) + value


def _observations(points: Points) -> list[Observation]:
    from opentelemetry.metrics import Observation

    return [Observation(value, dict(attributes)) for attributes, value in points.items()]


_REPR_SCHEME = re.compile(r"<\w*Producer (\w+)://")


def _scheme_of(producer: Any) -> str:
    """The URL scheme of a Producer or SyncProducer: its ``scheme`` where it has one, else the
    one its repr starts with (``<Producer kafka://127.0.0.1:9092 ...>``)."""
    scheme = getattr(producer, "scheme", None)
    if isinstance(scheme, str):
        return scheme
    if not hasattr(producer, "stats"):
        raise TypeError(f"watch() takes a producerkit Producer or SyncProducer, not {producer!r}")
    match = _REPR_SCHEME.match(repr(producer))
    return match[1] if match else "unknown"
