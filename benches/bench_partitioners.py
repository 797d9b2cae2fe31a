"""Speed and uniformity of producerkit's partitioners.

As a script::

    python benches/bench_partitioners.py [--keys 1000000] [--repeats 3] [--json out.json]

For every key partitioner it reports the cost per key (``time.perf_counter_ns`` around one
pass over the distinct keys ``b"user-0"``, ``b"user-1"``, ..., best of ``--repeats``) and a
chi-square test of uniformity over the same keys for 4, 12 and 64 partitions. The keyless
partitioners get the cost per call. A ``noop`` row is the cost of calling an empty Python
function the same way: the floor under every other row.

Reading the chi-square columns: for a uniform partitioner the statistic hovers around its
degrees of freedom (partitions - 1) and the p-value is anywhere in [0, 1]; a p-value below
about 0.001 means the counts are too uneven to be chance. The p-value comes from scipy when it
is installed, else from the Wilson-Hilferty normal approximation: within 0.006 of the exact
value at 3 degrees of freedom and 0.001 at 11 or more, but below p = 0.001 only within a factor
of about two, which still tells "uneven" from "chance".

With pytest-benchmark, the ``test_bench_*`` functions below time one call per 1000 keys::

    pytest benches/bench_partitioners.py

The file name does not match pytest's ``test_*.py``, so a plain ``pytest`` run never collects
them; they run only when this file is named on the command line.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from pathlib import Path
from typing import Any

try:
    from producerkit import partitioners as pk
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from producerkit import partitioners as pk

PARTITION_COUNTS = (4, 12, 64)
TIMING_PARTITIONS = 12


def _noop(key: bytes, num_partitions: int) -> int:
    return 0


def make_keys(count: int) -> list[bytes]:
    """Return ``count`` distinct keys shaped like real ones: ``b"user-0"``, ``b"user-1"``, ..."""
    return [b"user-%d" % i for i in range(count)]


def _best_ns(run: Callable[[], object], repeats: int) -> int:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter_ns()
        run()
        best = min(best, time.perf_counter_ns() - start)
    return int(best)


def time_key_partitioner(
    partitioner: Callable[[bytes, int], int], keys: Sequence[bytes], repeats: int
) -> float:
    """Return the best-of-``repeats`` nanoseconds per key of one pass over ``keys``."""

    # map() drives the calls from C, so the loop adds as little as possible to each call.
    def run() -> None:
        deque(map(partitioner, keys, repeat(TIMING_PARTITIONS)), maxlen=0)

    return _best_ns(run, repeats) / len(keys)


def time_keyless_partitioner(partitioner: pk.KeylessPartitioner, calls: int, repeats: int) -> float:
    """Return the best-of-``repeats`` nanoseconds per ``partition()`` call on one topic."""

    def run() -> None:
        deque(
            map(partitioner.partition, repeat("topic", calls), repeat(TIMING_PARTITIONS)),
            maxlen=0,
        )

    return _best_ns(run, repeats) / calls


def chi_square(counts: Iterable[int], bins: int) -> tuple[float, int]:
    """Return Pearson's chi-square statistic against the uniform distribution, and its dof."""
    observed = list(counts)
    observed += [0] * (bins - len(observed))
    expected = sum(observed) / bins
    statistic = sum((count - expected) ** 2 for count in observed) / expected
    return statistic, bins - 1


def _wilson_hilferty_sf(statistic: float, dof: int) -> float:
    # (X/k)^(1/3) is close to normal with mean 1 - 2/(9k) and variance 2/(9k).
    variance = 2.0 / (9.0 * dof)
    z = ((statistic / dof) ** (1.0 / 3.0) - (1.0 - variance)) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def p_value_function() -> tuple[Callable[[float, int], float], str]:
    """Return the chi-square survival function to use, and the name of the method."""
    try:
        from scipy.stats import chi2  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        return _wilson_hilferty_sf, "Wilson-Hilferty approximation"

    def scipy_sf(statistic: float, dof: int) -> float:
        return float(chi2.sf(statistic, dof))

    return scipy_sf, "scipy.stats.chi2.sf"


def uniformity(
    partitioner: Callable[[bytes, int], int],
    keys: Sequence[bytes],
    p_value: Callable[[float, int], float],
) -> dict[int, dict[str, float]]:
    """Return, per partition count, the chi-square statistic, dof and p-value over ``keys``."""
    result: dict[int, dict[str, float]] = {}
    for bins in PARTITION_COUNTS:
        counts = Counter(map(partitioner, keys, repeat(bins)))
        statistic, dof = chi_square((counts[p] for p in range(bins)), bins)
        result[bins] = {"chi2": statistic, "dof": dof, "p_value": p_value(statistic, dof)}
    return result


def run(key_count: int, repeats: int) -> dict[str, Any]:
    """Measure every partitioner over ``key_count`` keys; return the results as plain data."""
    keys = make_keys(key_count)
    p_value, method = p_value_function()
    rows: list[dict[str, Any]] = []
    keyed: dict[str, Callable[[bytes, int], int]] = {"noop": _noop, **pk.PARTITIONERS}
    for name, partitioner in keyed.items():
        row: dict[str, Any] = {
            "name": name,
            "kind": "key",
            "ns_per_call": time_key_partitioner(partitioner, keys, repeats),
        }
        if name != "noop":
            row["uniformity"] = uniformity(partitioner, keys, p_value)
        rows.append(row)
    for name, factory in pk.KEYLESS_PARTITIONERS.items():
        rows.append(
            {
                "name": name,
                "kind": "keyless",
                "ns_per_call": time_keyless_partitioner(factory(), key_count, repeats),
            }
        )
    return {
        "keys": key_count,
        "repeats": repeats,
        "timing_partitions": TIMING_PARTITIONS,
        "partition_counts": list(PARTITION_COUNTS),
        "p_value_method": method,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "results": rows,
    }


def format_table(report: dict[str, Any]) -> str:
    """Render ``report`` (as returned by :func:`run`) as a fixed-width text table."""
    header = f"{'partitioner':<12} {'ns/call':>8}" + "".join(
        f"  {f'n={bins}: chi2 (p)':>22}" for bins in PARTITION_COUNTS
    )
    lines = [header, "-" * len(header)]
    for row in report["results"]:
        line = f"{row['name']:<12} {row['ns_per_call']:>8.1f}"
        for bins in PARTITION_COUNTS:
            if "uniformity" in row:
                cell = row["uniformity"][bins]
                text = f"{cell['chi2']:.1f} ({cell['p_value']:.3g})"
            else:
                text = "-"
            line += f"  {text:>22}"
        lines.append(line)
    lines.append(
        f"{report['keys']:,} keys b'user-<i>', best of {report['repeats']}, "
        f"timed with {report['timing_partitions']} partitions; "
        f"p-values: {report['p_value_method']}; "
        f"{report['implementation']} {report['python']} on {report['machine']}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct keys (1000000)")
    parser.add_argument("--repeats", type=int, default=3, help="timing passes, best kept (3)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    if args.keys < max(PARTITION_COUNTS) or args.repeats < 1:
        parser.error(f"need --keys >= {max(PARTITION_COUNTS)} and --repeats >= 1")
    report = run(args.keys, args.repeats)
    print(format_table(report))
    if args.json is not None:
        # JSON object keys are strings; the partition counts become "4", "12", "64".
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


# --- pytest-benchmark cases: one round is one call per key of _BENCH_KEYS ----------------------

_BENCH_KEYS = make_keys(1000)


def _bench_keyed(benchmark: Any, partitioner: Callable[[bytes, int], int]) -> None:
    benchmark(lambda: deque(map(partitioner, _BENCH_KEYS, repeat(TIMING_PARTITIONS)), maxlen=0))


def _bench_keyless(benchmark: Any, partitioner: pk.KeylessPartitioner) -> None:
    calls = len(_BENCH_KEYS)
    benchmark(
        lambda: deque(
            map(partitioner.partition, repeat("topic", calls), repeat(TIMING_PARTITIONS)),
            maxlen=0,
        )
    )


def test_bench_xxhash(benchmark: Any) -> None:
    """Time 1000 keys through ``xxhash``."""
    _bench_keyed(benchmark, pk.xxhash)


def test_bench_murmur2(benchmark: Any) -> None:
    """Time 1000 keys through ``murmur2``."""
    _bench_keyed(benchmark, pk.murmur2)


def test_bench_memphis(benchmark: Any) -> None:
    """Time 1000 keys through ``memphis``."""
    _bench_keyed(benchmark, pk.memphis)


def test_bench_crc32(benchmark: Any) -> None:
    """Time 1000 keys through ``crc32``."""
    _bench_keyed(benchmark, pk.crc32)


def test_bench_sticky(benchmark: Any) -> None:
    """Time 1000 ``StickyPartitioner.partition()`` calls."""
    _bench_keyless(benchmark, pk.StickyPartitioner())


def test_bench_round_robin(benchmark: Any) -> None:
    """Time 1000 ``RoundRobinPartitioner.partition()`` calls."""
    _bench_keyless(benchmark, pk.RoundRobinPartitioner())


if __name__ == "__main__":
    sys.exit(main())
