"""Every example in examples/ runs as its docstring says to run it.

Each example's docstring lists its command lines (``python examples/NAME.py``, with
``PRODUCERKIT_URL=...`` before it for a broker); each line is run here as pasted, from the
repository root, the broker addresses (``kafka://127.0.0.1:9092``, ``127.0.0.1:4222``) replaced
by the session brokers'. ``pip``, ``curl`` and ``producerkit dev`` lines are the reader's setup:
the venv is the install and the session brokers are running. The service is driven with the
request its docstring shows, and the pytest example runs as a test file of a project of its own.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import read_jetstream, read_kafka

import producerkit as pk

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
KAFKA, NATS = "kafka://127.0.0.1:9092", "127.0.0.1:4222"

#: What each script prints when it did all it should.
PRINTS = {
    "quickstart.py": "acked=10001, failed=0",
    "sync_script.py": "acked=10000, failed=0",
    "produce_batch.py": "acked=20000, failed=0",
    "retry_queue.py": "1000 acked, 0 retried, 0 dead letters",
    "atomic_batch.py": "order 7 stored whole: 3 messages acked",
}
SERVICE, PYTEST_EXAMPLE = "aiohttp_service.py", "test_with_faults.py"
SETUP = ("pip ", "curl ", "producerkit ")


def commands(name: str) -> list[str]:
    """The command lines of an example's docstring (its indented lines naming it)."""
    doc = ast.get_docstring(ast.parse((EXAMPLES / name).read_text())) or ""
    return [
        line.strip()
        for line in doc.splitlines()
        if line.startswith("    ") and not line.strip().startswith(SETUP) and name in line
    ]


#: The inner pytest's options: no cache, and the file's order (pytest-randomly, installed for
#: scripts/flakes.py, would shuffle it).
INNER_RUN = ("-p", "no:cacheprovider", "-p", "no:randomly")


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PRODUCERKIT_")}


def as_pasted(line: str, request: pytest.FixtureRequest) -> tuple[list[str], dict[str, str]]:
    """``line``'s argv and environment, on the session brokers."""
    if KAFKA in line:
        line = line.replace(KAFKA, request.getfixturevalue("kafka_broker").url)
    if NATS in line:
        line = line.replace(NATS, request.getfixturevalue("nats_broker").host_port)
    words = shlex.split(line)
    env = _environment()
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if words[0] == "python":
        words[0] = sys.executable
    elif words[0] == "pytest":
        words[:1] = [sys.executable, "-m", "pytest"]
    return words, env


def test_every_example_is_run_here() -> None:
    names = {path.name for path in EXAMPLES.glob("*.py")} - {"tuning.py"}  # a benchmark
    assert names == {*PRINTS, SERVICE, PYTEST_EXAMPLE}
    for name in names:
        assert commands(name), f"examples/{name}: no command line in its docstring"


@pytest.mark.parametrize(
    ("name", "line"),
    [(name, line) for name in PRINTS if name != "atomic_batch.py" for line in commands(name)],
)
def test_the_example_runs(name: str, line: str, request: pytest.FixtureRequest) -> None:
    argv, env = as_pasted(line, request)
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert PRINTS[name] in result.stdout, result.stdout + result.stderr


@pytest.mark.anyio
async def test_the_atomic_batch_example_stores_the_order_whole(
    nats_broker: Any, request: pytest.FixtureRequest
) -> None:
    """Run as pasted, then read back: the committed batch's 3 messages, the refund none."""
    (line,) = commands("atomic_batch.py")
    argv, env = as_pasted(line, request)
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert PRINTS["atomic_batch.py"] in result.stdout, result.stdout + result.stderr
    stored = await read_jetstream(nats_broker.jetstream_url, "sales.7.>", 2)
    assert [record["subject"] for record in stored][-2:] == ["sales.7.lines"] * 2
    assert not any(record["subject"] == "sales.7.refunds" for record in stored)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _post(url: str, body: bytes) -> tuple[int, dict[str, Any] | str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.parametrize("line", commands(SERVICE))
def test_the_service_publishes_per_request(line: str, request: pytest.FixtureRequest) -> None:
    """Started as pasted; the docstring's request, and a bad one; Ctrl-C stops it cleanly."""
    pytest.importorskip("aiohttp")
    argv, env = as_pasted(line, request)
    port = _free_port()
    env["PORT"] = str(port)
    service = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert service.poll() is None, service.communicate()[0]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the service did not listen within 30 s"
                time.sleep(0.1)
        (curl,) = [line for line in _docstring_lines(SERVICE) if line.startswith("curl ")]
        words = shlex.split(curl)
        address, body = words[-3].replace(":8080", f":{port}"), words[-1].encode()
        status, stored = _post(f"http://{address}", body)
        assert status == 201, stored
        assert isinstance(stored, dict) and stored["topic"] == "orders", stored
        assert stored["offset"] is not None
        status, answer = _post(f"http://{address}", b"not json")
        assert status == 400, answer
    finally:
        service.send_signal(signal.SIGINT)
        output = service.communicate(timeout=30)[0]
    assert service.returncode == 0, output


def _docstring_lines(name: str) -> list[str]:
    doc = ast.get_docstring(ast.parse((EXAMPLES / name).read_text())) or ""
    return [line.strip() for line in doc.splitlines() if line.startswith("    ")]


def test_the_pytest_example_passes_in_a_project_of_its_own(tmp_path: Path) -> None:
    """As a user's test file: copied into an empty project and run with pytest there, so the
    plugin comes from its entry point and nothing of this repository's configuration applies."""
    (line,) = commands(PYTEST_EXAMPLE)
    assert line == f"pytest examples/{PYTEST_EXAMPLE}"
    shutil.copy(EXAMPLES / PYTEST_EXAMPLE, tmp_path / PYTEST_EXAMPLE)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", PYTEST_EXAMPLE, "-q", *INNER_RUN],
        cwd=tmp_path,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout, result.stdout


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{Path(name).stem}", EXAMPLES / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.anyio
@pytest.mark.brokers
@pytest.mark.parametrize("backend", ["kafka", "jetstream"])
async def test_the_retry_queue_delivers_what_a_blackhole_failed(
    backend: str, request: pytest.FixtureRequest, topic: str
) -> None:
    """examples/retry_queue.py's RetryQueue, through a blackhole longer than the timeout: every
    message lost in it fails, is queued and produced again once the link is back."""
    retries = _load("retry_queue.py").RetryQueue(attempts=4, pause=0.5)
    broker = request.getfixturevalue(f"{'kafka' if backend == 'kafka' else 'nats'}_broker")
    url = broker.faulty_url if backend == "kafka" else broker.faulty_jetstream_url
    options = {"create_stream": True} if backend == "jetstream" else {}
    count = 100
    async with pk.Producer(url, topic=topic, timeout=1, on_delivery=retries, **options) as producer:
        await producer.produce(b"warm-up", context=1)
        broker.faults.blackhole(1.5)
        for i in range(count):
            await producer.produce(b"%d" % i, msg_id=f"m-{i}", nonblocking=True, context=1)
        await retries.drain(producer)
        stats = producer.stats
    assert retries.dead == []
    assert retries.retried >= count  # each lost in the blackhole, at least once
    assert retries.acked == stats.acked == count + 1
    if backend == "kafka":
        values = {record["value"] for record in await read_kafka(broker.url, topic, count + 1)}
    else:  # one copy per msg_id
        stored = await read_jetstream(broker.jetstream_url, topic, count + 1)
        assert len(stored) == count + 1
        values = {record["value"] for record in stored}
    assert values == {b"warm-up", *(b"%d" % i for i in range(count))}
