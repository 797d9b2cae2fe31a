"""What produce()'s fused C path (``_speedups.Admission``) is worth: the same messages through it
and through the Python path, rounds interleaved, on null:// and Kafka (Tansu null storage).

    python benches/fused_path.py [--messages 300000] [--rounds 5] [--json results/fused.json]

A message with ``headers=[]`` carries nothing more than a plain one (an empty header list
encodes as none), but the fused path declines it: so the same producer, broker and messages
measure the Python path (``MessageRules.message``, then ``Submitter.submit``) beside the fused
one. The table gives each path's best round and the median ratio fused/Python.
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
from producerkit.testing.brokers import create_kafka_topic

VALUE = b"x" * 512


async def run(url: str, keys: list[bytes], python_path: bool) -> float:
    topic = f"fused-{uuid.uuid4().hex[:8]}"
    if url.startswith("kafka://"):
        await create_kafka_topic(url, topic, 4)
    headers: Any = [] if python_path else None
    async with pk.Producer(url, topic=topic) as producer:
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
    results: dict[str, dict[str, list[float]]] = {}
    with _brokers.kafka(args.kafka_url, storage="null://sink") as kafka:
        for name, url in (("null", "null://"), ("kafka", kafka.kafka_url)):
            rates: dict[str, list[float]] = {"fused": [], "python": []}
            for number in range(args.rounds):
                order = ["fused", "python"] if number % 2 == 0 else ["python", "fused"]
                for path in order:
                    rate = asyncio.run(run(url, keys, path == "python"))
                    rates[path].append(rate)
                    print(f"{name:6} round {number + 1} {path:7} {rate:>12,.0f} msg/s", flush=True)
            results[name] = rates
    print(f"\n{'backend':8} {'fused':>12} {'python':>12} {'median fused/python':>20}")
    report: dict[str, Any] = {"messages": args.messages, "rounds": args.rounds}
    for name, rates in results.items():
        ratio = statistics.median(
            f / p for f, p in zip(rates["fused"], rates["python"], strict=True)
        )
        report[name] = {**rates, "median_ratio": ratio}
        print(
            f"{name:8} {max(rates['fused']):>12,.0f} {max(rates['python']):>12,.0f} {ratio:>20.3f}"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
