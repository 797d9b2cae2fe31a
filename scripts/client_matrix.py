#!/usr/bin/env python3
"""Run producerkit's broker tests against a matrix of aiokafka / nats-py / Python versions.

One venv per (Python, aiokafka, nats-py) combination, kept under ``--cache-dir`` (default
``.matrix/``) and reused while its Python and dependency list still match. The tests run from a
snapshot of the working tree (or of ``--source REV``), from which producerkit's wheel is built
once per Python (C speedups included when they compile) and reinstalled when it changes.

A combination whose clients are inside producerkit's supported ranges (or newer) runs
``pytest -m "brokers and not slow and not spark"`` twice: on the fast path (the clients'
private internals) and with ``PRODUCERKIT_CLIENT_PATH=public``. A combination with a client
older than its range must make ``Producer(url, topic="t").start()`` raise
``producerkit.errors.IncompatibleClientError`` within 1 s, its message naming the package, its
version and the range; the message is recorded. Every combination is probed, so a supported
version that raises the typed error fails too. Exit status 1 if anything failed.

Examples::

    python scripts/client_matrix.py --pair oldest,oldest@3.11 --pair newest,newest@3.13
    python scripts/client_matrix.py --python 3.11 3.12 3.13 \\
        --aiokafka 0.11.0 0.12.0 0.13.0 0.14.0 --nats-py 2.9.1 2.15.0 2.16.0 \\
        --core --no-speedups --jobs 2 --markdown matrix.md --json matrix.json
    python scripts/client_matrix.py --pair 0.14.0,2.16.0 --paths fast -k kafka -- -x

Stdlib only. Uses ``uv`` (PATH, next to this interpreter, or installed with pip into
``<cache-dir>/tools``) and falls back to ``python -m venv`` + pip. docs/compatibility.md has
the results and the options.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import dataclasses
import datetime
import fcntl
import glob
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CLIENTS = ("aiokafka", "nats-py")
#: The supported ranges when producerkit does not state them in one of RANGE_MODULES.
DEFAULT_RANGES = {"aiokafka": ">=0.13,<0.15", "nats-py": ">=2.16,<2.17"}
#: The newest supported releases, if the index cannot be asked (--aiokafka/--nats-py/--pair
#: take ``newest``: the newest release inside the range, and ``oldest``: its lower bound).
DEFAULT_NEWEST = {"aiokafka": "0.14.0", "nats-py": "2.16.0"}
BROKER_MARK = "brokers and not slow and not spark"
#: The public path's rows leave out the broker tests' uvloop cases: what the event loop changes
#: (sockets, transports) is exercised by the fast path's rows, where producerkit writes to the
#: transports itself; the public path differs in which client calls are made, not in the loop.
PUBLIC_PATH_DESELECT = "not uvloop"
CORE_MARK = "not brokers and not slow and not spark"
#: Every pyproject extra is installed but these: spark (pyspark is huge and no backend test
#: needs it) and the aggregates (their own parts are installed one by one, spark excepted, and
#: what they add besides producerkit's extras, such as all's uvloop, is installed too).
SKIP_EXTRAS = frozenset({"spark", "all", "dev"})
#: Entries of the ``dev`` extra that no test imports.
DEV_SKIP = frozenset({"mypy", "ruff", "pyinstrument"})
#: Test tools every venv gets besides the dev extra's: pytest-xdist, so that pytest arguments
#: after ``--`` may run the tests in several workers (.ci/run passes ``-n 2 --dist loadfile``).
TEST_TOOLS = ("pytest-xdist>=3.5",)
#: What goes into the wheel (and into the source hash).
SOURCE_ITEMS = ("producerkit", "pyspark_producerkit", "setup.py", "pyproject.toml", "README.md")
PROBE_URLS = {
    "aiokafka": ("kafka://127.0.0.1:1",),
    "nats-py": ("jetstream://127.0.0.1:1", "nats://127.0.0.1:1"),
}
PROBE_LIMIT = 1.0  # seconds: the typed error must come within this
STATE_FILE = ".client-matrix.json"
#: Where producerkit declares its supported ranges (the first that states them wins).
RANGE_MODULES = ("producerkit/backends/_client_versions.py", "producerkit/backends/_clients.py")

_print_lock = threading.Lock()


def log(message: str) -> None:
    with _print_lock:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- versions and ranges


def version_tuple(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if match is None:
        raise ValueError(f"not a release version: {version!r}")
    return tuple(int(part) for part in match.group(0).split("."))


def _padded(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def same_version(a: str, b: str) -> bool:
    """``0.13`` and ``0.13.0`` are the same release."""
    left, right = _padded(version_tuple(a), version_tuple(b))
    return left == right


def in_range(version: str, spec: str) -> bool:
    """Whether ``version`` satisfies ``spec`` (``>=0.13,<0.15``; ==, !=, <, <=, >, >=, ~=)."""
    have = version_tuple(version)
    for clause in filter(None, (part.strip() for part in spec.split(","))):
        match = re.fullmatch(r"(==|!=|>=|<=|~=|>|<)\s*(\d+(?:\.\d+)*)", clause)
        if match is None:
            raise ValueError(f"cannot read version clause {clause!r} in {spec!r}")
        op, bound_text = match.groups()
        bound = version_tuple(bound_text)
        a, b = _padded(have, bound)
        if op == "~=":  # ~=2.16 is >=2.16,<3; ~=2.16.1 is >=2.16.1,<2.17
            upper = (*bound[:-2], bound[-2] + 1) if len(bound) >= 2 else (bound[0] + 1,)
            below_upper = _padded(have, upper)
            ok = a >= b and below_upper[0] < below_upper[1]
        else:
            ok = {
                "==": a == b,
                "!=": a != b,
                ">=": a >= b,
                "<=": a <= b,
                ">": a > b,
                "<": a < b,
            }[op]
        if not ok:
            return False
    return True


_SPEC = r"(?:\s*(?:==|!=|>=|<=|~=|>|<)\s*\d+(?:\.\d+)*\s*,?)+"


def ranges_from_source(path: Path) -> dict[str, str]:
    """Best effort, from the literals of producerkit's module that declares the ranges:
    requirement strings (``"aiokafka>=0.13,<0.15"``), dict entries ``{"aiokafka": ">=0.13,<0.15"}``
    or ``{"aiokafka": ("0.13", "0.15")}`` (oldest supported, first newer release not tested)."""
    found: dict[str, str] = {}
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return found

    def client(name: str) -> str | None:
        name = name.strip().lower().replace("_", "-")
        return {"aiokafka": "aiokafka", "nats-py": "nats-py", "nats": "nats-py"}.get(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = re.fullmatch(rf"\s*([A-Za-z_-]+)\s*({_SPEC})\s*", node.value)
            if match and (name := client(match.group(1))):
                found.setdefault(name, match.group(2).strip().rstrip(","))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and isinstance(key.value, str)
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, str)
                    and (name := client(key.value))
                    and re.fullmatch(_SPEC, value.value)
                ):
                    found.setdefault(name, value.value.strip().rstrip(","))
                elif (
                    isinstance(key, ast.Constant)
                    and isinstance(key.value, str)
                    and (name := client(key.value))
                    and isinstance(value, ast.Tuple)
                    and len(value.elts) == 2
                    and all(
                        isinstance(e, ast.Constant)
                        and isinstance(e.value, str)
                        and re.fullmatch(r"\d+(?:\.\d+)*", e.value)
                        for e in value.elts
                    )
                ):
                    low, high = (str(e.value) for e in value.elts if isinstance(e, ast.Constant))
                    found.setdefault(name, f">={low},<{high}")
    return found


# ---------------------------------------------------------------------------- the combinations


@dataclasses.dataclass(frozen=True)
class Interpreter:
    label: str  # as asked: "3.11"
    path: str
    version: str  # "3.11.7"

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])


@dataclasses.dataclass(frozen=True)
class Combo:
    python: Interpreter
    aiokafka: str
    nats_py: str

    @property
    def name(self) -> str:
        return f"py{self.python.version}-aiokafka{self.aiokafka}-nats-py{self.nats_py}"

    def version(self, client: str) -> str:
        return self.aiokafka if client == "aiokafka" else self.nats_py


@dataclasses.dataclass
class Row:
    python: str
    aiokafka: str
    nats_py: str
    support: str  # yes | older | newer (than the supported ranges)
    path: str  # fast | public | core | core-no-speedups | probe | install
    ok: bool
    passed: int | None = None
    failed: int | None = None
    skipped: int | None = None
    errors: int | None = None
    seconds: float = 0.0
    note: str = ""
    log: str = ""


def find_python(label: str, uv: str | None) -> Interpreter:
    """An interpreter for ``3.11`` (PATH, pyenv, ``uv python find``) or for a path."""
    candidates: list[str] = []
    if os.sep in label or Path(label).is_file():
        candidates.append(label)
    else:
        if which := shutil.which(f"python{label}"):
            candidates.append(which)
        root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
        pyenv = sorted(
            glob.glob(str(root / "versions" / f"{label}.*" / "bin" / "python3")),
            key=lambda p: version_tuple(Path(p).parent.parent.name),
            reverse=True,
        )
        candidates.extend(pyenv)
        candidates.append(str(root / "versions" / label / "bin" / "python3"))
        if uv:
            found = subprocess.run(
                [uv, "python", "find", label], capture_output=True, text=True, check=False
            )
            if found.returncode == 0 and found.stdout.strip():
                candidates.append(found.stdout.strip())
    for candidate in candidates:
        if not Path(candidate).exists():
            continue
        probe = subprocess.run(
            [candidate, "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            check=False,
        )
        version = probe.stdout.strip()
        if probe.returncode == 0 and (os.sep in label or version.startswith(label + ".")):
            return Interpreter(label, candidate, version)
    raise SystemExit(f"no Python {label} found (PATH, pyenv, uv python find)")


class Versions:
    """Turns ``oldest`` and ``newest`` into versions: the lower bound of the supported range, and
    the newest release inside it (one index look-up per client, by the installer's resolver)."""

    def __init__(self, ranges: dict[str, str], installer: Installer, python: Interpreter) -> None:
        self.ranges = ranges
        self.installer = installer
        self.python = python
        self._newest: dict[str, str] = {}

    def oldest(self, client: str) -> str:
        bounds = re.findall(r"(?:>=|~=|==)\s*(\d+(?:\.\d+)*)", self.ranges[client])
        if not bounds:
            raise SystemExit(f"{client} range {self.ranges[client]!r} has no lower bound")
        parts = max(bounds, key=version_tuple).split(".")
        return ".".join(parts + ["0"] * (3 - len(parts)))

    def newest(self, client: str) -> str:
        if client not in self._newest:
            found = self.installer.newest(self.python, f"{client}{self.ranges[client]}")
            if found is None or not in_range(found, self.ranges[client]):
                log(f"could not resolve the newest {client}: using {DEFAULT_NEWEST[client]}")
                found = DEFAULT_NEWEST[client]
            self._newest[client] = found
        return self._newest[client]

    def resolve(self, client: str, word: str) -> str:
        if word == "oldest":
            return self.oldest(client)
        if word == "newest":
            return self.newest(client)
        version_tuple(word)  # raises on a typo
        return word


def plan(
    args: argparse.Namespace,
    interpreters: list[Interpreter],
    default_labels: list[str],
    versions: Versions,
) -> list[Combo]:
    """Each version given for one client with the other at its newest supported release, then
    the explicit pairs; no duplicates. Without any: the newest supported pair."""
    pairs: list[tuple[str, str, str | None]] = []
    for word in args.aiokafka or ():
        pairs.append((versions.resolve("aiokafka", word), versions.newest("nats-py"), None))
    for word in args.nats_py or ():
        pairs.append((versions.newest("aiokafka"), versions.resolve("nats-py", word), None))
    for text in args.pair or ():
        match = re.fullmatch(r"([\w.]+),([\w.]+)(?:@([\w./-]+))?", text)
        if match is None:
            raise SystemExit(f"--pair {text!r}: expected AIOKAFKA,NATS_PY[@PYTHON]")
        aiokafka = versions.resolve("aiokafka", match.group(1))
        pairs.append((aiokafka, versions.resolve("nats-py", match.group(2)), match.group(3)))
    if not pairs:
        pairs.append((versions.newest("aiokafka"), versions.newest("nats-py"), None))
    by_label = {interp.label: interp for interp in interpreters}
    combos: list[Combo] = []
    for aiokafka, nats_py, python in pairs:
        labels = default_labels if python is None else [python]
        for interp in (by_label[label] for label in labels):
            combo = Combo(interp, aiokafka, nats_py)
            if combo not in combos:
                combos.append(combo)
    return combos


# ---------------------------------------------------------------------------- processes


class Stopping(Exception):
    """The run was interrupted: start nothing new."""


_stopping = threading.Event()
_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux /proc; empty elsewhere)."""
    parents: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        parents.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_group(process: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGINT first, so pytest tears its session down and stops the brokers it started; SIGKILL
    after ``grace``. The brokers run in sessions of their own, so whatever is still alive below
    pytest at that point is stopped by itself."""
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=grace)
        return
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        pass
    below = descendants(process.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:  # a broker leads its own group: stop all of it
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)


def stop_everything() -> None:
    _stopping.set()
    with _running_lock:
        running = list(_running)
    for process in running:
        stop_group(process)


def run_logged(
    command: Sequence[str],
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
) -> tuple[int, float]:
    """Run ``command`` with its output in ``log_path``; (exit code, seconds). A timeout stops
    its process group (see stop_group) and returns -9."""
    if _stopping.is_set():
        raise Stopping
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("w") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        process = subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        with _running_lock:
            _running.add(process)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(process)
            out.write(f"\n[client_matrix] stopped after {timeout}s\n")
            code = -9
        except BaseException:
            stop_group(process)
            raise
        finally:
            with _running_lock:
                _running.discard(process)
    if _stopping.is_set():
        raise Stopping
    return code, time.monotonic() - started


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Installer:
    """Creates venvs and installs into them with uv, or with venv + pip."""

    def __init__(self, uv: str | None) -> None:
        self.uv = uv

    @property
    def name(self) -> str:
        return f"uv ({self.uv})" if self.uv else "python -m venv + pip"

    def create(self, interp: Interpreter, venv: Path, log_path: Path) -> int:
        if self.uv:
            command = [self.uv, "venv", "--quiet", "--python", interp.path, str(venv)]
        else:
            command = [interp.path, "-m", "venv", str(venv)]
        return run_logged(command, log_path)[0]

    def install(self, venv: Path, requirements: Sequence[str], log_path: Path) -> int:
        python = str(venv / "bin" / "python")
        if self.uv:
            command = [self.uv, "pip", "install", "--python", python, *requirements]
        else:
            command = [python, "-m", "pip", "install", "--disable-pip-version-check"]
            command += list(requirements)
        return run_logged(command, log_path)[0]

    def newest(self, interp: Interpreter, requirement: str) -> str | None:
        """The newest release satisfying ``requirement`` for ``interp``, or None."""
        name = _req_name(requirement)
        if self.uv:
            command = [self.uv, "pip", "compile", "--quiet", "--no-header", "--no-deps"]
            command += ["--python", interp.path, "-"]
            result = subprocess.run(
                command, input=requirement, capture_output=True, text=True, check=False
            )
            for line in result.stdout.splitlines():
                match = re.match(rf"{re.escape(name)}==(\S+)", line.strip(), re.I)
                if match:
                    return match.group(1)
            return None
        command = [interp.path, "-m", "pip", "install", "--quiet", "--dry-run", "--no-deps"]
        command += ["--ignore-installed", "--report", "-", requirement]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        try:
            report = json.loads(result.stdout)
            version: str = report["install"][0]["metadata"]["version"]
        except (ValueError, KeyError, IndexError):
            return None
        return version

    def build_wheel(self, interp: Interpreter, source: Path, out: Path, log_path: Path) -> int:
        if self.uv:
            command = [self.uv, "build", "--wheel", "-v", "--python", interp.path]
            command += ["--out-dir", str(out), str(source)]
        else:
            command = [interp.path, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(out)]
            command.append(str(source))
        return run_logged(command, log_path)[0]


def find_uv(cache: Path, bootstrap: bool) -> str | None:
    for candidate in (
        shutil.which("uv"),
        str(Path(sys.executable).parent / "uv"),
        str(cache / "tools" / "bin" / "uv"),
        str(REPO / ".matrix" / "tools" / "bin" / "uv"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    if not bootstrap:
        return None
    tools = cache / "tools"
    log(f"uv not found: installing it with pip into {tools}")
    code, _ = run_logged([sys.executable, "-m", "venv", str(tools)], cache / "logs" / "uv.log")
    if code == 0:
        code, _ = run_logged(
            [str(tools / "bin" / "python"), "-m", "pip", "install", "-q", "uv"],
            cache / "logs" / "uv-install.log",
        )
    uv = tools / "bin" / "uv"
    if code == 0 and uv.is_file():
        return str(uv)
    log("could not install uv: falling back to python -m venv + pip")
    return None


# ---------------------------------------------------------------------------- producerkit itself


def snapshot(rev: str | None, cache: Path) -> tuple[Path, str]:
    """A copy of the repository as a fresh clone would have it, under ``cache/src/<hash>``: the
    tree of ``rev`` (git archive), or the working tree's tracked and untracked-but-not-ignored
    files. The wheel is built and the tests run from it, so an edit made meanwhile in the
    checkout does not change a run halfway. Returns (directory, content hash)."""
    root = cache / "src"
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix="tmp-") as tmp:
        staging = Path(tmp) / "tree"
        staging.mkdir()
        if rev is not None:
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", "--format=tar", rev],
                capture_output=True,
                check=False,
            )
            if archive.returncode != 0:
                raise SystemExit(f"git archive {rev}: {archive.stderr.decode().strip()}")
            with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
                tar.extractall(staging, filter="data")
        else:
            listed = subprocess.run(
                ["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
                capture_output=True,
                check=True,
            )
            for name in sorted(set(listed.stdout.decode().split("\0")) - {""}):
                path = REPO / name
                if path.is_file() and not path.is_symlink():  # a deleted tracked file is gone
                    target = staging / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)
        digest = hashlib.sha256()
        for path in sorted(f for f in staging.rglob("*") if f.is_file()):
            digest.update(str(path.relative_to(staging)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
        source_hash = digest.hexdigest()[:16]
        final = root / source_hash
        if not final.exists():
            staging.rename(final)
    final.touch()
    prune(root, keep=3)
    return final, source_hash


def prune(root: Path, keep: int) -> None:
    """Delete all but the ``keep`` most recently used entries of ``root`` (snapshots, wheels)."""
    entries = [e for e in root.iterdir() if e.is_dir() and not e.name.startswith("tmp-")]
    entries.sort(key=lambda e: e.stat().st_mtime, reverse=True)
    for old in entries[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def requirements(source: Path, aiokafka: str, nats_py: str) -> list[str]:
    """pyproject's runtime deps, its extras but SKIP_EXTRAS, what the all extra adds of its own
    (uvloop: the broker tests run on it too), the dev extra's test tools (but DEV_SKIP) and
    TEST_TOOLS, with the two clients pinned
    (every other requirement on them is dropped: a raised lower bound must not block a pin)."""
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    wanted = list(project.get("dependencies", []))
    for extra, extra_requirements in optional.items():
        if extra not in SKIP_EXTRAS:
            wanted += extra_requirements
    wanted += [r for r in optional.get("all", []) if _req_name(r) != "producerkit"]
    wanted += [r for r in optional.get("dev", []) if _req_name(r) not in DEV_SKIP]
    wanted += TEST_TOOLS
    out: list[str] = ["pip"]  # uv's venvs have none; test_packaging builds a wheel with it
    for requirement in wanted:
        name = _req_name(requirement)
        if name in ("producerkit", *CLIENTS) or requirement in out:
            continue
        out.append(requirement)
    return [*sorted(out), f"aiokafka=={aiokafka}", f"nats-py=={nats_py}"]


def _req_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return match.group(1).lower().replace("_", "-") if match else requirement


@dataclasses.dataclass
class Wheel:
    path: Path | None
    speedups_built: bool
    build_error: str
    seconds: float


def build_wheels(
    installer: Installer, interpreters: list[Interpreter], cache: Path, source: Path
) -> dict[str, Wheel]:
    """One wheel per Python, built from the snapshot ``source`` (``cache/src/<hash>``)."""
    source_hash = source.name
    wheels_root = cache / "wheels"
    (wheels_root / source_hash).mkdir(parents=True, exist_ok=True)
    (wheels_root / source_hash).touch()
    prune(wheels_root, keep=3)
    wheels: dict[str, Wheel] = {}
    for interp in interpreters:
        out = wheels_root / source_hash / interp.version
        tag = "cp" + interp.minor.replace(".", "")
        existing = sorted(out.glob(f"producerkit-*-{tag}-*.whl"))
        log_path = cache / "logs" / f"build-py{interp.version}.log"
        seconds = 0.0
        if not existing:
            log(f"building producerkit {source_hash} for Python {interp.version}")
            shutil.rmtree(out, ignore_errors=True)
            started = time.monotonic()
            code = installer.build_wheel(interp, source, out, log_path)
            seconds = time.monotonic() - started
            existing = sorted(out.glob(f"producerkit-*-{tag}-*.whl")) if code == 0 else []
        if not existing:
            wheels[interp.version] = Wheel(None, False, tail(log_path, 25), seconds)
            continue
        with zipfile.ZipFile(existing[0]) as archive:
            built = any("_speedups" in n and n.endswith(".so") for n in archive.namelist())
        error = "" if built else _compiler_errors(log_path)
        wheels[interp.version] = Wheel(existing[0], built, error, seconds)
    return wheels


def _compiler_errors(log_path: Path) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return "(no build log: the wheel was built by an earlier run)"
    lines = [
        line
        for line in text.splitlines()
        if "error" in line.lower() and ("_speedups" in line or "gcc" in line or "cc1" in line)
    ]
    return "\n".join(lines[:20]) or tail(log_path, 25)


# ---------------------------------------------------------------------------- venvs


def prepare_venv(
    installer: Installer, combo: Combo, wheel: Wheel, source: Path, cache: Path
) -> tuple[Path | None, str]:
    """The combination's venv, made or reused; (venv, "") or (None, why not)."""
    venv = cache / "venvs" / combo.name
    logs = cache / "logs" / combo.name
    state_path = venv / STATE_FILE
    deps = requirements(source, combo.aiokafka, combo.nats_py)
    source_hash = source.name
    state: dict[str, Any] = {}
    if state_path.is_file():
        try:
            state = json.loads(state_path.read_text())
        except ValueError:
            state = {}
    if state.get("python") != combo.python.version or state.get("deps") != deps:
        log(f"{combo.name}: creating venv")
        shutil.rmtree(venv, ignore_errors=True)
        if installer.create(combo.python, venv, logs / "venv.log") != 0:
            return None, "venv creation failed: " + tail(logs / "venv.log", 3)
        if installer.install(venv, deps, logs / "install.log") != 0:
            shutil.rmtree(venv, ignore_errors=True)
            return None, "install failed: " + _install_error(logs / "install.log")
        state = {"python": combo.python.version, "deps": deps}
        state_path.write_text(json.dumps(state, indent=1))
    else:
        log(f"{combo.name}: reusing venv")
    if state.get("producerkit") != source_hash:
        assert wheel.path is not None
        extra = ["--reinstall-package", "producerkit"] if installer.uv else ["--force-reinstall"]
        # producerkit's own runtime deps come with it; its extras are installed above, pinned.
        code = installer.install(venv, [*extra, str(wheel.path)], logs / "install-pk.log")
        if code != 0:
            return None, "installing producerkit failed: " + tail(logs / "install-pk.log", 5)
        state["producerkit"] = source_hash
        state_path.write_text(json.dumps(state, indent=1))
    return venv, ""


def _install_error(log_path: Path) -> str:
    lines = [line.strip() for line in tail(log_path, 40).splitlines() if line.strip()]
    interesting = [
        line
        for line in lines
        if re.search(r"error|because|no matching|failed|not found|requires", line, re.I)
    ]
    return " | ".join((interesting or lines)[-4:])[:600]


# ---------------------------------------------------------------------------- probe and tests

PROBE = r"""
import asyncio, importlib.metadata as md, json, sys, time
urls = json.loads(sys.argv[1])
out = {"versions": {}, "urls": {}}
for dist in ("aiokafka", "nats-py", "producerkit"):
    try:
        out["versions"][dist] = md.version(dist)
    except md.PackageNotFoundError:
        out["versions"][dist] = None
import producerkit, producerkit.errors as errors
from producerkit import _fast
out["producerkit_file"] = producerkit.__file__
out["speedups"] = _fast.SPEEDUPS
typed = getattr(errors, "IncompatibleClientError", None)
out["has_typed_error"] = typed is not None

async def start(url, result):
    started = time.perf_counter()
    producer = None
    result["phase"] = "Producer()"
    try:
        producer = producerkit.Producer(url, topic="t")
        result["phase"] = "start()"
        await asyncio.wait_for(producer.start(), 3.0)
        result["phase"] = "started"
    finally:
        result["seconds"] = round(time.perf_counter() - started, 3)
        if producer is not None:
            try:
                await asyncio.wait_for(producer.close(), 2.0)
            except BaseException:
                pass

for url in urls:
    result = {"raised": None, "message": "", "typed": False}
    try:
        asyncio.run(start(url, result))
    except BaseException as exc:
        kind = type(exc)
        result["raised"] = f"{kind.__module__}.{kind.__qualname__}"
        result["message"] = str(exc)
        result["typed"] = typed is not None and isinstance(exc, typed)
        for attribute in ("package", "version", "supported"):
            if result["typed"] and hasattr(exc, attribute):
                result[attribute] = str(getattr(exc, attribute))
        cause = exc.__cause__ or exc.__context__
        if cause is not None:
            result["cause"] = f"{type(cause).__qualname__}: {cause}"
    out["urls"][url] = result
print("CLIENT_MATRIX_PROBE " + json.dumps(out))
"""


def run_probe(combo: Combo, venv: Path, cache: Path) -> dict[str, Any]:
    urls = [url for client in CLIENTS for url in PROBE_URLS[client]]
    log_path = cache / "logs" / combo.name / "probe.log"
    env = _clean_env(venv)
    command = [str(venv / "bin" / "python"), "-I", "-c", PROBE, json.dumps(urls)]
    code, _ = run_logged(command, log_path, env=env, cwd=cache, timeout=120)
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("CLIENT_MATRIX_PROBE "):
            result: dict[str, Any] = json.loads(line.split(" ", 1)[1])
            return result
    return {"crashed": f"exit {code}: " + tail(log_path, 6)}


def _clean_env(venv: Path, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PRODUCERKIT_") and key not in ("PYTHONPATH", "PYTHONHOME")
    }
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run_pytest(
    ctx: Context, combo: Combo, venv: Path, path: str, mark: str, env_extra: dict[str, str]
) -> Row:
    args = ctx.args
    logs = ctx.cache / "logs" / combo.name
    junit = logs / f"{path}.xml"
    junit.unlink(missing_ok=True)
    # The venv's pytest script, not ``python -m pytest``: that would put the snapshot first on
    # sys.path and import producerkit's sources (without this Python's C speedups).
    command = [str(venv / "bin" / "pytest"), "-q", "-m", mark, f"--junitxml={junit}"]
    selections = [f"({args.k})"] if args.k else []
    if path == "public":
        selections.append(PUBLIC_PATH_DESELECT)
    if selections:
        command += ["-k", " and ".join(selections)]
    command += args.pytest_args
    log(f"{combo.name}: pytest {path}")
    code, seconds = run_logged(
        command,
        logs / f"{path}.log",
        env=_clean_env(venv, **env_extra),
        cwd=ctx.source,
        timeout=args.run_timeout,
    )
    counts = junit_counts(junit)
    row = Row(
        combo.python.version,
        combo.aiokafka,
        combo.nats_py,
        overall(support_of(combo, ctx.ranges)),
        path,
        ok=code == 0,
        seconds=round(seconds, 1),
        log=str(logs / f"{path}.log"),
    )
    if counts is not None:
        row.passed, row.failed, row.skipped, row.errors = counts
    if code == 5:
        row.note = "no test selected (pytest exit 5)"
    elif code == -9:
        row.note = f"killed after {args.run_timeout}s"
    elif code != 0:
        failures = failed_tests(logs / f"{path}.log")
        last = [line for line in tail(logs / f"{path}.log", 5).splitlines() if line.strip()]
        said = "; ".join(failures) if failures else (last[-1] if last else "")
        row.note = f"pytest exit {code}: {said}"
    return row


def junit_counts(path: Path) -> tuple[int, int, int, int] | None:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = failures = errors = skipped = 0
    for suite in suites:
        total += int(suite.get("tests", 0))
        failures += int(suite.get("failures", 0))
        errors += int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return total - failures - errors - skipped, failures, skipped, errors


def failed_tests(log_path: Path, limit: int = 6) -> list[str]:
    names = re.findall(r"^(?:FAILED|ERROR) (\S+)", tail(log_path, 400), re.M)
    return names[:limit] + ([f"... {len(names) - limit} more"] if len(names) > limit else [])


def why_failed(log_path: Path, limit: int = 40) -> list[str]:
    """What the log says of its failures, for a CI output that keeps no log: pytest's short
    summary lines (each test with its message), then the first failure's ``E`` lines and the
    location it names last, at most ``limit`` lines in all."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    summary = [line for line in lines if re.match(r"(?:FAILED|ERROR) \S", line)]
    first: list[str] = []
    for index, line in enumerate(lines):
        if re.match(r"_{3,} .* _{3,}$", line):
            block = lines[index : index + 2000]
            ends = [i for i, text in enumerate(block[1:], 1) if re.match(r"_{3,} .* _{3,}$", text)]
            block = block[: ends[0]] if ends else block
            errors = [text for text in block if text.startswith("E ")]
            where = [text for text in block if re.match(r"\S+\.py:\d+: ", text)]
            first = [block[0], *errors, *where[-1:]]
            break
    picked = summary[:6] + first
    return picked[:limit] + (
        [f"... {len(picked) - limit} more lines"] if len(picked) > limit else []
    )


# ---------------------------------------------------------------------------- one combination


@dataclasses.dataclass
class Context:
    args: argparse.Namespace
    installer: Installer
    cache: Path
    ranges: dict[str, str]
    wheels: dict[str, Wheel]
    source: Path  # the snapshot: cache/src/<hash>
    reads_client_path: bool


def classify(version: str, spec: str) -> str:
    """``yes`` inside ``spec``; ``older`` below one of its lower bounds (must raise the typed
    error); ``newer`` otherwise (allowed: producerkit falls back to the public API if the
    internals moved, so its tests run as for a supported one)."""
    if in_range(version, spec):
        return "yes"
    lower = ",".join(c for c in spec.split(",") if c.strip()[:1] in (">", "~"))
    return "older" if lower and not in_range(version, lower) else "newer"


def support_of(combo: Combo, ranges: dict[str, str]) -> dict[str, str]:
    return {client: classify(combo.version(client), ranges[client]) for client in CLIENTS}


def overall(support: dict[str, str]) -> str:
    values = set(support.values())
    return "older" if "older" in values else "newer" if "newer" in values else "yes"


def run_combo(ctx: Context, combo: Combo, core: bool) -> list[Row]:
    support = support_of(combo, ctx.ranges)
    testable = overall(support) != "older"
    base = (combo.python.version, combo.aiokafka, combo.nats_py, overall(support))
    wheel = ctx.wheels[combo.python.version]
    if wheel.path is None:
        return [Row(*base, "install", False, note="producerkit wheel did not build")]
    started = time.monotonic()
    venv, why = prepare_venv(ctx.installer, combo, wheel, ctx.source, ctx.cache)
    if venv is None:
        # An unsupported client that cannot even be installed here is no failure of ours.
        return [Row(*base, "install", not testable, note=why)]
    log(f"{combo.name}: ready in {time.monotonic() - started:.0f}s; probing")
    probe = run_probe(combo, venv, ctx.cache)
    rows: list[Row] = []
    probe_row = judge_probe(combo, support, probe, ctx.cache, ctx.ranges)
    if not testable or not probe_row.ok:
        rows.append(probe_row)
    if not testable or ctx.args.probe_only:
        return rows
    speedups = probe.get("speedups", "?")
    for path in ctx.args.paths:
        env = {"PRODUCERKIT_CLIENT_PATH": "public"} if path == "public" else {}
        row = run_pytest(ctx, combo, venv, path, BROKER_MARK, env)
        notes = [row.note] if row.note else []
        if path == "fast":
            notes.append(f"speedups {speedups}")
        if path == "public" and not ctx.reads_client_path:
            notes.append("pending: producerkit does not read PRODUCERKIT_CLIENT_PATH yet")
        row.note = "; ".join(notes)
        rows.append(row)
    if core and ctx.args.core:
        row = run_pytest(ctx, combo, venv, "core", CORE_MARK, {})
        row.note = "; ".join(filter(None, [row.note, f"speedups {speedups}"]))
        rows.append(row)
    if core and ctx.args.no_speedups:
        env = {"PRODUCERKIT_NO_SPEEDUPS": "1"}
        path = "core-no-speedups"
        rows.append(run_pytest(ctx, combo, venv, path, CORE_MARK, env))
    return rows


def unnamed(message: str, client: str, installed: str | None, spec: str) -> str:
    """What the typed error's message should name and does not: the package, its installed
    version and the supported range (each of its bounds)."""
    wanted = [client, installed or "", *re.findall(r"\d+(?:\.\d+)*", spec)]
    return ", ".join(w for w in wanted if w and w not in message)


def judge_probe(
    combo: Combo,
    support: dict[str, str],
    probe: dict[str, Any],
    cache: Path,
    ranges: dict[str, str],
) -> Row:
    """Clients older than their range must raise the typed error within PROBE_LIMIT; the others
    must not raise it at all."""
    base = (combo.python.version, combo.aiokafka, combo.nats_py, overall(support))
    log_path = str(cache / "logs" / combo.name / "probe.log")
    if "crashed" in probe:
        return Row(*base, "probe", False, note="probe crashed: " + probe["crashed"], log=log_path)
    notes: dict[str, list[str]] = {}  # what was said -> by which schemes

    def note(scheme: str, text: str) -> None:
        notes.setdefault(text, []).append(scheme)

    ok = True
    slowest = 0.0
    installed = probe.get("versions", {})
    for client in CLIENTS:
        have = installed.get(client)
        if have is None or not same_version(have, combo.version(client)):
            ok = False
            note(client, f"{have} installed, not {combo.version(client)}")
        for url in PROBE_URLS[client]:
            result = probe["urls"][url]
            slowest = max(slowest, result["seconds"])
            scheme = url.split(":", 1)[0]
            said = f"{result['raised']}: {result['message']}".strip()
            if support[client] != "older":
                if result["typed"]:
                    ok = False
                    note(scheme, f"a {support[client]} version raised the typed error: {said}")
                continue
            if not result["typed"]:
                ok = False
                pending = "" if probe.get("has_typed_error") else "pending (no typed error yet); "
                note(scheme, f"{pending}today raises {said}")
            elif result["seconds"] > PROBE_LIMIT:
                ok = False
                note(scheme, f"typed error after {result['seconds']}s (> {PROBE_LIMIT}s): {said}")
            elif missing := unnamed(result["message"], client, have, ranges[client]):
                ok = False
                note(scheme, f"the message does not name {missing}: {said}")
            else:
                where = "" if result.get("phase") == "start()" else f"at {result.get('phase')}: "
                note(scheme, f"{where}{result['message']}")
    return Row(
        *base,
        "probe",
        ok,
        seconds=round(slowest, 2),
        note="; ".join(f"{', '.join(schemes)}: {text}" for text, schemes in notes.items()),
        log=log_path,
    )


# ---------------------------------------------------------------------------- output

COLUMNS = (
    *("python", "aiokafka", "nats-py", "support", "path", "result"),
    *("passed", "failed", "skipped", "errors", "seconds", "note"),
)


def row_cells(row: Row) -> list[str]:
    def count(value: int | None) -> str:
        return "" if value is None else str(value)

    return [
        row.python,
        row.aiokafka,
        row.nats_py,
        row.support,
        row.path,
        "ok" if row.ok else "FAIL",
        count(row.passed),
        count(row.failed),
        count(row.skipped),
        count(row.errors),
        f"{row.seconds:.1f}",
        row.note,
    ]


def text_table(rows: Iterable[Row], note_width: int = 110) -> str:
    cells = [list(COLUMNS)] + [row_cells(row) for row in rows]
    for line in cells:
        if len(line[-1]) > note_width:
            line[-1] = line[-1][: note_width - 3] + "..."
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS) - 1)]
    out = []
    for line in cells:
        padded = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        out.append("  ".join(padded) + "  " + line[-1])
    return "\n".join(out)


def markdown_table(rows: Iterable[Row]) -> str:
    def escape(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(escape(c) for c in row_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def git_describe(rev: str | None) -> str:
    result = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", f"{rev or 'HEAD'}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or "unknown"


# ---------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    passthrough: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, passthrough = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Arguments after -- go to pytest.",
    )
    parser.add_argument(
        "--aiokafka",
        nargs="+",
        metavar="V",
        help="aiokafka versions to try, each with the newest supported nats-py "
        "(a version, or oldest / newest: the supported range's lower bound / newest release)",
    )
    parser.add_argument(
        "--nats-py",
        nargs="+",
        metavar="V",
        help="nats-py versions to try, each with the newest supported aiokafka (or oldest/newest)",
    )
    parser.add_argument(
        "--pair",
        action="append",
        metavar="A,N[@PY]",
        help="an explicit aiokafka,nats-py pair (versions, oldest or newest); @PY runs it on "
        "that Python only, else on every --python",
    )
    parser.add_argument(
        "--python",
        nargs="+",
        metavar="PY",
        default=None,
        help="Python versions (3.11) or interpreter paths; default: this interpreter's",
    )
    parser.add_argument(
        "--paths",
        nargs="*",
        choices=("fast", "public"),
        default=["fast", "public"],
        help="client paths to run the broker tests on (default: both; none: only --core)",
    )
    parser.add_argument(
        "--core",
        action="store_true",
        help="also run the broker-free core tests once per Python (in its newest pair's venv)",
    )
    parser.add_argument(
        "--no-speedups",
        action="store_true",
        help="also run the core tests once per Python with PRODUCERKIT_NO_SPEEDUPS=1",
    )
    parser.add_argument(
        "--probe-only",
        action="store_true",
        help="only check which versions raise IncompatibleClientError; run no tests",
    )
    parser.add_argument("-k", metavar="EXPR", help="pytest -k expression")
    parser.add_argument("--aiokafka-range", help=f"default: {DEFAULT_RANGES['aiokafka']}")
    parser.add_argument("--nats-py-range", help=f"default: {DEFAULT_RANGES['nats-py']}")
    parser.add_argument(
        "--source",
        metavar="REV",
        help="test this git revision (git archive) instead of the working tree",
    )
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".matrix")
    parser.add_argument("--jobs", type=int, default=1, help="combinations at once (at most 2)")
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="seconds per pytest")
    parser.add_argument("--markdown", type=Path, metavar="FILE")
    parser.add_argument("--json", type=Path, metavar="FILE")
    parser.add_argument("--no-uv", action="store_true", help="use python -m venv + pip")
    parser.add_argument("--uv", metavar="PATH", help="the uv binary to use")
    parser.add_argument("--fresh", action="store_true", help="delete cached venvs and wheels")
    args = parser.parse_args(argv)
    args.pytest_args = passthrough
    args.jobs = max(1, min(args.jobs, 2))
    return args


def resolve_ranges(args: argparse.Namespace, source: Path) -> tuple[dict[str, str], str]:
    ranges = dict(DEFAULT_RANGES)
    origin = "script defaults"
    for module in RANGE_MODULES:
        declared = ranges_from_source(source / module)
        if declared:
            ranges.update(declared)
            origin = f"{module} ({', '.join(sorted(declared))})"
            break
    for client, given in (("aiokafka", args.aiokafka_range), ("nats-py", args.nats_py_range)):
        if given:
            ranges[client] = given
            origin += f"; {client} from the command line"
    for spec in ranges.values():
        in_range("1.0", spec)  # raises on a range this script cannot read
    return ranges, origin


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # as Ctrl-C: stop the tests and their brokers
    began = time.monotonic()
    cache: Path = args.cache_dir.resolve()
    if args.fresh:
        shutil.rmtree(cache / "venvs", ignore_errors=True)
        shutil.rmtree(cache / "wheels", ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    if args.source:  # one commit for the whole run, even if the branch moves meanwhile
        args.source = git_describe(args.source)
        if args.source == "unknown":
            raise SystemExit("--source: not a git revision of this repository")
    commit = git_describe(args.source) + ("" if args.source else " + working tree")
    lock = (cache / ".lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(
            f"another client_matrix run uses {cache}: wait, or pass --cache-dir"
        ) from None
    uv = None if args.no_uv else (args.uv or find_uv(cache, bootstrap=True))
    installer = Installer(uv)
    pinned = [m.group(1) for p in args.pair or () if (m := re.search(r"@(.+)$", p))]
    only_pinned = bool(pinned) and len(pinned) == len(args.pair or ())
    only_pinned = only_pinned and not (args.aiokafka or args.nats_py)
    current = ".".join(map(str, sys.version_info[:2]))
    default_labels: list[str] = args.python or ([] if only_pinned else [current])
    interpreters = [find_python(label, uv) for label in dict.fromkeys(default_labels + pinned)]
    source, source_hash = snapshot(args.source, cache)
    reads_client_path = any(
        "PRODUCERKIT_CLIENT_PATH" in path.read_text(errors="replace")
        for path in (source / "producerkit").rglob("*.py")
    )
    log(f"sources: {args.source or 'working tree'} -> {source}")
    ranges, origin = resolve_ranges(args, source)
    versions = Versions(ranges, installer, interpreters[0])
    combos = plan(args, interpreters, default_labels, versions)
    log(f"installer: {installer.name}; supported: {ranges} (from {origin})")
    log(f"{len(combos)} combinations on {', '.join(i.version for i in interpreters)}")
    wheels = build_wheels(installer, interpreters, cache, source)
    rows: list[Row] = []
    for interp in interpreters:
        wheel = wheels[interp.version]
        speedups = "built" if wheel.speedups_built else "NOT built"
        log(f"Python {interp.version}: producerkit wheel {wheel.path}, C speedups {speedups}")
        if wheel.path is None or not wheel.speedups_built:
            rows.append(
                Row(
                    interp.version,
                    "",
                    "",
                    "",
                    "build",
                    wheel.path is not None,
                    seconds=round(wheel.seconds, 1),
                    note=f"C speedups not built: {wheel.build_error}"[:2000],
                )
            )

    ctx = Context(args, installer, cache, ranges, wheels, source, reads_client_path)
    core_done: set[str] = set()
    jobs: list[tuple[Combo, bool]] = []
    for combo in combos:
        core = (args.core or args.no_speedups) and combo.python.version not in core_done
        if core and overall(support_of(combo, ranges)) == "yes":
            core_done.add(combo.python.version)
        else:
            core = False
        jobs.append((combo, core))
    for interp in interpreters:  # a Python whose combinations are all unsupported
        if (args.core or args.no_speedups) and interp.version not in core_done:
            newest = (versions.newest("aiokafka"), versions.newest("nats-py"))
            jobs.append((Combo(interp, *newest), True))
            core_done.add(interp.version)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
    try:
        futures = [pool.submit(run_combo, ctx, combo, core) for combo, core in jobs]
        for future in futures:
            rows.extend(future.result())
    except (KeyboardInterrupt, Stopping):
        log("interrupted: stopping the running tests and their brokers")
        stop_everything()
        pool.shutdown(wait=True, cancel_futures=True)
        return 130
    pool.shutdown()

    rows.sort(
        key=lambda r: (
            version_tuple(r.python),
            version_tuple(r.aiokafka or "0"),
            version_tuple(r.nats_py or "0"),
        )
    )
    total = time.monotonic() - began
    failed = [row for row in rows if not row.ok]
    print(text_table(rows))
    for row in failed:
        print(f"\nFAIL {row.python} aiokafka {row.aiokafka} nats-py {row.nats_py} {row.path}")
        print(f"  {row.note}")
        if row.log:
            print(f"  log: {row.log}")
            for line in why_failed(Path(row.log)):
                print(f"  | {line}")
    print(f"\n{len(rows)} rows, {len(failed)} failed, {total:.0f}s in all; supported {ranges}")
    # One closing line in pytest's words: every test and every probe, passed or failed.
    passed = sum(r.passed or 0 for r in rows) + sum(1 for r in rows if r.passed is None and r.ok)
    failures = sum((r.failed or 0) + (r.errors or 0) for r in rows)
    failures += sum(1 for r in rows if not r.ok and not (r.failed or r.errors))
    skipped = sum(r.skipped or 0 for r in rows)
    print(f"client_matrix: {passed} passed, {failures} failed, {skipped} skipped")
    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "source_hash": source_hash,
        "installer": installer.name,
        "ranges": ranges,
        "ranges_from": origin,
        "reads_client_path": reads_client_path,
        "seconds": round(total, 1),
        "argv": list(argv),
    }
    if args.markdown:
        header = (
            f"Client matrix of {meta['date']} (commit {meta['commit']}, sources "
            f"{source_hash}, {installer.name}); supported ranges {ranges} from {origin}; "
            f"{total:.0f}s in all.\n\n"
        )
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(header + markdown_table(rows) + "\n")
    if args.json:
        payload = {"meta": meta, "rows": [dataclasses.asdict(row) for row in rows]}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
