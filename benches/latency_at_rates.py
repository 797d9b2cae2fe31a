"""Latency at 25 %, 50 % and 75 % of the maximum rate, open loop (the latency-benchmark method).

    python benches/latency_at_rates.py [--backend jetstream|kafka] [--seconds 10]
                                       [--rtt-ms 0] [--out-dir bench-out]

First a throughput run (``--rate 0``) finds the maximum rate; then an open-loop run at each
fraction of it records response time (CO-corrected), ack latency and send delay to p99.9999.
Writes one result JSON per run, ``latency_at_rates.png`` (the spectra overlaid) and prints a
markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import _brokers

from producerkit.bench.plot import plot_results
from producerkit.cli.bench import measure
from producerkit.testing.proxy import FaultProxy

FRACTIONS = (0.25, 0.50, 0.75)


async def run(url: str, args: argparse.Namespace, options: dict[str, Any]) -> list[tuple[str, Any]]:
    topic = f"rates-{args.backend}"
    peak = await measure(
        url,
        topic,
        rate=0,
        duration=min(args.seconds, 5),
        warmup=args.warmup,
        record_size=args.record_size,
        **options,
    )
    max_rate = peak["summary"]["throughput_msgs"]
    print(f"maximum rate: {max_rate:,.0f} msg/s", flush=True)
    results = [("max rate", peak)]
    for fraction in FRACTIONS:
        rate = round(max_rate * fraction)
        result = await measure(
            url,
            topic,
            rate=rate,
            duration=args.seconds,
            warmup=args.warmup,
            record_size=args.record_size,
            **options,
        )
        results.append((f"{fraction:.0%} of max ({rate:,} msg/s)", result))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("jetstream", "kafka"), default="jetstream")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    parser.add_argument("--out-dir", type=Path, default=Path("bench-out"))
    parser.add_argument(
        "--warmup", type=int, default=1000, help="untimed messages before each run (1000)"
    )
    _brokers.add_broker_flags(parser)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if args.backend == "kafka":
            url, options = stack.enter_context(_brokers.kafka(args.kafka_url)).kafka_url, {}
        else:
            url = stack.enter_context(_brokers.nats(args.nats_url)).jetstream_url
            options = {"create_stream": True}
        if args.rtt_ms:
            url = stack.enter_context(FaultProxy.for_url(url, args.rtt_ms)).url
        results = asyncio.run(run(url, args, options))
    print(
        "\n| run | msg/s | response p50 | p99 | p99.9 | p99.99 | max | ack p99 | "
        "send delay p99 |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for n, (label, result) in enumerate(results):
        (args.out_dir / f"latency_at_rates_{n}.json").write_text(json.dumps(result))
        response = result["percentiles"]["response_time"]
        print(
            f"| {label} | {result['summary']['throughput_msgs']:,.0f} "
            f"| {response['p50_ms']:.2f} | {response['p99_ms']:.2f} | {response['p99.9_ms']:.2f} "
            f"| {response['p99.99_ms']:.2f} | {response['max_ms']:.2f} "
            f"| {result['percentiles']['ack_latency']['p99_ms']:.2f} "
            f"| {result['percentiles']['send_delay']['p99_ms']:.2f} |"
        )
    png = args.out_dir / "latency_at_rates.png"
    plot_results(results[1:], png, title=f"{args.backend}: latency at 25/50/75 % of max rate")
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
