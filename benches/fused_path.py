"""What each way into flight costs: the same plain messages through the C core's Admission, the
Python core's, and the checked path, rounds interleaved, on null:// and Kafka (Tansu null
storage).

    python benches/fused_path.py [--messages 300000] [--rounds 5] [--json results/fused.json]

``c``: a plain nonblocking message through the C core (``_speedups.ProduceDoor``, then
``Admission.admit``); ``python``: the same through the Python core (``_core_py.Admission``,
``producerkit._core.using(PYTHON)``); ``checked``: on the C core, with ``headers=[]``, which
carries nothing more than a plain message (an empty header list encodes as none) but which the
Admission declines, so it takes the checked path (``MessageRules.message``, then
``Submitter.submit``). The table gives each path's best round and its median ratio to ``c``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import _brokers

import producerkit as pk
from producerkit import _core
from producerkit.testing.brokers import create_kafka_topic

VALUE = b"x" * 512
PATHS = ("c", "python", "checked")


async def run(url: str, keys: list[bytes], path: str) -> float:
    topic = f"fused-{uuid.uuid4().hex[:8]}"
    if url.startswith("kafka://"):
        await create_kafka_topic(url, topic, 4)
    headers: Any = [] if path == "checked" else None
    core = _core.PYTHON if path == "python" else _core.active()
    with _core.using(core):
        producer = pk.Producer(url, topic=topic)
    async with producer:
        await producer.produce(b"warm-up", key=b"warm-up")
        produce = producer.produce
        started = time.perf_counter()
        for key in keys:
            await produce(VALUE, key=key, headers=headers, nonblocking=True)
        await producer.flush()
        elapsed = time.perf_counter() - started
        assert producer.stats.acked == len(keys) + 1
    return len(keys) / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    _brokers.add_broker_flags(parser, nats=False)
    args = parser.parse_args(argv)
    keys = [b"user-%d" % (i % 10_000) for i in range(args.messages)]
    # Without the C extension there is no C core: the Python one is measured against checked.
    paths = PATHS if _core.C is not None else PATHS[1:]
    results: dict[str, dict[str, list[float]]] = {}
    with _brokers.kafka(args.kafka_url, storage="null://sink") as kafka:
        for name, url in (("null", "null://"), ("kafka", kafka.kafka_url)):
            rates: dict[str, list[float]] = {path: [] for path in paths}
            for number in range(args.rounds):
                order = paths if number % 2 == 0 else paths[::-1]
                for path in order:
                    rate = asyncio.run(run(url, keys, path))
                    rates[path].append(rate)
                    print(f"{name:6} round {number + 1} {path:7} {rate:>12,.0f} msg/s", flush=True)
            results[name] = rates
    print(f"\n{'backend':8} {'path':8} {'best msg/s':>12} {'median ratio to c':>18}")
    report: dict[str, Any] = {"messages": args.messages, "rounds": args.rounds}
    for name, rates in results.items():
        report[name] = {}
        for path in paths:
            ratio = statistics.median(
                mine / c for mine, c in zip(rates[path], rates[paths[0]], strict=True)
            )
            report[name][path] = {"rates": rates[path], "median_ratio_to_first": ratio}
            print(f"{name:8} {path:8} {max(rates[path]):>12,.0f} {ratio:>18.3f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
