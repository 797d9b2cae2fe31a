"""``--metrics-port``: Prometheus metrics of ``producerkit produce`` and ``producerkit demo``,
scraped over HTTP while a run goes on and after it (``--metrics-linger``), against real brokers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from conftest import BackendCase

import producerkit as pk
from producerkit.testing.brokers import LocalBroker

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

from producerkit.cli.metrics import LATENCY_BUCKETS, Metrics

pytestmark = pytest.mark.anyio

CLI = [sys.executable, "-m", "producerkit"]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample of ``url``'s /metrics: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


class Running:
    """A CLI process whose stderr is collected line by line as it comes."""

    def __init__(self, argv: list[str], stdin: bool = False) -> None:
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.out: list[str] = []
        self._stderr = threading.Thread(target=self._read, args=(self.process.stderr, self.lines))
        self._stderr.start()
        threading.Thread(target=self._read, args=(self.process.stdout, self.out)).start()
        self.url = self.wait_for(r"metrics on (http://\S+)").group(1)

    @staticmethod
    def _read(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line)

    def wait_for(self, pattern: str, timeout: float = 120.0) -> re.Match[str]:
        """The first stderr line matching ``pattern``, waiting for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ended = not self._stderr.is_alive()  # every line is in, if it ended
            for line in list(self.lines):
                if match := re.search(pattern, line):
                    return match
            assert not ended, f"stderr ended without {pattern!r}: {''.join(self.lines)}"
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in {timeout} s: {''.join(self.lines)}")

    def until(self, check: Callable[[Samples], bool], timeout: float = 60.0) -> Samples:
        deadline = time.monotonic() + timeout
        while True:
            samples = scrape(self.url)
            if check(samples) or time.monotonic() > deadline:
                return samples
            time.sleep(0.1)

    def interrupt(self) -> int:
        """Ctrl-C ends the linger; the exit code is the run's."""
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=30)


@contextmanager
def running(argv: list[str], stdin: bool = False) -> Iterator[Running]:
    run = Running(argv, stdin)
    try:
        yield run
    finally:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()


def orders(start: int, stop: int) -> str:
    return "".join(
        json.dumps({"id": f"o-{i}", "user": f"u{i % 9}", "n": i}) + "\n" for i in range(start, stop)
    )


def test_a_ctrl_c_between_the_run_and_the_linger_ends_the_linger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a suite run found: ``produce --metrics-linger 60`` interrupted right after its
    summary, while asyncio was still shutting down (the run's signal handling gone, and asyncio
    leaving SIGINT raising KeyboardInterrupt wherever the main thread was), lost the signal and
    lingered its whole time. A signal after the run's own handling is kept for the linger, which
    then ends at once, and the exit code is the run's."""
    from producerkit.cli import _signals, produce

    source = tmp_path / "in.jsonl"
    source.write_text(orders(0, 10))
    real_linger = produce.linger
    lingered: list[float] = []

    def ctrl_c_then_linger(metrics: Metrics | None, seconds: float, stop: object = None) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):  # raising or killing would end the session
            handler = signal.getsignal(sig)
            assert isinstance(getattr(handler, "__self__", None), _signals.StopRequest), handler
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, as the run ends
        started = time.monotonic()
        real_linger(metrics, seconds, stop)  # type: ignore[arg-type]
        lingered.append(time.monotonic() - started)

    monkeypatch.setattr(produce, "linger", ctrl_c_then_linger)
    argv = [
        str(source), "--url", "memory://", "--topic", "t", "--format", "jsonl", "--no-progress",
        "--metrics-port", "0", "--metrics-linger", "60",
    ]  # fmt: skip
    assert produce.main(argv) == 0  # every record acked: the run's code, not an interrupt's
    assert lingered and lingered[0] < 10, lingered


def test_a_ctrl_c_that_ends_the_demo_ends_its_linger_too(monkeypatch: pytest.MonkeyPatch) -> None:
    from producerkit.cli import demo

    def interrupted(args: object, metrics: object) -> None:
        raise KeyboardInterrupt

    lingered: list[float] = []
    real_linger = demo.linger

    def linger(metrics: Metrics | None, seconds: float) -> None:
        lingered.append(seconds)
        real_linger(metrics, 0)  # the metrics server closed, as the real linger does

    monkeypatch.setattr(demo, "_run", interrupted)
    monkeypatch.setattr(demo, "linger", linger)
    with pytest.raises(KeyboardInterrupt):
        demo.main(["--metrics-port", "0", "--metrics-linger", "60"])
    assert lingered == [0]


def test_produce_metrics_while_running_and_after(nats_broker: LocalBroker) -> None:
    """Scraped mid-run (the input waits on a pipe) and after it: produced, acked, the latency
    histogram's count, records rejected before they were messages (an unparseable line, a
    message too large), and in flight back to zero."""
    topic = f"metrics-{uuid.uuid4().hex[:8]}"
    argv = [
        *CLI, "produce", "-", "--url", nats_broker.jetstream_url, "--topic", topic,
        "-o", "create_stream=true", "--format", "jsonl",
        "--key-field", "user", "--no-progress",
        "--metrics-port", "0", "--metrics-linger", "60",
    ]  # fmt: skip
    with running(argv, stdin=True) as run:
        assert run.process.stdin is not None
        assert run.url.startswith("http://127.0.0.1:")
        run.process.stdin.write(orders(0, 300))
        run.process.stdin.flush()
        mid = run.until(lambda s: value(s, "producerkit_messages_acked_total") >= 300)
        assert value(mid, "producerkit_messages_produced_total") == 300
        assert value(mid, "producerkit_messages_acked_total") == 300
        assert value(mid, "producerkit_ack_latency_seconds_count") == 300
        assert run.process.poll() is None  # still running, waiting for input

        big = json.dumps({"id": "big", "user": "u0", "pad": "x" * 2**21})  # > max_payload
        run.process.stdin.write(f"not json\n{big}\n{orders(300, 500)}")
        run.process.stdin.close()
        run.wait_for(r"^producerkit produce: ")  # the run is over; the server lingers
        after = scrape(run.url)
        assert run.interrupt() == 1  # two records failed
    counts = {
        name: value(after, f"producerkit_{name}")
        for name in ("messages_produced_total", "messages_acked_total", "messages_in_flight")
    }
    assert counts == {
        "messages_produced_total": 500,
        "messages_acked_total": 500,
        "messages_in_flight": 0,
    }
    assert value(after, "producerkit_records_rejected_total", reason="InvalidRecord") == 1
    assert value(after, "producerkit_records_rejected_total", reason="MessageTooLarge") == 1
    assert not [key for key in after if key[0] == "producerkit_messages_failed_total"]
    assert value(after, "producerkit_ack_latency_seconds_count") == 500
    assert value(after, "producerkit_ack_latency_seconds_bucket", le="+Inf") == 500
    assert 0 < value(after, "producerkit_ack_latency_seconds_sum") < 500 * 5
    assert value(after, "producerkit_messages_peak_in_flight") >= 1


def test_produce_metrics_count_failures_by_error(nats_broker: LocalBroker) -> None:
    """No stream for the subject: every message fails, counted under its error's name."""
    argv = [
        *CLI, "produce", "-", "--url", nats_broker.jetstream_url,
        "--topic", f"nostream-{uuid.uuid4().hex[:8]}", "--timeout", "5", "--no-progress",
        "--metrics-port", "0", "--metrics-linger", "60",
    ]  # fmt: skip
    with running(argv, stdin=True) as run:
        assert run.process.stdin is not None
        run.process.stdin.write("".join(f"m{i}\n" for i in range(20)))
        run.process.stdin.close()
        run.wait_for(r"^producerkit produce: ")
        after = scrape(run.url)
        assert run.interrupt() == 1
    assert value(after, "producerkit_messages_produced_total") == 20
    assert value(after, "producerkit_messages_acked_total") == 0
    assert value(after, "producerkit_messages_failed_total", error="DeliveryError") == 20
    assert value(after, "producerkit_ack_latency_seconds_count") == 0


@pytest.mark.brokers  # starts brokers of its own
def test_demo_metrics_add_up_over_its_four_producers() -> None:
    argv = [
        *CLI, "demo", "--sync-messages", "20", "--nonblocking-messages", "200",
        "--metrics-port", "0", "--metrics-linger", "60",
    ]  # fmt: skip
    with running(argv) as run:
        run.wait_for(r"metrics on")
        deadline = time.monotonic() + 180
        while not any("Try --rtt-ms" in line for line in run.out):
            assert time.monotonic() < deadline and run.process.poll() is None, "".join(run.lines)
            time.sleep(0.1)
        after = scrape(run.url)
        assert run.interrupt() == 0
    expected = 2 * (1 + 20) + 2 * (1 + 200)  # Kafka and JetStream, sync and nonblocking
    assert value(after, "producerkit_messages_produced_total") == expected
    assert value(after, "producerkit_messages_acked_total") == expected
    assert value(after, "producerkit_ack_latency_seconds_count") == expected


def test_latency_on_a_bound_is_in_that_bucket() -> None:
    """The hook alone, without HTTP: a latency on a bucket's bound is in that bucket (le)."""
    metrics = Metrics()
    settled = 0.5  # latencies 0.25 (a bound, exactly), 0.3 and 99.5
    metrics.observe(pk.Outcome((1, 2, 3), (0.25, 0.2, -99.0), settled, "t", 0, 0))
    metrics.observe(pk.Outcome((4,), (0.0,), settled, "t", 0, 0, error=pk.ProduceTimeout("x")))
    snapshot = metrics.snapshot()
    assert snapshot.acked == 3 and snapshot.failed == {"ProduceTimeout": 1}
    buckets = dict(zip((*LATENCY_BUCKETS, float("inf")), snapshot.latency_buckets, strict=True))
    assert {bound: count for bound, count in buckets.items() if count} == {
        0.25: 1,
        0.5: 1,
        float("inf"): 1,
    }
    assert snapshot.latency_sum == 0.25 + 0.3 + 99.5


async def test_every_snapshot_is_consistent(backend: BackendCase, topic: str) -> None:
    """produced == acked + failed + in_flight in every snapshot, taken from another thread (as
    the server's) while the producer runs, and after it."""
    checked = Metrics()
    seen = []
    async with pk.Producer(
        backend.url, topic=topic, on_outcome=checked.observe, timeout=10, **backend.options
    ) as producer:
        checked.attach(producer)
        for i in range(400):
            await producer.produce(b"x", nonblocking=True)
            if i % 100 == 0:
                seen.append(await anyio.to_thread.run_sync(checked.snapshot))
        await producer.flush()
    checked.detach()
    seen.append(checked.snapshot())
    for snapshot in seen:
        failed = sum(snapshot.failed.values())
        assert snapshot.produced == snapshot.acked + failed + snapshot.in_flight
    assert seen[-1].produced == seen[-1].acked == 400


def test_metrics_port_in_use_is_a_usage_error(tmp_path: Path) -> None:
    import socket

    source = tmp_path / "in.txt"
    source.write_text("a\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [*CLI, "produce", str(source), "--url", "null://", "--topic", "t"]
        result = subprocess.run(
            [*argv, "--metrics-port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr
