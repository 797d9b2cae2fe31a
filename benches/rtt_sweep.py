"""RTT sweep: seed 000's lessons 1 and 2 on this machine, Kafka (Tansu) and JetStream.

    python benches/rtt_sweep.py [--rtts 0,1,10,50] [--limits 100,1000] [--resume-ats 0.5,0.9]
                                [--kafka-settings "none;preset=throughput"] [--seconds 1]
                                [--json rtt_sweep.json] [--markdown rtt_sweep.md]

For each added round trip (a :class:`~producerkit.testing.proxy.FaultProxy` in front of each local
broker, its delay changed with ``set_rtt`` between runs) it runs producerkit as fast as it goes:

- sync (``await produce()`` per message): lesson 1 says about 1/RTT messages/s;
- nonblocking with window limit L, for each ``resume_at`` (the fraction of L to which a full
  window drains before produces go on) and, on Kafka, each set of backend options in
  ``--kafka-settings`` (``;`` between sets, ``,`` between ``name=value`` pairs, ``none`` for
  none): lesson 2 says about L/RTT messages/s, up to what the broker and client can do.

The model column is that, capped by the same case's rate with no added RTT. RTT 0 is always
measured first, as that cap, also when ``--rtts`` leaves it out; measured/model near 1 means
the lesson holds. Each run is sized to last about ``--seconds`` at the model's rate (at least 50,
at most 200,000 messages).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _brokers

from producerkit.cli.bench import measure
from producerkit.testing.proxy import FaultProxy

#: The size of the RTT-0 runs, which have no model yet to be sized by.
BASELINE_MESSAGES = {"sync": 2_000, "nonblocking": 40_000}


@dataclass(frozen=True)
class Case:
    """One producer configuration of the sweep; its RTT-0 rate caps its model."""

    mode: str
    limit: int = 1
    resume_at: float = 0.5
    settings: tuple[tuple[str, str], ...] = ()

    def options(self) -> dict[str, Any]:
        return {"resume_at": self.resume_at, **dict(self.settings)}


def expected_rate(case: Case, rtt_ms: float, ceiling: float) -> float:
    """The model: 1/RTT (sync) or L/RTT (nonblocking), capped by the rate with no added RTT."""
    if rtt_ms <= 0:
        return ceiling
    per_rtt = 1 if case.mode == "sync" else case.limit
    return min(per_rtt * 1000.0 / rtt_ms, ceiling)


def cases_for(backend: str, args: argparse.Namespace) -> list[Case]:
    kafka_settings = args.kafka_settings if backend == "kafka" else [()]
    return [Case("sync")] + [
        Case("nonblocking", limit, resume_at, settings)
        for limit in args.limits
        for settings in kafka_settings
        for resume_at in args.resume_ats
    ]


async def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    rtts = [0.0] + [rtt for rtt in args.rtts if rtt > 0]  # RTT 0 first: the models' cap
    with _brokers.kafka(args.kafka_url) as kafka, _brokers.nats(args.nats_url) as nats:
        brokers = [
            ("kafka", kafka.kafka_url, {}),
            ("jetstream", nats.jetstream_url, {"create_stream": True}),
        ]
        for backend, url, options in brokers:
            ceilings: dict[Case, float] = {}
            with FaultProxy.for_url(url, 0) as proxy:
                for rtt in rtts:
                    proxy.set_rtt(rtt)
                    for case in cases_for(backend, args):
                        row = await _run_case(
                            args, backend, proxy.url, options, case, rtt, ceilings
                        )
                        row["requested"] = rtt in args.rtts
                        rows.append(row)
                        print(format_row(row), flush=True)
    return rows


async def _run_case(
    args: argparse.Namespace,
    backend: str,
    url: str,
    options: dict[str, Any],
    case: Case,
    rtt: float,
    ceilings: dict[Case, float],
) -> dict[str, Any]:
    if rtt <= 0:
        count = args.baseline_messages or BASELINE_MESSAGES[case.mode]
    else:
        count = int(min(max(expected_rate(case, rtt, ceilings[case]) * args.seconds, 50), 200_000))
    result = await measure(
        url,
        f"sweep-{backend}",
        rate=0,
        count=count,
        mode=case.mode,
        max_in_flight_messages=case.limit,
        warmup=min(case.limit, 200),
        **options,
        **case.options(),
    )
    rate = result["summary"]["throughput_msgs"]
    if rtt <= 0:
        ceilings[case] = rate
    latency = result["percentiles"]["ack_latency"]
    return {
        "backend": backend,
        "rtt_ms": rtt,
        "mode": case.mode,
        "limit": case.limit if case.mode == "nonblocking" else None,
        "resume_at": case.resume_at if case.mode == "nonblocking" else None,
        "settings": ", ".join(f"{name}={value}" for name, value in case.settings),
        "messages": count,
        "msgs_per_s": rate,
        "expected_msgs_per_s": expected_rate(case, rtt, ceilings[case]) if rtt else None,
        "ack_p50_ms": latency.get("p50_ms"),
        "ack_p99_ms": latency.get("p99_ms"),
        "peak_in_flight": result["window"]["peak_in_flight"],
        "window_waits": result["window"].get("window_waits"),
    }


HEADER = (
    "| backend | RTT ms | mode | limit | resume_at | settings | msg/s | model msg/s "
    "| measured/model | ack p50 ms | ack p99 ms | max in flight | window waits |\n"
    "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"
)


def format_row(row: dict[str, Any]) -> str:
    expected = row["expected_msgs_per_s"]
    ratio = f"{row['msgs_per_s'] / expected:.2f}" if expected else "-"
    resume_at = "-" if row["resume_at"] is None else f"{row['resume_at']:g}"
    return (
        f"| {row['backend']} | {row['rtt_ms']:g} | {row['mode']} | {row['limit'] or '-'} "
        f"| {resume_at} | {row['settings'] or '-'} "
        f"| {row['msgs_per_s']:,.0f} | {f'{expected:,.0f}' if expected else '-'} | {ratio} "
        f"| {row['ack_p50_ms']:.2f} | {row['ack_p99_ms']:.2f} | {row['peak_in_flight']} "
        f"| {row['window_waits']} |"
    )


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _settings(text: str) -> list[tuple[tuple[str, str], ...]]:
    """``none;preset=throughput;max_batches_in_flight=5,linger_ms=0`` -> three sets of options."""
    return [
        ()
        if one == "none"
        else tuple(
            (name, value) for name, _, value in (pair.partition("=") for pair in one.split(","))
        )
        for one in text.split(";")
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtts", default="0,1,10,50", type=_floats)
    parser.add_argument(
        "--limits", default="100,1000", type=lambda text: [int(x) for x in text.split(",")]
    )
    parser.add_argument("--resume-ats", default="0.5,0.9", type=_floats)
    parser.add_argument(
        "--kafka-settings",
        default="none;preset=throughput",
        type=_settings,
        help="sets of Kafka backend options, ';' between sets, ',' between name=value pairs",
    )
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument(
        "--baseline-messages",
        type=int,
        help="messages of each RTT-0 run (default: 2000 sync, 40000 nonblocking)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    _brokers.add_broker_flags(parser)
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
