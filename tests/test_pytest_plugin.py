"""producerkit's pytest plugin as a user meets it: a test suite of its own, run by pytest in a
subprocess (the plugin loaded through its entry point), with real brokers and their faults."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from producerkit.testing import pytest_plugin
from producerkit.testing.pytest_plugin import NatsSessionBroker, SessionBroker

pytest_plugins = ["pytester"]

DOCS = Path(__file__).resolve().parent.parent / "docs" / "testing.md"

#: The inner runs' options: no cache, and the file's order (pytest-randomly, where installed for
#: scripts/flakes.py, would shuffle it; the inner suites' tests build on each other, e.g. the
#: second checks what the first left behind).
USER_RUN = ("-p", "no:cacheprovider", "-p", "no:randomly")


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pytest each test runs is a user's plain run, also when this suite runs in
    pytest-xdist workers (CI's extra runs): without this it inherits PYTEST_XDIST_WORKER, and
    pytest-benchmark then takes itself for an xdist worker and disables every benchmark."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


def docs_example(section: str = "## A complete example") -> str:
    """The first python block of a section of docs/testing.md (tagged or not: ```python
    test-file)."""
    text = DOCS.read_text().split(f"\n{section}\n", 1)[1]
    block = re.search(r"^```python[^\n]*\n(.*?)^```", text, re.M | re.S)
    assert block is not None, f"no python block under {section!r}"
    return block.group(1)


def test_docs_example_writes_msgs_per_s_to_json(pytester: pytest.Pytester) -> None:
    """The docs' example, as a user's test file: each benchmark's msgs/s and ack latencies in
    the pytest-benchmark JSON."""
    pytester.makepyfile(test_throughput=docs_example())
    result = pytester.runpytest_subprocess("--benchmark-json=out.json", *USER_RUN)
    result.assert_outcomes(passed=3)
    report = json.loads((pytester.path / "out.json").read_text())
    extra = {bench["name"]: bench["extra_info"] for bench in report["benchmarks"]}
    assert set(extra) == {
        "test_kafka_throughput",
        "test_jetstream_throughput",
        "test_my_own_loop",
    }
    for info in extra.values():
        assert info["msgs_per_s"] > 0
        assert 0 < info["ack_latency_ms"]["p50"] <= info["ack_latency_ms"]["p99.9"]
    assert extra["test_kafka_throughput"]["messages_per_round"] == 2_000
    assert extra["test_my_own_loop"]["rounds"] == 3


def test_session_brokers(kafka_broker: SessionBroker, nats_broker: NatsSessionBroker) -> None:
    assert kafka_broker.url == f"kafka://127.0.0.1:{kafka_broker.port}"
    assert nats_broker.url == f"nats://{nats_broker.host_port}"
    assert nats_broker.jetstream_url == f"jetstream://127.0.0.1:{nats_broker.port}"
    kafka_proxy, nats_proxy = kafka_broker.faults.host_port, nats_broker.faults.host_port
    assert kafka_broker.faulty_url == f"kafka://{kafka_proxy}" != kafka_broker.url
    assert nats_broker.faulty_url == f"nats://{nats_proxy}"
    assert nats_broker.faulty_jetstream_url == f"jetstream://{nats_proxy}"
    assert kafka_broker.faults is kafka_broker.faults


def test_plugin_is_inert_for_a_suite_that_uses_none_of_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_plain="""
        import sys

        def test_plain(request):
            assert request.config.pluginmanager.hasplugin("producerkit")
            for heavy in ("aiokafka", "nats", "producerkit.testing.brokers"):
                assert heavy not in sys.modules, heavy
        """
    )
    result = pytester.runpytest_subprocess(*USER_RUN)
    result.assert_outcomes(passed=1)
    hooks = [name for name in vars(pytest_plugin) if name.startswith("pytest_")]
    assert hooks == ["pytest_runtest_teardown"]


def test_docs_fault_example_loses_nothing(pytester: pytest.Pytester) -> None:
    """The fault injection example of docs/testing.md, as a user's test file."""
    pytester.makepyfile(test_stalls=docs_example("## Fault injection"))
    result = pytester.runpytest_subprocess(*USER_RUN)
    result.assert_outcomes(passed=1)


LEAVES_FAULTS = """
import time

def test_leaves_faults_on(kafka_broker, nats_broker):
    kafka_broker.faults.stall(60)
    kafka_broker.faults.set_rtt(100)
    nats_broker.faults.refuse(60)
    nats_broker.faults.kill()

def test_finds_them_cleared(kafka_broker, nats_broker):
    for broker in (kafka_broker, nats_broker):
        assert broker.faults.log.active() == ()
        assert broker.faults.rtt_ms == 0
        assert broker.local.running
    modes = [window.mode for window in nats_broker.faults.log.windows()]
    assert modes == ["refuse", "kill"]

def test_the_links_work(kafka_broker, nats_broker):
    import socket
    for broker in (kafka_broker, nats_broker):
        host, port = broker.faults.host_port.split(":")
        socket.create_connection((host, int(port)), timeout=5).close()
"""


def test_faults_are_cleared_after_each_test(pytester: pytest.Pytester) -> None:
    """The session brokers are shared: a fault (a kill included) a test leaves on is gone by
    the next test."""
    pytester.makepyfile(test_faults_left=LEAVES_FAULTS)
    result = pytester.runpytest_subprocess(*USER_RUN)
    result.assert_outcomes(passed=3)


PRIVATE_BROKERS = """
def test_private_brokers(private_kafka_broker, private_nats_broker, kafka_broker):
    assert private_kafka_broker.port != kafka_broker.port
    private_nats_broker.faults.kill()
    assert not private_nats_broker.local.running
    private_nats_broker.faults.restart()
    assert private_nats_broker.local.running
    assert private_nats_broker.faults.log.active() == ()
    test_private_brokers.seen = (private_kafka_broker.local, private_nats_broker.local)

def test_stopped_after_the_test():
    for local in test_private_brokers.seen:
        assert not local.running
"""


def test_private_brokers_live_for_one_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_private=PRIVATE_BROKERS)
    result = pytester.runpytest_subprocess(*USER_RUN)
    result.assert_outcomes(passed=2)


KAFKA_CLUSTER_PER_TEST = """
import pytest

def test_takes_a_broker_down(kafka_cluster):
    kafka_cluster.broker_down(2)
    test_takes_a_broker_down.seen = kafka_cluster

def test_gets_a_cluster_of_its_own(kafka_cluster):
    first = test_takes_a_broker_down.seen
    assert first.closed and not kafka_cluster.closed
"""


def test_kafka_cluster_is_started_for_each_test(pytester: pytest.Pytester) -> None:
    """The mock grants producer ids at random without checking they are free: one cluster per
    test, closed after it, so no test inherits the ids (or the brokers down) of another."""
    pytest.importorskip("confluent_kafka")
    pytester.makepyfile(test_per_test=KAFKA_CLUSTER_PER_TEST)
    result = pytester.runpytest_subprocess(*USER_RUN)
    result.assert_outcomes(passed=2)


ROUND_DELAY = """
import asyncio, os

def test_rounds(produce_benchmark):
    delay = float(os.environ["ROUND_DELAY"])
    produce_benchmark.async_(lambda: asyncio.sleep(delay), messages=1, rounds=3)
"""


def test_compare_fail_catches_a_slower_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_rounds=ROUND_DELAY)
    storage = f"--benchmark-storage={pytester.path / 'saved'}"
    monkeypatch.setenv("ROUND_DELAY", "0.01")
    pytester.runpytest_subprocess(storage, "--benchmark-save=base").assert_outcomes(passed=1)
    assert list(Path(pytester.path / "saved").rglob("*_base.json"))
    monkeypatch.setenv("ROUND_DELAY", "0.2")
    slower = pytester.runpytest_subprocess(
        storage, "--benchmark-compare", "--benchmark-compare-fail=median:50%"
    )
    assert slower.ret != 0
    assert "Performance has regressed" in "\n".join(slower.outlines + slower.errlines)
    monkeypatch.setenv("ROUND_DELAY", "0.01")
    same = pytester.runpytest_subprocess(
        storage, "--benchmark-compare", "--benchmark-compare-fail=median:1000%"
    )
    assert same.ret == 0


def test_produce_benchmark_refuses_a_running_loop(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_async="""
        import anyio
        import pytest
        import producerkit as pk

        @pytest.fixture
        def anyio_backend():
            return "asyncio"

        @pytest.mark.anyio
        async def test_inside_a_loop(produce_benchmark):
            sleeping = anyio.sleep(0)
            with pytest.raises(pk.ConfigurationError, match="plain def test"):
                produce_benchmark.run(sleeping)
            await sleeping
        """
    )
    pytester.runpytest_subprocess(*USER_RUN).assert_outcomes(passed=1)
