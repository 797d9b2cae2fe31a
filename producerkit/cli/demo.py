"""``producerkit demo``: sync produce next to nonblocking produce, on this machine.

Starts Tansu and nats-server from the installed wheels, then publishes the same messages with a
synchronous produce (one round trip each) and with ``nonblocking=True`` (a bounded window of
messages in flight), on Kafka and JetStream, and prints the two rates side by side. With
``--metrics-port`` the four producers' counters add up in one Prometheus endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

import producerkit as pk
from producerkit.cli._args import ArgumentParser
from producerkit.cli._metrics_flags import add_metrics_arguments, linger, start_metrics
from producerkit.errors import ConfigurationError
from producerkit.testing.brokers import start_kafka, start_nats

if TYPE_CHECKING:
    from producerkit.cli.metrics import Metrics


#: Seconds between two progress lines of a phase (one at a time, or many at once).
PROGRESS_EVERY = 5.0


async def _rate(
    url: str,
    mode: str,
    count: int,
    limit: int,
    metrics: Metrics | None = None,
    name: str = "",
    **options: Any,
) -> tuple[float, pk.Stats]:
    """Messages per second sending ``count`` messages ``mode``-wise, and the producer's counters
    for them alone: one untimed message goes first (it connects and learns the topic) and is
    taken out of the counters, so ``produced`` is ``count``. A line every ``PROGRESS_EVERY``
    seconds says how far it got."""
    value = b"x" * 512
    producer = pk.Producer(
        url,
        topic="demo",
        max_in_flight_messages=limit,
        on_outcome=metrics.observe if metrics is not None else None,
        **options,
    )
    nonblocking = mode == "nonblocking"
    way = "many at once" if nonblocking else "one at a time"
    try:
        async with producer:
            if metrics is not None:
                metrics.attach(producer)
            await producer.produce(value, key=b"warm-up")  # connect and learn the topic first
            warm = producer.stats
            print(f"{name}: sending {count:,} messages {way} ...", flush=True)
            started = time.perf_counter()
            next_line = started + PROGRESS_EVERY
            for i in range(count):
                await producer.produce(value, key=b"user-%d" % (i % 1000), nonblocking=nonblocking)
                # One clock read per message one at a time (each is a round trip), one per 64
                # many at once (each is a few microseconds).
                if (not nonblocking or i & 63 == 0) and time.perf_counter() >= next_line:
                    now = time.perf_counter()
                    print(
                        f"{name}: {i:,} of {count:,} sent {way} in {now - started:.0f} s "
                        f"({i / (now - started):,.0f} msg/s)",
                        flush=True,
                    )
                    next_line = now + PROGRESS_EVERY
            await producer.flush()
            elapsed = time.perf_counter() - started
    finally:
        if metrics is not None:
            metrics.detach()
    return count / elapsed, _less(producer.stats, warm)


def _less(stats: pk.Stats, warm: pk.Stats) -> pk.Stats:
    """``stats`` less the warm-up message's share of the counters (``warm``: after it)."""
    return attrs.evolve(
        stats,
        produced=stats.produced - warm.produced,
        acked=stats.acked - warm.acked,
        failed=stats.failed - warm.failed,
        window_waits=stats.window_waits - warm.window_waits,
        window_wait_seconds=stats.window_wait_seconds - warm.window_wait_seconds,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="producerkit demo",
        description=(
            "Start a Kafka broker and a NATS server on this machine, send the same messages "
            "two ways, and print how many messages per second each way managed: one at a time "
            "(each waits for the broker to confirm it), then many at once (the next ones go "
            "out while earlier ones wait for their confirmation)."
        ),
        epilog="""\
examples:
  producerkit demo                    # on loopback: about 40 s, installing included
  producerkit demo --rtt-ms 10        # as if the brokers were 10 ms away (about a minute)
  producerkit demo --sync-messages 500 --nonblocking-messages 10000 --metrics-port 9464
""",
    )
    parser.add_argument(
        "--sync-messages",
        type=int,
        default=2_000,
        metavar="N",
        help="messages sent one at a time (default 2,000)",
    )
    parser.add_argument(
        "--nonblocking-messages",
        type=int,
        default=50_000,
        metavar="N",
        help="messages sent many at once (default 50,000)",
    )
    parser.add_argument(
        "--max-in-flight-messages",
        type=int,
        default=1000,
        metavar="N",
        help="how many messages may wait for their confirmation at once (default 1,000)",
    )
    parser.add_argument(
        "--rtt-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="add this many milliseconds to every exchange with the brokers, as a distant "
        "network would (default 0)",
    )
    add_metrics_arguments(parser)
    args = parser.parse_args(argv)
    try:
        metrics = start_metrics(args)
    except ConfigurationError as exc:
        parser.error(str(exc))  # exits with code 2
    interrupted = False
    try:
        _run(args, metrics)
    except KeyboardInterrupt:
        interrupted = True  # the Ctrl-C that ends the demo ends its linger too
        raise
    finally:
        linger(metrics, 0 if interrupted else args.metrics_linger)
    return 0


def _run(args: argparse.Namespace, metrics: Metrics | None) -> None:
    print("starting local brokers (Tansu Kafka, nats-server JetStream) ...", flush=True)
    with start_kafka() as kafka, start_nats(jetstream=True) as nats:
        targets = [("kafka", kafka.url, {}), ("jetstream", nats.url, {"create_stream": True})]
        rows = []
        for name, url, options in targets:
            with _maybe_delayed(url, args.rtt_ms, kafka if name == "kafka" else None) as target:
                sync_rate, _ = asyncio.run(
                    _rate(
                        target,
                        "sync",
                        args.sync_messages,
                        args.max_in_flight_messages,
                        metrics,
                        name,
                        **options,
                    )
                )
                nb_rate, stats = asyncio.run(
                    _rate(
                        target,
                        "nonblocking",
                        args.nonblocking_messages,
                        args.max_in_flight_messages,
                        metrics,
                        name,
                        **options,
                    )
                )
            rows.append((name, sync_rate, nb_rate, stats))
    rtt = f", {args.rtt_ms:g} ms RTT" if args.rtt_ms else " (loopback)"
    print(f"\n512-byte keyed messages{rtt}; window limit {args.max_in_flight_messages}\n")
    print(
        f"{'backend':<10} {'sync msg/s':>12} {'nonblocking msg/s':>18} {'speed-up':>9}  accounting"
    )
    for name, sync_rate, nb_rate, stats in rows:
        accounting = (
            f"produced={stats.produced} acked={stats.acked} failed={stats.failed} "
            f"peak_in_flight={stats.peak_in_flight} window_waits={stats.window_waits}"
        )
        print(
            f"{name:<10} {sync_rate:>12,.0f} {nb_rate:>18,.0f} "
            f"{nb_rate / sync_rate:>8.1f}x  {accounting}"
        )
    print("\nSync produce waits one round trip per message; nonblocking keeps up to the window's")
    print("limit in flight and drains to half when it fills. The accounting is the timed")
    print("messages' (an untimed first message connects each producer).")
    if not args.rtt_ms:
        print("Try --rtt-ms 10 to see a WAN: every exchange with the brokers 10 ms longer.")


class _maybe_delayed:
    """A delay proxy in front of the broker when --rtt-ms is given (else the URL unchanged)."""

    def __init__(self, url: str, rtt_ms: float, kafka: object | None) -> None:
        self.url = url
        self.rtt_ms = rtt_ms
        self.proxy: object | None = None

    def __enter__(self) -> str:
        if not self.rtt_ms:
            return self.url
        from producerkit.testing.proxy import FaultProxy

        proxy = FaultProxy.for_url(self.url, rtt_ms=self.rtt_ms)
        self.proxy = proxy.start()
        return proxy.url

    def __exit__(self, *exc: object) -> None:
        if self.proxy is not None:
            self.proxy.stop()  # type: ignore[attr-defined]
