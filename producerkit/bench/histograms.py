"""HDR histograms from the bench's timestamp arrays, and what is reported from them.

Values are recorded in microseconds, 1 µs to 60 s, 3 significant figures (HdrHistogram's usual
setting: every value within 0.1 %). Histograms are filled after the run from the preallocated
arrays, grouped by distinct value (numpy), so recording costs nothing while messages are timed.
"""

from __future__ import annotations

import math
from typing import IO, TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from hdrh.histogram import HdrHistogram

LOWEST_US: Final = 1
HIGHEST_US: Final = 60_000_000
SIGNIFICANT_FIGURES: Final = 3

#: The percentiles every report names.
PERCENTILES: Final = (50.0, 90.0, 99.0, 99.9, 99.99, 99.9999)

#: Spectrum points for plots: "nines" from 0 (p0) to 6 (p99.9999), x = 1 / (1 - p).
SPECTRUM_NINES: Final = tuple(round(k * 0.05, 2) for k in range(121))


def new_histogram() -> HdrHistogram:
    from hdrh.histogram import HdrHistogram

    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_FIGURES)


def histogram_of(values_ns: npt.NDArray[np.int64]) -> HdrHistogram:
    """A histogram of nanosecond durations, recorded in microseconds (clamped to the range)."""
    import numpy as np

    histogram = new_histogram()
    if len(values_ns):
        micros = np.clip((values_ns + 500) // 1000, LOWEST_US, HIGHEST_US)
        distinct, counts = np.unique(micros, return_counts=True)
        for value, count in zip(distinct.tolist(), counts.tolist(), strict=True):
            histogram.record_value(value, count)
    return histogram


def percentile_label(percentile: float) -> str:
    return f"p{percentile:g}"


def summary(histogram: HdrHistogram) -> dict[str, Any]:
    """Count, mean, min, the standard percentiles and max, in milliseconds."""
    count = histogram.get_total_count()
    result: dict[str, Any] = {"count": count}
    if not count:
        return result
    result["min_ms"] = histogram.get_min_value() / 1000
    result["mean_ms"] = histogram.get_mean_value() / 1000
    for percentile in PERCENTILES:
        result[percentile_label(percentile) + "_ms"] = (
            histogram.get_value_at_percentile(percentile) / 1000
        )
    result["max_ms"] = histogram.get_max_value() / 1000
    return result


def spectrum(histogram: HdrHistogram) -> list[list[float]]:
    """``[nines, value_ms]`` pairs for a percentile-spectrum plot (nines = -log10(1 - p))."""
    if not histogram.get_total_count():
        return []
    points = []
    for nines in SPECTRUM_NINES:
        percentile = 100.0 * (1.0 - 10.0 ** (-nines))
        points.append([nines, histogram.get_value_at_percentile(percentile) / 1000])
    return points


def encode(histogram: HdrHistogram) -> str:
    """The standard compressed base64 encoding (decodes with ``HdrHistogram.decode``)."""
    encoded: bytes = histogram.encode()
    return encoded.decode("ascii")


def write_hgrm(histogram: HdrHistogram, out: IO[bytes], title: str) -> None:
    """A percentile distribution file in milliseconds, as HdrHistogram's own tools write it."""
    out.write(f"# {title} (milliseconds)\n".encode())
    if histogram.get_total_count():
        # hdrh writes the table and the Max / Buckets footer; the Mean line is ours.
        histogram.output_percentile_distribution(out, 1000.0)
        mean, stddev = histogram.get_mean_value() / 1000, histogram.get_stddev() / 1000
        out.write(f"#[Mean    = {mean:12.3f}, StdDeviation   = {stddev:12.3f}]\n".encode())


def fmt_ms(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"
