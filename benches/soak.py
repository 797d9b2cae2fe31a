"""Soak: millions of messages through one producer, watching its memory.

    python benches/soak.py [--null 5000000] [--real 1000000] [--limit 10000]
                           [--backends null,kafka,jetstream,nats] [--json soak.json]

Each backend gets one ``Producer`` with ``max_in_flight_messages=--limit`` publishing keyed
100-byte values, nonblocking, as fast as it goes: ``--null`` messages through ``null://`` and
``--real`` through each real broker, started here: Tansu with memory storage (its ``null://``
storage serves no topic metadata) and nats-server with JetStream on file storage in a temp dir.
Only the producer's process is measured; the brokers run in their own.

A thread samples the process RSS (``/proc/self/statm``) and the memory tracemalloc traces every
second. The first 10% of the messages are the warm-up; tracemalloc snapshots are taken at its end
and at the end of the run, and the largest differences between them (by line) are reported.
Pass: RSS grows at most 50 MB after the warm-up, traced memory does not grow (at most 1 MB, noise
of the allocator and of the broker client's buffers), and every message is acked.
tracemalloc slows the run (every allocation is traced); throughput here is not a benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import _brokers

import producerkit as pk

RSS_LIMIT_MB = 50.0
TRACED_LIMIT_MB = 1.0
VALUE = b"x" * 100
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE / 1e6


class Sampler(threading.Thread):
    """Every ``interval`` seconds: (seconds since start, RSS MB, traced MB, messages produced)."""

    def __init__(self, progress: list[int], interval: float = 1.0) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.progress = progress
        self.interval = interval
        self.samples: list[tuple[float, float, float, int]] = []
        self._halt = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def sample(self) -> None:
        traced = tracemalloc.get_traced_memory()[0] / 1e6 if tracemalloc.is_tracing() else 0.0
        elapsed = time.monotonic() - self._t0
        self.samples.append(
            (round(elapsed, 2), round(rss_mb(), 2), round(traced, 3), self.progress[0])
        )

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.sample()


async def soak(
    name: str, url: str, count: int, limit: int, options: dict[str, Any]
) -> dict[str, Any]:
    topic = f"soak-{name}"
    progress = [0]
    warm_up = count // 10
    sampler = Sampler(progress)
    snapshots: list[tracemalloc.Snapshot] = []
    marks: dict[str, float] = {}
    async with pk.Producer(
        url, topic=topic, max_in_flight_messages=limit, timeout=60, **options
    ) as producer:
        await producer.produce(b"first")
        sampler.start()
        started = time.perf_counter()
        produce = producer.produce
        for i in range(count):
            await produce(VALUE, key=b"user-%d" % (i % 10_000), nonblocking=True)
            if i % 1000 == 0:
                progress[0] = i
            if i == warm_up:  # whatever the count (it was only seen at a multiple of 1000)
                await producer.flush()  # settled, so both snapshots see an empty window
                marks["rss_warm"] = rss_mb()
                marks["traced_warm"] = tracemalloc.get_traced_memory()[0] / 1e6
                snapshots.append(tracemalloc.take_snapshot())
                marks["warm_at"] = time.monotonic()
        await producer.flush()
        elapsed = time.perf_counter() - started
        progress[0] = count
        marks["rss_end"] = rss_mb()
        marks["traced_end"] = tracemalloc.get_traced_memory()[0] / 1e6
        snapshots.append(tracemalloc.take_snapshot())
        stats = producer.stats
    sampler.stop()
    after = [s for s in sampler.samples if s[3] >= warm_up]
    rss_after = max((s[1] for s in after), default=marks["rss_end"])
    filters = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)]
    top = (
        snapshots[1]
        .filter_traces(filters)
        .compare_to(snapshots[0].filter_traces(filters), "lineno")[:5]
    )
    result = {
        "backend": name,
        "messages": count,
        "limit": limit,
        "seconds": round(elapsed, 1),
        "msgs_per_s": round(count / elapsed),
        "acked": stats.acked,
        "failed": stats.failed,
        "peak_in_flight": stats.peak_in_flight,
        "rss_warm_mb": round(marks["rss_warm"], 1),
        "rss_max_after_warm_mb": round(rss_after, 1),
        "rss_growth_mb": round(rss_after - marks["rss_warm"], 1),
        "traced_warm_mb": round(marks["traced_warm"], 3),
        "traced_end_mb": round(marks["traced_end"], 3),
        "traced_growth_mb": round(marks["traced_end"] - marks["traced_warm"], 3),
        "top_traced_growth": [
            {
                "where": str(stat.traceback),
                "size_diff_bytes": stat.size_diff,
                "count_diff": stat.count_diff,
            }
            for stat in top
        ],
        "samples": sampler.samples,
    }
    result["pass"] = (
        stats.acked == count + 1
        and stats.failed == 0
        and result["rss_growth_mb"] <= RSS_LIMIT_MB
        and result["traced_growth_mb"] <= TRACED_LIMIT_MB
    )
    return result


def run_backend(
    name: str, count: int, limit: int, workdir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    options: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        if name == "null":
            url = "null://"
        elif name == "kafka":
            url = stack.enter_context(
                _brokers.kafka(args.kafka_url, workdir=workdir / "kafka")
            ).kafka_url
        else:
            broker = stack.enter_context(_brokers.nats(args.nats_url, workdir=workdir / name))
            url = f"{name}://{broker.host_port}"
            if name == "jetstream":
                options = {"create_stream": True, "stream_storage": "file"}
        tracemalloc.start()
        try:
            return asyncio.run(soak(name, url, count, limit, options))
        finally:
            tracemalloc.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--null", type=int, default=5_000_000, help="messages via null://")
    parser.add_argument("--real", type=int, default=1_000_000, help="messages per real broker")
    parser.add_argument("--limit", type=int, default=10_000, help="max_in_flight_messages")
    parser.add_argument("--backends", default="null,kafka,jetstream,nats")
    parser.add_argument("--json", default="soak.json", help="where to write the results")
    _brokers.add_broker_flags(parser)
    args = parser.parse_args(argv)

    import tempfile

    results = []
    with tempfile.TemporaryDirectory(prefix="producerkit-soak-") as tmp:
        for name in args.backends.split(","):
            count = args.null if name == "null" else args.real
            print(f"soaking {name}: {count:,} messages, limit {args.limit:,} ...", flush=True)
            results.append(run_backend(name, count, args.limit, Path(tmp), args))

    header = (
        f"{'backend':<10}{'messages':>11}{'s':>7}{'msg/s':>9}{'acked':>11}{'failed':>7}"
        f"{'RSS warm':>10}{'RSS max':>9}{'growth':>8}{'traced Δ MB':>13}  pass"
    )
    print()
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['backend']:<10}{r['messages']:>11,}{r['seconds']:>7}{r['msgs_per_s']:>9,}"
            f"{r['acked']:>11,}{r['failed']:>7}{r['rss_warm_mb']:>10}"
            f"{r['rss_max_after_warm_mb']:>9}{r['rss_growth_mb']:>8}{r['traced_growth_mb']:>13}"
            f"  {'yes' if r['pass'] else 'NO'}"
        )
    for r in results:
        if r["top_traced_growth"]:
            print(f"\n{r['backend']}: largest traced differences, warm-up -> end")
            for stat in r["top_traced_growth"][:3]:
                diff, blocks = stat["size_diff_bytes"], stat["count_diff"]
                print(f"  {diff:>+10,} B {blocks:>+7} blocks  {stat['where']}")
    document = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "producerkit": pk.__version__,
        "rss_limit_mb": RSS_LIMIT_MB,
        "traced_limit_mb": TRACED_LIMIT_MB,
        "results": results,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(document, indent=1))
    print(f"\nwrote {args.json}")
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
