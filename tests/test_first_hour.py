"""What a new user trips on in the first hour (issue 39), each as the user met it."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import time
import tomllib
from pathlib import Path

import pytest
from conftest import read_jetstream

import producerkit as pk
from producerkit.testing.pytest_plugin import NatsSessionBroker

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalized (PEP 503)."""
    found = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert found is not None, requirement
    return re.sub(r"[-_.]+", "-", found[0]).lower()


def test_the_pytest_extra_brings_what_docs_testing_uses() -> None:
    """docs/testing.md says ``pip install "producerkit[pytest]"`` is all a user needs; its
    examples then failed with MissingDependencyError: the extra brought no broker client. It
    installs the kafka and nats extras' requirements (the clients of the backends its brokers
    serve), and a distribution for every module its runnable examples import."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    missing = [r for r in [*extras["kafka"], *extras["nats"]] if r not in extras["pytest"]]
    assert not missing, f"the pytest extra lacks {missing}"

    page = (ROOT / "docs" / "testing.md").read_text()
    assert 'pip install "producerkit[pytest]"' in page
    code = re.findall(r"^```python(?: test-file)?\n(.*?)^```", page, re.MULTILINE | re.DOTALL)
    modules = {
        name.split(".")[0]
        for block in code
        for node in ast.walk(ast.parse(block))
        for name in (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    assert {"producerkit", "aiokafka"} <= modules, modules
    installed = {_name(r) for r in [*project["dependencies"], *extras["pytest"]]}
    distributions = importlib.metadata.packages_distributions()
    for module in modules - {"producerkit"}:
        names = {_name(d) for d in distributions.get(module, [])}
        assert names & installed, f"docs/testing.md imports {module} ({names}): not installed"


async def test_jetstream_stream_lookup_lost_in_a_blackhole_is_asked_again(
    nats_broker: NatsSessionBroker, topic: str
) -> None:
    """The user's test as docs/testing.md teaches it: a 2 s blackhole before the first produce
    loses the stream lookup (and the stream's creation); it is asked again, and every message
    is acked once the blackhole has ended, well within its timeout."""
    acked: set[bytes] = set()

    def on_delivery(result: pk.Delivery | pk.Failure, value: bytes) -> None:
        if isinstance(result, pk.Delivery):
            acked.add(value)

    async with pk.Producer(
        nats_broker.faulty_jetstream_url,
        topic=topic,
        timeout=15,
        create_stream=True,
        on_delivery=on_delivery,
    ) as producer:
        nats_broker.faults.blackhole(2.0)
        started = time.monotonic()
        for i in range(200):
            value = b"order-%d" % i
            await producer.produce(
                value, key=b"user-%d" % (i % 10), nonblocking=True, context=value
            )
        await producer.flush()  # raises ProduceError if any message failed
        elapsed = time.monotonic() - started
        stats = producer.stats
    assert stats.acked == stats.produced == 200
    assert len(acked) == 200
    assert elapsed < 12, elapsed  # asked again soon after the blackhole, not at the deadline
    stored = {
        record["value"] for record in await read_jetstream(nats_broker.jetstream_url, topic, 200)
    }
    assert acked <= stored


async def test_a_refused_stream_creation_is_not_asked_again(
    nats_broker: NatsSessionBroker, topic: str
) -> None:
    """Only a lookup lost on the way is asked again: a stream the server refuses to create (its
    name taken by a stream of other subjects) fails the produce at once, not at the timeout."""
    import nats

    client = await nats.connect(nats_broker.url)
    try:
        await client.jetstream().add_stream(name=topic, subjects=[f"other-{topic}"])
    finally:
        await client.close()
    async with pk.Producer(
        nats_broker.jetstream_url, topic=topic, timeout=10, create_stream=True
    ) as producer:
        started = time.monotonic()
        with pytest.raises(pk.DeliveryError):
            await producer.produce(b"refused")
        assert time.monotonic() - started < 3
