"""Scaling: msgs/s for connections 1, 2, 4 x partitions 1, 2, 4 x Kafka (Tansu) / JetStream.

    python benches/scaling.py [--rtt-ms 5] [--seconds 3] [--limit 1000] [--keys 1024]
                              [--producers 4] [-o max_batch_size=16384]
                              [--backends kafka,jetstream] [--json results/scaling.json]
                              [--markdown results/scaling.md]

The seed's lessons "embrace partitions" and "use more than one connection", on this machine. Each
cell runs one ``Producer(connections=C, max_in_flight_messages=L)`` as fast as it goes
(nonblocking, 100-byte values, keys cycling over ``--keys`` distinct keys so that messages spread
over the partitions) through a :class:`~producerkit.testing.proxy.FaultProxy` adding ``--rtt-ms``
of round trip, then flushes; msgs/s is acked messages over the time from the first produce to the
end of the flush. A last row per backend runs ``--producers`` separate Producers (one window
each, as the seed's "1 to 4 producers" did) on 4 partitions.

- Kafka: a topic with P partitions (admin client), Tansu with ``null://`` storage so that the
  broker is not what is measured; ``-o NAME=VALUE`` passes Kafka options (``-o
  max_batch_size=16384``: aiokafka's default batch ceiling instead of producerkit's 512 KiB);
- JetStream: ``partitions=P`` (subjects ``{topic}.{p}``) on one memory stream, deleted after
  the cell.

The proxy runs in its own process (not a thread of this one) so that it does not take the
producer's GIL; the table also gives the CPU each process used (100% = one core) to show what
the bottleneck was: this machine has 2 cores for producer, proxy and broker together.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import _brokers

import producerkit as pk
from producerkit.testing.brokers import create_kafka_topic

CONNECTIONS = (1, 2, 4)
PARTITIONS = (1, 2, 4)
_TICKS = os.sysconf("SC_CLK_TCK")

# The proxy, in a child process: prints its URL, runs until its stdin closes.
_PROXY_MAIN = """
import sys
from producerkit.testing.proxy import FaultProxy
proxy = FaultProxy.for_url(sys.argv[1], float(sys.argv[2])).start()
print(proxy.url, flush=True)
sys.stdin.read()
proxy.stop()
"""


class ProxyProcess:
    """A FaultProxy in its own Python process."""

    def __init__(self, url: str, rtt_ms: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _PROXY_MAIN, url, str(rtt_ms)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().strip()
        if not self.url:
            self.close()
            raise RuntimeError("the delay proxy process did not start")

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        # Fields after the ")" closing the command name: utime and stime are the 12th and 13th.
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


async def delete_jetstream_stream(broker_url: str, topic: str) -> None:
    import nats
    import nats.js.errors

    nc = await nats.connect(broker_url.replace("jetstream://", "nats://"))
    try:
        # The stream name producerkit's create_stream gives a topic.
        await nc.jetstream().delete_stream(re.sub(r"[^A-Za-z0-9_-]", "_", topic))
    except nats.js.errors.NotFoundError:
        pass
    finally:
        await nc.close()


async def run_cell(
    backend: str,
    url: str,
    broker: _brokers.Broker,
    proxy: ProxyProcess,
    partitions: int,
    connections: int,
    args: argparse.Namespace,
    producers: int = 1,
) -> dict[str, Any]:
    """One cell: ``producers`` Producers (each ``connections=C``) as fast as they go, then flush.

    With several producers, key k always goes through producer ``k % producers``."""
    topic = f"scaling-{backend}-p{partitions}-c{connections}-{uuid.uuid4().hex[:6]}"
    options: dict[str, Any] = dict(args.kafka_options if backend == "kafka" else {})
    if backend == "kafka":
        await create_kafka_topic(broker.kafka_url, topic, partitions)
    else:
        options.update(partitions=partitions, create_stream=True)
    keys = [b"key-%d" % i for i in range(args.keys)]
    value = os.urandom(args.record_size)
    pids = {"client": os.getpid(), "proxy": proxy.process.pid}
    if broker.pid is not None:  # a broker named by URL is not measured
        pids["broker"] = broker.pid
    async with contextlib.AsyncExitStack() as stack:
        if backend == "jetstream":  # runs last, once the producers have closed
            stack.push_async_callback(delete_jetstream_stream, broker.jetstream_url, topic)
        group = [
            await stack.enter_async_context(
                pk.Producer(
                    url,
                    topic=topic,
                    connections=connections,
                    max_in_flight_messages=args.limit,
                    **options,
                )
            )
            for _ in range(producers)
        ]
        # Warm-up: every connection connected, metadata known, code paths hot.
        for i, key in enumerate(keys * 2):
            await group[i % producers].produce(value, key=key, nonblocking=True)
        await asyncio.gather(*(producer.flush() for producer in group))
        before = [producer.stats for producer in group]
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        started = time.perf_counter()
        deadline = started + args.seconds

        async def send(producer: pk.Producer, own_keys: list[bytes]) -> None:
            # One task per producer: a producer waiting for room in its window must not hold
            # up the others (they are independent, as separate processes would be).
            produce = producer.produce
            while time.perf_counter() < deadline:  # the clock is read once per key cycle
                for key in own_keys:
                    await produce(value, key=key, nonblocking=True)
            await producer.flush()

        await asyncio.gather(
            *(send(producer, keys[index::producers]) for index, producer in enumerate(group))
        )
        elapsed = time.perf_counter() - started
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        after = [producer.stats for producer in group]
    acked = failed = produced = waits = 0
    per_connection: list[int] = []
    for b, a in zip(before, after, strict=True):
        acked += a.acked - b.acked
        failed += a.failed - b.failed
        produced += a.produced - b.produced
        waits += a.window_waits - b.window_waits
        per_connection += [
            x.acked - y.acked for x, y in zip(a.connections, b.connections, strict=True)
        ]
    assert failed == 0 and produced == acked, (produced, acked, failed)
    return {
        "backend": backend,
        "partitions": partitions,
        "connections": connections,
        "producers": producers,
        "messages": acked,
        "seconds": elapsed,
        "msgs_per_s": acked / elapsed,
        "acked_per_connection": per_connection,
        "window_waits": waits,
        "cpu_percent": {name: 100.0 * used / elapsed for name, used in cpu.items()},
    }


async def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cells = [(p, c, 1) for p in PARTITIONS for c in CONNECTIONS]
    if args.producers > 1:  # the seed's "1 to 4 producers": a window each
        cells.append((max(PARTITIONS), 1, args.producers))
    for backend in args.backends:
        if backend == "kafka":
            started = _brokers.kafka(args.kafka_url, storage=args.kafka_storage)
        else:
            started = _brokers.nats(args.nats_url)
        with started as broker:
            url = broker.kafka_url if backend == "kafka" else broker.jetstream_url
            rows += await _sweep_backend(args, backend, url, broker, cells)
    return rows


async def _sweep_backend(
    args: argparse.Namespace,
    backend: str,
    url: str,
    broker: _brokers.Broker,
    cells: list[tuple[int, int, int]],
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with ProxyProcess(url, args.rtt_ms) as proxy:
        base: float | None = None
        for partitions, connections, producers in cells:
            row = await run_cell(
                backend, proxy.url, broker, proxy, partitions, connections, args, producers
            )
            base = base or row["msgs_per_s"]
            row["speedup"] = row["msgs_per_s"] / base
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


HEADER = (
    "| backend | partitions | connections | producers | msg/s | speed-up | acked per connection "
    "| window waits | CPU client % | CPU proxy % | CPU broker % |\n"
    "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"
)


def format_row(row: dict[str, Any]) -> str:
    cpu = row["cpu_percent"]
    spread = " / ".join(f"{n:,}" for n in row["acked_per_connection"])
    return (
        f"| {row['backend']} | {row['partitions']} | {row['connections']} | {row['producers']} "
        f"| {row['msgs_per_s']:,.0f} | {row['speedup']:.2f}x | {spread} | {row['window_waits']} "
        f"| {cpu['client']:.0f} | {cpu['proxy']:.0f} | "
        + (f"{cpu['broker']:.0f}" if "broker" in cpu else "-")
        + " |"
    )


def matrix(rows: list[dict[str, Any]], backend: str) -> str:
    """msgs/s and speed-up over connections=1, partitions=1: partitions down, connections across
    (one Producer per cell)."""
    cells = {
        (r["partitions"], r["connections"]): r
        for r in rows
        if r["backend"] == backend and r["producers"] == 1
    }
    lines = [
        f"| {backend} | " + " | ".join(f"connections={c}" for c in CONNECTIONS) + " |",
        "|---|" + "---:|" * len(CONNECTIONS),
    ]
    for p in PARTITIONS:
        entries = [
            f"{cells[p, c]['msgs_per_s']:,.0f} ({cells[p, c]['speedup']:.2f}x)"
            if (p, c) in cells
            else "-"
            for c in CONNECTIONS
        ]
        lines.append(f"| partitions={p} | " + " | ".join(entries) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rtt-ms", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per cell")
    parser.add_argument("--limit", type=int, default=1000, help="max_in_flight_messages")
    parser.add_argument("--keys", type=int, default=1024)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument(
        "--backends",
        default=["kafka", "jetstream"],
        type=lambda text: [name for name in text.split(",") if name],
    )
    parser.add_argument(
        "--kafka-storage", default="null://sink", help="Tansu storage (memory://tansu/ keeps)"
    )
    parser.add_argument(
        "--producers",
        type=int,
        default=4,
        help="also run this many separate Producers (connections=1 each, 4 partitions); 1: no",
    )
    parser.add_argument(
        "-o",
        "--kafka-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="Kafka backend option, e.g. max_batch_size=16384",
    )
    parser.add_argument("--json", type=Path, default=Path("results/scaling.json"))
    parser.add_argument("--markdown", type=Path)
    _brokers.add_broker_flags(parser)
    args = parser.parse_args()
    args.kafka_options = dict(pair.split("=", 1) for pair in args.kafka_option)
    print(
        f"# {args.rtt_ms:g} ms RTT, limit {args.limit}, {args.keys} keys, "
        f"{args.record_size}-byte values, {args.seconds:g} s per cell, "
        f"Kafka options {args.kafka_options or 'default'}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
        flush=True,
    )
    print(HEADER, flush=True)
    rows = asyncio.run(sweep(args))
    matrices = "\n\n".join(matrix(rows, backend) for backend in args.backends)
    print()
    print(matrices)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    settings = {
        "rtt_ms": args.rtt_ms,
        "seconds": args.seconds,
        "max_in_flight_messages": args.limit,
        "keys": args.keys,
        "record_size": args.record_size,
        "kafka_storage": args.kafka_storage,
        "kafka_options": args.kafka_options,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1))
    print(f"wrote {args.json}")
    if args.markdown:
        text = HEADER + "\n" + "\n".join(map(format_row, rows)) + "\n\n" + matrices + "\n"
        args.markdown.write_text(text)
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
