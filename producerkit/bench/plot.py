"""One PNG per comparison: the percentile spectrum and throughput over time.

Top panel: latency (log ms) against percentile on HdrHistogram's usual axis, x = 1 / (1 - p)
(log), from 0 % to 99.9999 %. Each run draws its response time (ack - due: CO-corrected) as a
solid line and its ack latency (ack - send: uncorrected) dashed in the same colour, so the gap
between them is the queueing a closed-loop benchmark would have hidden. Bottom panel: acked
messages per second, every second, as steps over each second's real span; the last, partial
second is as wide as it lasted, its rate over that span, and marked partial (a last few
milliseconds, too short for a rate, are written, not drawn). Peers in a result are drawn as
runs of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

_TICKS = [
    (0, "0%"),
    (1, "90%"),
    (2, "99%"),
    (3, "99.9%"),
    (4, "99.99%"),
    (5, "99.999%"),
    (6, "99.9999%"),
]


def _series(results: Sequence[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    series = []
    for label, result in results:
        series.append((label, result))
        for name, peer in result.get("peers", {}).items():
            series.append((f"{label} [{name}]", peer))
    return series


def plot_results(
    results: Sequence[tuple[str, dict[str, Any]]], output: Path | str, title: str | None = None
) -> None:
    """Draw ``(label, result)`` runs (from ``--json``) into one PNG at ``output``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _series(results)
    fig, (spectrum_ax, rate_ax) = plt.subplots(
        2, 1, figsize=(10, 8.5), gridspec_kw={"height_ratios": [3, 1.4]}
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, (label, result) in enumerate(series):
        color = colors[n % len(colors)]
        for measure, style, suffix in (
            ("response_time", "-", "response time (CO-corrected)"),
            ("ack_latency", "--", "ack latency (uncorrected)"),
        ):
            points = result.get("spectrum", {}).get(measure) or []
            if not points:
                continue
            xs = [10.0**nines for nines, _ in points]
            ys = [max(value, 0.001) for _, value in points]
            spectrum_ax.plot(xs, ys, style, color=color, linewidth=1.6, label=f"{label}: {suffix}")
        rows = result.get("timeseries") or []
        if rows:
            edges, rates, partial, tail = rate_steps(rows)
            rate_ax.stairs(rates, edges, baseline=None, color=color, linewidth=1.4, label=label)
            notes = [
                (edges[i + 1], rates[i], f"partial: {edges[i + 1] - edges[i]:.2f} s")
                for i in partial
            ]
            if tail is not None:
                notes.append(
                    (
                        edges[-1],
                        rates[-1],
                        f"+{tail['acked']} acked in {tail['seconds'] * 1e3:.1f} ms",
                    )
                )
            for x, y, note in notes:
                rate_ax.annotate(
                    note,
                    (x, y),
                    textcoords="offset points",
                    xytext=(-4, -12),
                    horizontalalignment="right",
                    fontsize=7,
                    color=color,
                )
    spectrum_ax.set_xscale("log")
    spectrum_ax.set_yscale("log")
    spectrum_ax.set_xticks([10.0**k for k, _ in _TICKS], [text for _, text in _TICKS])
    spectrum_ax.set_xlim(1, 10.0**6)
    spectrum_ax.set_xlabel("percentile")
    spectrum_ax.set_ylabel("latency (ms, log)")
    spectrum_ax.grid(True, which="major", alpha=0.4)
    spectrum_ax.grid(True, which="minor", axis="y", alpha=0.15)
    spectrum_ax.legend(fontsize=7.5, loc="upper left")
    spectrum_ax.set_title(title or _default_title(results), fontsize=11)
    rate_ax.set_xlabel("time (s)")
    rate_ax.set_ylabel("acked msg/s")
    peak = max((_rate(row) for _, r in series for row in r.get("timeseries") or []), default=1)
    rate_ax.set_ylim(0, peak * 1.15 + 1)
    rate_ax.grid(True, alpha=0.4)
    if len(series) > 1:
        rate_ax.legend(fontsize=7.5, loc="lower right")
    fig.tight_layout()
    fig.savefig(output, dpi=90)
    plt.close(fig)


def _default_title(results: Sequence[tuple[str, dict[str, Any]]]) -> str:
    if len(results) == 1:
        config = results[0][1].get("config", {})
        rate = f"{config.get('rate', 0):g} msg/s" if config.get("rate") else "max rate"
        rtt = f", RTT +{config['rtt_ms']:g} ms" if config.get("rtt_ms") else ""
        return (
            f"producerkit bench: {config.get('backend')} {config.get('mode')}, {rate}, "
            f"{config.get('record_size')} B{rtt}"
        )
    return "producerkit bench: " + " vs ".join(label for label, _ in results)


#: A last row shorter than this has too few acks for a rate: it is written, not drawn.
_SHORTEST_STEP = 0.1


def rate_steps(
    rows: Sequence[dict[str, Any]],
) -> tuple[list[float], list[float], list[int], dict[str, Any] | None]:
    """The throughput panel's steps from a result's ``timeseries``: the edges (s from the
    start; each row spans its own ``seconds``), each row's acks per second over its own span,
    the indexes of the rows shorter than a second (the last one: drawn as wide as it lasted and
    marked partial), and the last row if it is too short for a rate (a few ms past the last
    second: written beside the line, not drawn as a drop)."""
    rows = list(rows)
    tail = None
    if len(rows) > 1 and float(rows[-1].get("seconds", 1.0)) < _SHORTEST_STEP:
        tail = rows.pop()
    edges = [0.0]
    rates = []
    partial = []
    for index, row in enumerate(rows):
        seconds = float(row.get("seconds", 1.0))
        edges.append(edges[-1] + seconds)
        rates.append(_rate(row))
        if seconds < 0.999:
            partial.append(index)
    return edges, rates, partial, tail


def _rate(row: dict[str, Any]) -> float:
    """A timeseries row's acks per second over its own span (a last, partial second is not a
    drop); results written before rows had a span give their count."""
    return float(row.get("acked_per_s", row["acked"]))
