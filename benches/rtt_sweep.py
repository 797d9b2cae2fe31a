"""RTT sweep: seed 000's lessons 1 and 2 on this machine, Kafka (Tansu) and JetStream.

    python benches/rtt_sweep.py [--rtts 0,1,5,10,50] [--limits 100,1000] [--seconds 2]
                                [--json rtt_sweep.json] [--markdown rtt_sweep.md]

For each added round trip (a :class:`~producerkit.testing.proxy.DelayProxy` in front of each local
broker, its delay changed with ``set_rtt`` between runs) it runs producerkit as fast as it goes:

- sync (``await produce()`` per message): lesson 1 says about 1/RTT messages/s;
- nonblocking with window limit L: lesson 2 says about L/RTT messages/s (the window drains to
  half before refilling, so a little less), up to what the broker and client can do.

The model column is that, capped by the same case's rate with no added RTT (run first);
measured/model near 1 means the lesson holds. Each run is
sized to last about ``--seconds`` at the expected rate (at least 50, at most 200,000 messages).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from producerkit.cli.bench import measure
from producerkit.testing.brokers import start_kafka, start_nats
from producerkit.testing.proxy import DelayProxy

#: Before the RTT-0 run has measured the ceiling: only sizes that run.
FIRST_GUESS = {"sync": 2_000.0, "nonblocking": 40_000.0}


def expected_rate(mode: str, limit: int, rtt_ms: float, ceiling: float | None) -> float:
    """The model: 1/RTT (sync) or L/RTT (nonblocking), capped by the rate with no added RTT."""
    if rtt_ms <= 0 or ceiling is None:
        return ceiling or FIRST_GUESS[mode]
    per_rtt = 1 if mode == "sync" else limit
    return min(per_rtt * 1000.0 / rtt_ms, ceiling)


async def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with start_kafka() as kafka, start_nats(jetstream=True) as nats:
        brokers = [("kafka", kafka.url, {}), ("jetstream", nats.url, {"create_stream": True})]
        for backend, url, options in brokers:
            ceilings: dict[tuple[str, int], float] = {}
            with DelayProxy.for_url(url, 0) as proxy:
                for rtt in args.rtts:
                    proxy.set_rtt(rtt)
                    cases = [("sync", 1)] + [("nonblocking", limit) for limit in args.limits]
                    for mode, limit in cases:
                        expected = expected_rate(mode, limit, rtt, ceilings.get((mode, limit)))
                        count = int(min(max(expected * args.seconds, 50), 200_000))
                        result = await measure(
                            proxy.url,
                            f"sweep-{backend}",
                            rate=0,
                            count=count,
                            mode=mode,
                            max_in_flight_messages=max(limit, 1),
                            warmup=min(limit, 200),
                            **options,
                        )
                        rate = result["summary"]["throughput_msgs"]
                        if rtt <= 0:
                            ceilings[(mode, limit)] = rate
                        latency = result["percentiles"]["ack_latency"]
                        row = {
                            "backend": backend,
                            "rtt_ms": rtt,
                            "mode": mode,
                            "limit": limit if mode == "nonblocking" else None,
                            "messages": count,
                            "msgs_per_s": rate,
                            "expected_msgs_per_s": expected if rtt else None,
                            "ack_p50_ms": latency.get("p50_ms"),
                            "ack_p99_ms": latency.get("p99_ms"),
                            "peak_in_flight": result["window"]["peak_in_flight"],
                            "window_waits": result["window"].get("window_waits"),
                        }
                        rows.append(row)
                        print(format_row(row), flush=True)
    return rows


HEADER = (
    "| backend | RTT ms | mode | limit | msg/s | model msg/s | measured/model "
    "| ack p50 ms | ack p99 ms | max in flight | window waits |\n"
    "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def format_row(row: dict[str, Any]) -> str:
    expected = row["expected_msgs_per_s"]
    ratio = f"{row['msgs_per_s'] / expected:.2f}" if expected else "-"
    return (
        f"| {row['backend']} | {row['rtt_ms']:g} | {row['mode']} | {row['limit'] or '-'} "
        f"| {row['msgs_per_s']:,.0f} | {f'{expected:,.0f}' if expected else '-'} | {ratio} "
        f"| {row['ack_p50_ms']:.2f} | {row['ack_p99_ms']:.2f} | {row['peak_in_flight']} "
        f"| {row['window_waits']} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rtts", default="0,1,5,10,50", type=lambda text: [float(x) for x in text.split(",")]
    )
    parser.add_argument(
        "--limits", default="100,1000", type=lambda text: [int(x) for x in text.split(",")]
    )
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    print(HEADER, flush=True)
    rows = asyncio.run(sweep(args))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.markdown:
        args.markdown.write_text(HEADER + "\n" + "\n".join(format_row(r) for r in rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
