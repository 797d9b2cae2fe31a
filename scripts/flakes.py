#!/usr/bin/env python3
"""Repeat tests in random order, optionally with the machine's other cores kept busy, to catch a
test that fails by chance before it lands.

Each test is run ``--count`` times (pytest-repeat) in an order shuffled by pytest-randomly (the
default suite runs in file order: ``-p no:randomly`` in pyproject.toml's addopts; this script
turns it back on). Every run prints its seed; ``--seed SEED`` replays that order. Exit status 1
if any run failed.

Which tests::

    python scripts/flakes.py tests/test_sync.py tests/test_linger.py  # these files
    python scripts/flakes.py --changed-since HEAD~3     # test files changed since HEAD~3
    python scripts/flakes.py --changed-within 12h       # ...by commits of the 12 h before HEAD
    python scripts/flakes.py --each-module              # every module, a run of its own each
    python scripts/flakes.py --suite-runs 5 --count 1   # the whole default suite, 5 times

``--load N`` keeps N cores busy (a spinning process each) while the tests run; ``--count N``
repeats each test N times within a run (default 20); ``--budget MINUTES`` starts no run after
that long (what was left is listed); anything after ``--`` goes to pytest (``-- -k kafka -x``).
Changed files and ``--each-module`` run a file per pytest run; files named here run together.
The runs use the project's pytest configuration (four xdist workers, one file per worker);
``--spread`` spreads each file's tests over the workers instead (``--dist load``: a long file's
repeats end sooner; its module and session fixtures, a SparkSession among them, are set up on
each worker). Stdlib only; needs pytest-repeat and pytest-randomly (``pip install -e
".[dev]"``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


def _spin() -> None:
    while True:
        pass


@contextmanager
def _cores_kept_busy(cores: int) -> Iterator[None]:
    """``cores`` processes spinning at 100 % CPU until the block ends."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(cores)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def _test_files(paths: Sequence[str]) -> list[str]:
    """The existing ``tests/test_*.py`` among ``paths`` (repo-relative), sorted, once each."""
    found = {
        path
        for path in paths
        if re.fullmatch(r"tests/test_[^/]+\.py", path) and (ROOT / path).is_file()
    }
    return sorted(found)


def changed_since(revision: str) -> list[str]:
    """Test files changed between ``revision`` and the work tree (committed or not)."""
    return _test_files(_git("diff", "--name-only", revision, "--").split())


def changed_within(hours: float) -> list[str]:
    """Test files changed by the commits made within ``hours`` before HEAD's own commit time, and
    in the work tree: a session's or a pull request's work, in a fresh clone too."""
    head_time = int(_git("log", "-1", "--format=%ct", "HEAD").strip())
    since = head_time - int(hours * 3600)
    log = _git("log", f"--since={since}", "--name-only", "--format=", "HEAD")
    uncommitted = _git("diff", "--name-only", "HEAD", "--")
    return _test_files(log.split() + uncommitted.split())


def all_modules() -> list[str]:
    return sorted(str(path.relative_to(ROOT)) for path in TESTS.glob("test_*.py"))


#: pytest's exit status when it selected no test.
NO_TESTS = 5


def run_pytest(
    files: Sequence[str], count: int, seed: int, extra: Sequence[str], spread: bool = False
) -> int:
    """One pytest run of ``files`` (every test ``count`` times, order shuffled by ``seed``;
    ``spread``: over every worker); its exit status."""
    command = [sys.executable, "-m", "pytest", "-p", "randomly", "-p", "repeat"]
    command += ["-p", "no:cacheprovider", f"--randomly-seed={seed}", "-q"]
    if spread:
        command += ["--dist", "load"]
    if count > 1:
        command += [f"--count={count}"]
    command += [*extra, *files]
    print(f"\n$ {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    status = subprocess.run(command, cwd=ROOT).returncode
    outcome = {0: "passed", NO_TESTS: "selected no test"}.get(status, f"FAILED (exit {status})")
    print(f"--> {outcome} in {time.monotonic() - started:.0f}s, seed {seed}", flush=True)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="*", help="test files (default: see the options)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--changed-since", metavar="REV", help="test files changed since REV")
    which.add_argument(
        "--changed-within",
        metavar="HOURS",
        help="test files changed by commits within HOURS (e.g. 12h) before HEAD",
    )
    which.add_argument(
        "--each-module", action="store_true", help="every test module, a run of its own each"
    )
    parser.add_argument("--count", type=int, default=20, help="repeats of each test (default 20)")
    parser.add_argument(
        "--suite-runs", type=int, default=1, help="runs of the whole selection (default 1)"
    )
    parser.add_argument("--load", type=int, default=0, metavar="N", help="keep N cores busy")
    parser.add_argument(
        "--spread", action="store_true", help="spread each file's tests over the workers"
    )
    parser.add_argument("--seed", type=int, help="the first run's shuffle seed (default: random)")
    parser.add_argument(
        "--budget",
        type=float,
        metavar="MINUTES",
        help="start no run after MINUTES (the runs left are listed, not counted as passed)",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: len(argv) - len(extra) - (1 if "--" in argv else 0)])

    if args.changed_since:
        files = changed_since(args.changed_since)
    elif args.changed_within:
        files = changed_within(float(args.changed_within.rstrip("h")))
    else:
        files = list(args.files)
    if (args.changed_since or args.changed_within) and not files:
        print("no test file changed: nothing to repeat")
        return 0
    # A file a run of its own (a failure names its file, a budget stops between files), except
    # for files named on the command line and the whole suite: one run.
    per_file = args.each_module or args.changed_since or args.changed_within
    modules = all_modules() if args.each_module else files
    runs = [[file] for file in modules] if per_file else [files]

    seed = args.seed if args.seed is not None else random.randrange(1, 2**31)
    deadline = None if args.budget is None else time.monotonic() + args.budget * 60
    failed: list[tuple[list[str], int]] = []
    empty: list[list[str]] = []
    left: list[list[str]] = []
    with _cores_kept_busy(args.load):
        for _ in range(args.suite_runs):
            for selection in runs:
                if deadline is not None and time.monotonic() > deadline:
                    left.append(selection)
                    continue
                status = run_pytest(selection, args.count, seed, extra, args.spread)
                if status == NO_TESTS and per_file:
                    empty.append(selection)  # the filters left nothing of this file
                elif status != 0:
                    failed.append((selection, seed))
                seed += 1
    ran = args.suite_runs * len(runs) - len(left) - len(empty)
    print(f"\nruns: {ran - len(failed)} of {ran} passed")
    for selection, run_seed in failed:
        print(f"  failed: {' '.join(selection) or 'the whole suite'} --seed {run_seed}")
    for selection in empty:
        print(f"  selected no test: {' '.join(selection)}")
    for selection in left:
        print(f"  not run (past the {args.budget:g} min budget): {' '.join(selection)}")
    return 1 if failed or ran == 0 else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
