"""Every code snippet in docs/*.md and README.md runs here, so the docs cannot rot.

Convention for writers of docs (fences are what matter):

- ```python            executed. The blocks of one file run in order in one namespace (a page
                        can build on its earlier blocks), in a temporary working directory.
                        Broker placeholders are replaced by brokers started for the page's run
                        alone, empty as a reader's first broker is (a page may well expect a
                        subject it names to hold nothing yet, run after run):
                        ``kafka://127.0.0.1:9092``, ``jetstream://127.0.0.1:4222`` and
                        ``nats://127.0.0.1:4222`` (PRODUCERKIT_URL is set to the Kafka one).
                        Top-level ``await``/``async with`` is allowed (the block then runs on
                        an asyncio event loop of its own, as in ``python -m asyncio``). A
                        block that mentions ``pyspark`` is skipped when pyspark or Java is
                        missing.
- ```python test-file  a test file of the reader's (a block that defines a top-level ``test_*``
                        function must say so, or ``notest``): run as a ```python block (later
                        blocks may call its tests) and also written to a file of its own and run
                        by an inner pytest, with producerkit's plugin (its broker fixtures)
                        loaded as an installed producerkit loads it; every test in it must pass.
                        No broker placeholders: the plugin's fixtures give the URLs.
- ```python notest     compiled (syntax checked), not run: other libraries' code, fragments.
- ```bash / ```console / ```sh / ```shell
                        each line starting with ``producerkit `` (after an optional ``$ ``) is
                        parsed with that command's real argument parser (an unknown option
                        fails). Other lines are not checked. In README.md and
                        docs/quickstart.md (RUN_AS_PASTED) every ```bash block also runs, in
                        order with the page's python blocks, in the same temporary directory, as
                        a reader pastes them: bash with the venv's ``bin`` first on PATH, the
                        broker placeholders replaced, ``export`` lines carried to later blocks,
                        ``pip install`` lines skipped (the venv is the install) and
                        ``producerkit dev`` keeping its state in that directory.
- ```bash norun        parsed, never run (a fresh machine's install and the whole test suite).
- ```bash interrupt    a command that runs until Ctrl-C: run, sent SIGINT once it is up, and
                        it must exit 130.
- ```toml              parsed with tomllib.
- anything else        (```text, ```json, ...) not checked.

The site is built by MkDocs (mkdocs.yml; docs/api.md is mkdocstrings directives over the
docstrings): test_site_builds_strict runs ``mkdocs build --strict``, which fails on a link to a
missing page or anchor, a cross-reference that resolves nowhere (in a page or a docstring), or a
docstring griffe cannot parse; test_strict_build_catches shows that it does.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
import weakref
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import ON_THE_PUBLIC_PATH

from producerkit.backends import memory as memory_backend

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
TOP_LEVEL_AWAIT = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def blocks(page: Path) -> list[tuple[str, str, int]]:
    """(info string, code, line number) of every fenced block of a page."""
    text = page.read_text()
    return [
        (match[1].strip(), match[2], text.count("\n", 0, match.start()) + 1)
        for match in FENCE.finditer(text)
    ]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _mkdocs_build(root: Path, site_dir: Path) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip('mkdocs is not installed: pip install -e ".[docs]" (or ".[dev]")')
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_site_builds_strict(tmp_path: Path) -> None:
    result = _mkdocs_build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("Producer.flush", "SyncProducer.flush", "SyncProducer.close"):
        assert f'id="producerkit.{name}"' in api, name


def test_strict_build_catches(tmp_path: Path) -> None:
    """A copy of the site with broken links added to a page does not build, and says why."""
    broken = {
        "[a page](no-such-page.md)": "no-such-page.md",
        "[an anchor](tuning.md#no-such-anchor)": "no-such-anchor",
        "[a reference][producerkit.NoSuchThing]": "producerkit.NoSuchThing",
    }
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.so")
    for name in ("docs", "scripts", "producerkit"):
        shutil.copytree(ROOT / name, copy / name, ignore=ignore)
    page = copy / "docs" / "quickstart.md"
    page.write_text(page.read_text() + "".join(f"\nSee {link}.\n" for link in broken))
    result = _mkdocs_build(copy, tmp_path / "site")
    assert result.returncode != 0, "mkdocs build --strict passed with broken links"
    for complaint in broken.values():
        assert complaint in result.stderr, result.stderr


RUN_AS_PASTED = {ROOT / "README.md", ROOT / "docs" / "quickstart.md"}
SHELL_RUNS = ("bash", "bash interrupt")


@pytest.mark.parametrize("page", [p for p in PAGES if p.exists()], ids=page_id)
def test_blocks_run(
    page: Path, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The python blocks of every page, and the shell blocks of RUN_AS_PASTED, in order."""
    runs = ("python", *SHELL_RUNS) if page in RUN_AS_PASTED else ("python",)
    code_blocks = [
        ("python" if info == TEST_FILE else info, code, line)
        for info, code, line in blocks(page)
        if info in runs or info == TEST_FILE
    ]
    if not code_blocks:
        pytest.skip("no blocks to run")
    everything = "".join(code for _, code, _ in code_blocks)
    urls = {}
    if "kafka://127.0.0.1:9092" in everything:
        urls["kafka://127.0.0.1:9092"] = request.getfixturevalue("private_kafka_broker").url
    if "127.0.0.1:4222" in everything:
        host_port = request.getfixturevalue("private_nats_broker").host_port
        urls["jetstream://127.0.0.1:4222"] = f"jetstream://{host_port}"
        urls["nats://127.0.0.1:4222"] = f"nats://{host_port}"
    monkeypatch.chdir(tmp_path)
    # A page's memory://NAME stores are its own, as in the reader's fresh process: a store that an
    # earlier run of the page filled lives on until its producers are garbage-collected.
    monkeypatch.setattr(memory_backend, "_stores", weakref.WeakValueDictionary())
    if "kafka://127.0.0.1:9092" in urls:
        monkeypatch.setenv("PRODUCERKIT_URL", urls["kafka://127.0.0.1:9092"])
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    shell = _Shell(tmp_path, urls)
    request.addfinalizer(shell.stop_dev_brokers)
    refused_names: set[str] = set()
    for info, code, line in code_blocks:
        if info != "python":
            shell.run(code, f"{page_id(page)}:{line}", interrupt=info == "bash interrupt")
            continue
        if "pyspark" in code and not _spark_available():
            continue
        if ON_THE_PUBLIC_PATH and (
            ("atomic_batch(" in code and "kafka" in code) or _uses(code, refused_names)
        ):
            # Kafka transactions need producerkit's own Produce requests: refused there,
            # typed (tests/test_transactions.py checks the refusal); so is a later block that
            # calls what such a block defined
            refused_names |= _defines(code)
            continue
        for placeholder, url in urls.items():
            code = code.replace(placeholder, url)
        # Leading newlines: tracebacks show the line numbers of the page. Top-level await is
        # allowed, as in an asyncio REPL (python -m asyncio): such a block runs on a fresh
        # asyncio event loop of its own, as the reader's REPL would run it.
        compiled = compile("\n" * line + code, str(page), "exec", flags=TOP_LEVEL_AWAIT)
        result = eval(compiled, namespace)
        if compiled.co_flags & inspect.CO_COROUTINE:
            anyio.run(_awaited, result, backend="asyncio")


async def _awaited(coroutine: Coroutine[Any, Any, object]) -> object:
    return await coroutine


class _Shell:
    """Runs a page's shell blocks one after the other, as a reader pastes them in a terminal."""

    def __init__(self, cwd: Path, urls: dict[str, str]) -> None:
        self.cwd = cwd
        self.urls = urls
        self.exports: list[str] = []
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PRODUCERKIT_DEV_STATE": str(cwd / "dev.json"),
        }
        for name in ("PRODUCERKIT_URL", "PRODUCERKIT_TOPIC"):
            self.env.pop(name, None)

    def script(self, code: str, interrupt: bool = False) -> str:
        for placeholder, url in self.urls.items():
            code = code.replace(placeholder, url)
        code = code.replace("--metrics-port 9464", "--metrics-port 0")  # any free port
        lines = [line for line in code.splitlines() if not line.lstrip().startswith("pip install")]
        if interrupt:
            # As an interactive shell does: Ctrl-C ends the pipeline, not the shell, which then
            # exits with the last command's status (producerkit's, not tail's).
            head, tail = ["trap : INT"], ['exit "${PIPESTATUS[${#PIPESTATUS[@]}-1]}"']
        else:
            head, tail = ["set -euo pipefail"], []
        script = "\n".join([*head, *self.exports, *lines, *tail])
        self.exports += [line for line in lines if line.startswith("export ")]
        return script

    def run(self, code: str, where: str, interrupt: bool = False) -> None:
        script = self.script(code, interrupt)
        if interrupt:
            self._run_until_interrupted(script, where)
            return
        result = subprocess.run(
            ["bash", "-c", script],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, f"{where} failed as pasted:\n{result.stderr}"

    def _run_until_interrupted(self, script: str, where: str) -> None:
        """Ctrl-C as a terminal sends it: SIGINT to the pipeline's process group."""
        process = subprocess.Popen(
            ["bash", "-c", script],
            cwd=self.cwd,
            env=self.env,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert process.stderr is not None
        try:
            seen = ""
            while "metrics on http" not in seen and process.poll() is None:
                seen += process.stderr.readline()
            os.killpg(process.pid, signal.SIGINT)
            seen += process.stderr.read()
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        assert process.returncode == 130, f"{where}: Ctrl-C gave {process.returncode}:\n{seen}"
        assert "interrupted" in seen and "Traceback" not in seen, seen

    def stop_dev_brokers(self) -> None:
        """What a failed block left running under ``producerkit dev --detach``."""
        if (self.cwd / "dev.json").exists():
            subprocess.run(
                ["producerkit", "dev", "stop"], env=self.env, capture_output=True, timeout=60
            )


TEST_FILE = "python test-file"


def _defines_tests(code: str) -> bool:
    """Whether ``code`` defines a top-level test function (it looks like a test file)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:  # top-level await: not a module a test file could be
        return "def test_" in code
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
        for node in tree.body
    )


TEST_FILE_PAGES = [p for p in PAGES if p.exists() and any(i == TEST_FILE for i, _, _ in blocks(p))]


@pytest.mark.parametrize("page", TEST_FILE_PAGES, ids=page_id)
def test_test_files_run_as_test_files(page: Path, tmp_path: Path) -> None:
    """Each ```python test-file block of the page, saved as a test file, passes under pytest
    (one inner run for the page: its brokers start once), as the reader runs it."""
    files = []
    for info, code, line in blocks(page):
        if info == TEST_FILE:
            path = tmp_path / f"test_{page.stem}_line_{line}.py"
            path.write_text(code)
            files.append(path)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # none of this repository's settings
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRODUCERKIT_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-p", "no:xdist", "-rfEs", *map(str, files)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, f"{page_id(page)}'s test files failed:\n{result.stdout[-6000:]}"
    assert "passed" in summary and "skipped" not in summary, result.stdout[-3000:]


def _spark_available() -> bool:
    return importlib.util.find_spec("pyspark") is not None and shutil.which("java") is not None


@pytest.mark.parametrize("page", [p for p in PAGES if p.exists()], ids=page_id)
def test_other_blocks_are_valid(page: Path) -> None:
    for info, code, line in blocks(page):
        where = f"{page_id(page)}:{line}"
        words = info.split()
        language = words[0] if words else ""
        if language == "python" and words[1:] == ["notest"]:
            compile(code, where, "exec", flags=TOP_LEVEL_AWAIT)
        elif info == "python":
            assert not _defines_tests(code), (
                f"{where}: a block that defines test functions is a test file: fence it "
                "```python test-file (run as one) or ```python notest"
            )
        elif info == TEST_FILE:
            compile(code, where, "exec")  # a module: no top-level await
        elif language in ("bash", "console", "sh", "shell"):
            for command in _commands(code):
                _parse_command(command, where)
        elif language == "toml":
            tomllib.loads(code)


def _commands(code: str) -> list[list[str]]:
    """``producerkit ...`` command lines of a shell block, continuation lines joined."""
    text = code.replace("\\\n", " ")
    commands = []
    for raw in text.splitlines():
        line = raw.strip().removeprefix("$ ")
        # `python -m producerkit` is the same command
        line = re.sub(r"^python3? -m producerkit\b", "producerkit", line)
        line = line.split(" #", 1)[0].strip()
        if line.startswith("producerkit ") or line == "producerkit":
            commands.append(shlex.split(line)[1:])
    return commands


def _parse_command(argv: list[str], where: str) -> None:
    from producerkit import cli
    from producerkit.cli import dev, produce

    if not argv or argv[0].startswith("-"):
        return
    name, rest = argv[0], argv[1:]
    assert name in cli._COMMANDS, f"{where}: unknown command producerkit {name}"
    parsers: dict[str, argparse.ArgumentParser] = {
        "produce": produce.build_parser(),
        "dev": dev.build_parser(),
    }
    parser = parsers.get(name)
    if parser is None:
        # Commands that expose no parser: --help must work, and that is all we can check.
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                code = cli.main([name, "--help"])
            except SystemExit as exc:
                code = exc.code  # type: ignore[assignment]
        assert code in (0, None), f"{where}: producerkit {name} --help failed"
        return
    try:
        parser.parse_args(rest)
    except SystemExit as exc:
        raise AssertionError(f"{where}: producerkit {' '.join(argv)} does not parse") from exc


def test_quickstart_example_runs() -> None:
    """examples/quickstart.py needs no broker (memory://)."""
    env = {k: v for k, v in os.environ.items() if k != "PRODUCERKIT_URL"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "acked=10001, failed=0" in result.stdout


def _defines(code: str) -> set[str]:
    """The names a block's top level defines (functions, classes)."""
    tree = ast.parse(code)
    defined = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {node.name for node in tree.body if isinstance(node, defined)}


def _uses(code: str, names: set[str]) -> bool:
    """Whether a block names any of ``names``."""
    if not names:
        return False
    tree = ast.parse(code)
    return any(isinstance(node, ast.Name) and node.id in names for node in ast.walk(tree))
