"""The client libraries' repeated log lines go through producerkit's rate limit: aiokafka logs
``Unable connect to ...`` at ERROR on every failed attempt; with the filter installed, each kind
of line appears at most once per interval, with the count of those held back."""

from __future__ import annotations

import ast
import logging
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import producerkit as pk
from producerkit import _logging
from producerkit.testing.brokers import free_port

pytestmark = pytest.mark.anyio

UNABLE = re.compile(r"^Unable connect to .*?(?: \((\d+) more like this in [\d.]+s\))?$")


@pytest.fixture(autouse=True)
def no_filter() -> Iterator[None]:
    """Each test starts with no filter installed (and producers kept from adding one: a test
    that wants it says so), and ends with the default a producer installs."""
    pk.route_client_logs(False)
    yield
    pk.route_client_logs()


async def connect_attempts(seconds: float, then_after: float = 0.0) -> int:
    """Start a producer against a closed port again and again for ``seconds`` (and once more
    ``then_after`` seconds later): each attempt is refused, and aiokafka logs an ERROR line."""
    url = f"kafka://127.0.0.1:{free_port()}"

    async def attempt() -> None:
        with pytest.raises(pk.BrokerUnavailable):
            async with pk.Producer(url, topic="t", timeout=5):
                pass

    attempts = 0
    deadline = time.monotonic() + seconds
    while attempts == 0 or time.monotonic() < deadline:
        await attempt()
        attempts += 1
        await anyio.sleep(0.02)
    if then_after:
        await anyio.sleep(then_after)
        await attempt()
        attempts += 1
    return attempts


def unable_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "aiokafka" and r.getMessage().startswith("Unable connect")
    ]


async def test_failed_connects_are_collapsed_with_counts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aiokafka")
    pk.route_client_logs(interval=0.5)
    # the last attempt comes an interval after the others: its line counts all held back
    attempts = await connect_attempts(1.7, then_after=0.5)
    lines = unable_lines(caplog)
    assert attempts >= 20, attempts
    assert 3 <= len(lines) <= 6, lines
    matches = [UNABLE.match(line) for line in lines]
    assert all(matches), lines
    assert matches[0] is not None and matches[0][1] is None  # the first one says nothing more
    held = [int(m[1]) for m in matches if m is not None and m[1]]
    assert len(lines) + sum(held) == attempts, (attempts, lines)


async def test_without_the_filter_every_attempt_is_a_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="aiokafka")
    pk.route_client_logs(False)
    _logging.install_default()  # what a producer's start does: the application said no
    attempts = await connect_attempts(0.3)
    assert len(unable_lines(caplog)) == attempts


def test_the_filter_counts_per_kind_and_leaves_debug_alone() -> None:
    records: list[logging.LogRecord] = []
    log = logging.getLogger("aiokafka.test-only")
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.DEBUG)
    repeat = _logging.RepeatFilter(interval=60)
    log.addFilter(repeat)
    try:
        for port in range(5):
            log.error('Unable connect to "%s:%s": %s', "h", port, "refused")
            log.debug("attempt %d", port)
        log.warning("something else")
        try:
            raise OSError("boom")
        except OSError:
            log.exception("nats: encountered error")
            log.exception("nats: encountered error")
        try:
            raise ValueError("other")
        except ValueError:
            log.exception("nats: encountered error")
        repeat.interval = 0  # the interval is over: the next line carries the count
        log.error('Unable connect to "%s:%s": %s', "h", 9, "refused")
    finally:
        log.removeHandler(handler)
        log.removeFilter(repeat)
    messages = [r.getMessage() for r in records]
    assert messages == [
        'Unable connect to "h:0": refused',
        "attempt 0",
        "attempt 1",
        "attempt 2",
        "attempt 3",
        "attempt 4",
        "something else",
        "nats: encountered error",
        "nats: encountered error",
        'Unable connect to "h:9": refused (4 more like this in 0.0s)',
    ]
    assert [r.exc_info[0] for r in records if r.exc_info] == [OSError, ValueError]


def test_the_filter_is_on_every_client_logger() -> None:
    pk.route_client_logs()
    for name in ("aiokafka", "aiokafka.conn", "aiokafka.producer.sender", "nats.aio.client"):
        assert any(isinstance(f, _logging.RepeatFilter) for f in logging.getLogger(name).filters)
    pk.route_client_logs(False)
    for name in ("aiokafka", "aiokafka.conn", "nats.aio.client"):
        assert logging.getLogger(name).filters == []


def test_a_producer_installs_the_filter_on_start() -> None:
    """In a fresh interpreter (no filter yet, none declined): starting a producer adds it."""
    code = textwrap.dedent(
        """
        import logging
        import anyio
        import producerkit as pk
        from producerkit._logging import RepeatFilter

        def installed():
            return any(isinstance(f, RepeatFilter) for f in logging.getLogger("aiokafka").filters)

        async def main():
            assert not installed()
            async with pk.Producer("null://", topic="t"):
                pass
            assert installed()

        anyio.run(main)
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_library_prints_nothing() -> None:
    """No print() call in library code: only the CLI and the bench write to stdout (a
    docstring's example may show one; it is not code)."""
    root = Path(pk.__file__).parent
    calls = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] in ("cli", "bench"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                calls.append(f"{path.relative_to(root)}:{node.lineno}")
    assert calls == []
