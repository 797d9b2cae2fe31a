"""From a run's timestamp arrays to the result: histograms, time series, text lines, JSON."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from producerkit.bench import histograms as hdr
from producerkit.bench.openloop import FAILED, OK, RunTimings

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

MEASURES = ("response_time", "ack_latency", "send_delay")
MEASURE_TITLES = {
    "response_time": "response time (ack - due; includes queueing: CO-corrected)",
    "ack_latency": "ack latency (ack - send; what a closed loop reports)",
    "send_delay": "send delay (send - due)",
    "errors": "response time of failed messages",
}


class Columns:
    """numpy views of the first ``sent`` messages of a run (copied: the arrays may grow)."""

    def __init__(self, timings: RunTimings) -> None:
        import numpy as np

        n = timings.sent
        self.n = n
        self.t0 = timings.t0
        self.end = timings.end
        self.due = np.array(timings.due[:n], dtype=np.int64)
        self.send = np.array(timings.send[:n], dtype=np.int64)
        self.ack = np.array(timings.ack[:n], dtype=np.int64)
        self.status = np.frombuffer(bytes(timings.status[:n]), dtype=np.uint8)
        self.ok = self.status == OK
        self.failed = self.status == FAILED

    def peak_in_flight(self) -> int:
        """Most messages sent and not yet settled at once (unsettled ones count to the end)."""
        import numpy as np

        if not self.n:
            return 0
        done = self.ok | self.failed
        times = np.concatenate((self.send, self.ack[done]))
        steps = np.concatenate((np.ones(self.n, np.int64), -np.ones(int(done.sum()), np.int64)))
        order = np.lexsort((steps, times))  # at equal times, settle before sending
        return int(np.cumsum(steps[order]).max())

    def measure(self, name: str) -> npt.NDArray[np.int64]:
        if name == "send_delay":
            return self.send - self.due
        done = self.ok if name != "errors" else self.failed
        start = self.send if name == "ack_latency" else self.due
        values: npt.NDArray[np.int64] = (self.ack - start)[done]
        return values


def analyze(
    timings: RunTimings, config: dict[str, Any], record_size: int, window: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The result dict (JSON-ready) and the histograms by measure."""
    columns = Columns(timings)
    histograms = {name: hdr.histogram_of(columns.measure(name)) for name in (*MEASURES, "errors")}
    acked = int(columns.ok.sum())
    failed = int(columns.failed.sum())
    last_ack = int(columns.ack[columns.ok | columns.failed].max()) if acked + failed else columns.t0
    first_send = int(columns.send.min()) if columns.n else columns.t0
    elapsed = max(last_ack - first_send, 1) / 1e9
    send_span = (int(columns.send.max()) - first_send) / 1e9 if columns.n else 0.0
    summary = {
        "sent": columns.n,
        "acked": acked,
        "failed": failed,
        "unacknowledged": columns.n - acked - failed,
        "elapsed_s": elapsed,
        "send_span_s": send_span,
        "throughput_msgs": acked / elapsed,
        "throughput_mb": acked * record_size / elapsed / 1e6,
        "target_rate": config.get("rate"),
    }
    # Little's law: the mean number in flight is the total time in flight over the run's length.
    in_flight_ns = float((columns.ack - columns.send)[columns.ok | columns.failed].sum())
    occupancy: dict[str, Any] = {
        "mean_in_flight": in_flight_ns / 1e9 / elapsed,
        "peak_in_flight": columns.peak_in_flight(),
    }
    if window is not None:
        occupancy.update(window)
    result = {
        "producerkit_bench": 1,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": config,
        "summary": summary,
        "window": occupancy,
        "percentiles": {name: hdr.summary(h) for name, h in histograms.items()},
        "spectrum": {name: hdr.spectrum(histograms[name]) for name in MEASURES},
        "timeseries": timeseries(columns, record_size),
        "histograms": {name: hdr.encode(h) for name, h in histograms.items()},
    }
    return result, histograms


def timeseries(columns: Columns, record_size: int) -> list[dict[str, Any]]:
    """One row per second of the run: sent, acked, failed (counts), response time p50/p99/max,
    and the rates over the row's own span (``seconds``): ``acked_per_s`` and ``mb_per_s``.

    Every row spans one second but the last, which ends at the run's last send or ack: its
    counts are a fraction of a second's, its rates are not (plot the rates, not the counts, or
    the line falls at the end as if the run had stalled).
    """
    import numpy as np

    if not columns.n:
        return []
    second = 1_000_000_000
    done = columns.ok | columns.failed
    last = int(max(columns.send.max(), columns.ack[done].max() if done.any() else 0))
    span = max(last + 1 - columns.t0, 1)
    seconds = math.ceil(span / second)
    bins = np.minimum(np.arange(seconds + 1, dtype=np.int64) * second, span) + columns.t0
    sent = np.histogram(columns.send, bins)[0]
    acked = np.histogram(columns.ack[columns.ok], bins)[0]
    failed = np.histogram(columns.ack[columns.failed], bins)[0]
    response = columns.ack - columns.due
    which = np.clip((columns.due - columns.t0) // second, 0, seconds - 1)
    rows = []
    for t in range(seconds):
        mask = (which == t) & done
        length = float(bins[t + 1] - bins[t]) / second
        row: dict[str, Any] = {
            "t": t + 1,
            "seconds": length,
            "sent": int(sent[t]),
            "acked": int(acked[t]),
            "failed": int(failed[t]),
            "acked_per_s": float(acked[t]) / length,
            "mb_per_s": float(acked[t]) / length * record_size / 1e6,
        }
        if mask.any():
            values = response[mask] / 1e6
            row["response_p50_ms"] = float(np.percentile(values, 50))
            row["response_p99_ms"] = float(np.percentile(values, 99))
            row["response_max_ms"] = float(values.max())
        rows.append(row)
    return rows


class Progress:
    """Every few seconds: kafka-producer-perf-test's line for the messages completed since.

    Called from :class:`~producerkit.bench.openloop.ProgressThread`, off the measured loop.
    """

    def __init__(self, record_size: int, print_line: Any = print) -> None:
        import numpy  # noqa: F401  here, before the clock starts: its first import takes ~70 ms

        self.record_size = record_size
        self.scanned = 0
        self.print_line = print_line

    def __call__(self, timings: RunTimings, interval: float) -> None:
        import numpy as np

        start = self.scanned
        status = np.frombuffer(bytes(timings.status[start : timings.sent]), dtype=np.uint8)
        pending = np.flatnonzero(status == 0)
        stop = start + (int(pending[0]) if len(pending) else len(status))
        self.scanned = stop
        ack = np.array(timings.ack[start:stop], dtype=np.int64)
        send = np.array(timings.send[start:stop], dtype=np.int64)
        due = np.array(timings.due[start:stop], dtype=np.int64)
        n = stop - start
        latency = (ack - send) / 1e6
        response = (ack - due) / 1e6
        rate = n / interval
        self.print_line(
            f"{n} records sent, {rate:.1f} records/sec "
            f"({rate * self.record_size / 1e6:.2f} MB/sec), "
            f"{latency.mean() if n else 0:.1f} ms avg latency, "
            f"{latency.max() if n else 0:.1f} ms max latency; response time "
            f"{response.mean() if n else 0:.1f} ms avg, {response.max() if n else 0:.1f} ms max."
        )


def final_lines(result: dict[str, Any], name: str = "producerkit") -> list[str]:
    summary = result["summary"]
    lines = [
        f"[{name}] {summary['sent']} records sent, {summary['acked']} acked, "
        f"{summary['failed']} failed, {summary['unacknowledged']} unacknowledged; "
        f"{summary['throughput_msgs']:.1f} records/sec "
        f"({summary['throughput_mb']:.2f} MB/sec) over {summary['elapsed_s']:.2f} s."
    ]
    for measure in (*MEASURES, "errors"):
        p = result["percentiles"][measure]
        if not p.get("count"):
            continue
        cells = ", ".join(
            f"{hdr.fmt_ms(p[hdr.percentile_label(q) + '_ms'])} ms {hdr.percentile_label(q)}"
            for q in hdr.PERCENTILES
        )
        lines.append(
            f"  {measure:<13} {hdr.fmt_ms(p['mean_ms'])} ms avg, {cells}, "
            f"{hdr.fmt_ms(p['max_ms'])} ms max."
        )
    window = result.get("window") or {}
    if window:
        parts = [
            f"mean in flight {window['mean_in_flight']:.1f}",
            f"peak in flight {window['peak_in_flight']}",
        ]
        if "window_waits" in window:
            parts.append(f"window waits {window['window_waits']}")
            parts.append(f"blocked {window['window_wait_seconds']:.3f} s")
        lines.append("  window        " + ", ".join(parts) + ".")
    for topic, mode in (result.get("topic_modes") or {}).items():
        lines.append(f"  topic         {topic!r} written with {mode}.")
    return lines
