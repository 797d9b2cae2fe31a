"""pytest-benchmark cases for producerkit's hot paths (not collected by a plain ``pytest``: the
test paths are ``tests/``; name this file to run it).

Each async case is timed by producerkit's ``produce_benchmark`` fixture: a batch of produces per
round, every round on ONE event loop, so a round times producerkit, not starting a loop::

    pytest benches/test_bench_hotpaths.py --benchmark-storage=benches/.benchmarks \\
        --benchmark-save=baseline                  # record a baseline (JSON under that folder)
    pytest benches/test_bench_hotpaths.py --benchmark-storage=benches/.benchmarks \\
        --benchmark-compare --benchmark-compare-fail=median:15%   # the gate: fail on regressions

``--benchmark-compare`` without a value compares with the newest saved run;
``--benchmark-compare-fail=median:15%`` fails the session if any case's median got more than 15 %
slower. Baselines are machine-specific: record one on the machine that runs the gate (a CI
runner), not on a laptop. The producers here have no ``on_outcome`` hook (the hot path as
shipped), so ``extra_info`` has msgs/s and no ack latencies.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import producerkit as pk
from producerkit.testing import proxy
from producerkit.testing.pytest_plugin import ProduceBenchmark

BATCH = 1000
VALUE = b"x" * 100
KEYS = [b"user-%d" % i for i in range(BATCH)]
ROUNDS, WARMUP_ROUNDS = 200, 20


def time_batches(
    produce_benchmark: ProduceBenchmark,
    url: str,
    batch: Callable[[pk.Producer], Awaitable[None]],
    **options: Any,
) -> None:
    """Time ``batch(producer)`` (BATCH messages) on one started producer."""
    producer = pk.Producer(url, topic="bench", **options)
    produce_benchmark.run(producer.start())
    try:
        produce_benchmark.async_(
            lambda: batch(producer), messages=BATCH, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS
        )
    finally:
        produce_benchmark.run(producer.close())


async def keyed_nonblocking(producer: pk.Producer) -> None:
    produce = producer.produce
    for key in KEYS:
        await produce(VALUE, key=key, nonblocking=True)
    await producer.flush()


async def keyless_nonblocking(producer: pk.Producer) -> None:
    produce = producer.produce
    for _ in range(BATCH):
        await produce(VALUE, nonblocking=True)
    await producer.flush()


async def blocking(producer: pk.Producer) -> None:
    produce = producer.produce
    for _ in range(BATCH):
        await produce(VALUE)


@pytest.mark.parametrize("url", ["null://", "memory://"])
def test_produce_nonblocking_keyed(produce_benchmark: ProduceBenchmark, url: str) -> None:
    time_batches(produce_benchmark, url, keyed_nonblocking, partitions=12)


def test_produce_nonblocking_keyless_null(produce_benchmark: ProduceBenchmark) -> None:
    time_batches(produce_benchmark, "null://", keyless_nonblocking)


def test_produce_blocking_null(produce_benchmark: ProduceBenchmark) -> None:
    time_batches(produce_benchmark, "null://", blocking)


def test_histogram_fill_100k(benchmark: Any) -> None:
    """Filling HDR histograms after a run: must stay far below the run it summarizes."""
    np = pytest.importorskip("numpy")
    from producerkit.bench.histograms import histogram_of

    values = np.random.default_rng(1).lognormal(13, 1, 100_000).astype(np.int64)
    benchmark(histogram_of, values)


def test_proxy_metadata_rewrite(benchmark: Any) -> None:
    """The delay proxy rewriting one flexible Metadata response (3 brokers)."""
    body = b"\x00" + struct.pack(">i", 0) + bytes([4])
    for node in range(3):
        host = b"10.0.0.%d" % node
        body += struct.pack(">i", node) + bytes([len(host) + 1]) + host + struct.pack(">i", 9092)
        body += b"\x00\x00"
    payload = struct.pack(">i", 1) + body + b"\x00" * 40
    frame = struct.pack(">i", len(payload)) + payload

    def advertised(host: str, port: int) -> tuple[str, int]:
        return "127.0.0.1", 40000

    def rewrite() -> bytes:
        return proxy._rewrite_response(frame, {1: (3, 12)}, advertised)

    benchmark(rewrite)
