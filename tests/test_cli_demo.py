"""``producerkit demo``: progress while it runs, its suggestion, and its accounting, on the
session brokers (the demo's own start_kafka/start_nats are swapped for them)."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import pytest

from producerkit.cli import demo
from producerkit.testing.pytest_plugin import SessionBroker


@pytest.fixture
def brokers(
    monkeypatch: pytest.MonkeyPatch, kafka_broker: SessionBroker, nats_broker: SessionBroker
) -> None:
    @contextlib.contextmanager
    def kafka() -> Iterator[types.SimpleNamespace]:
        yield types.SimpleNamespace(url=kafka_broker.url)

    @contextlib.contextmanager
    def nats(jetstream: bool) -> Iterator[types.SimpleNamespace]:
        yield types.SimpleNamespace(url=nats_broker.jetstream_url)

    monkeypatch.setattr(demo, "start_kafka", kafka)
    monkeypatch.setattr(demo, "start_nats", nats)


def test_demo_over_a_wan_shows_progress_and_counts_only_the_timed_messages(
    brokers: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --rtt-ms 10 each phase says what it sends and, while it runs, how far it got (the
    demo was silent for 50 of its 53 s); it does not suggest --rtt-ms 10 again; and its
    accounting is the timed messages' (the untimed warm-up message made it produced=50001)."""
    monkeypatch.setattr(demo, "PROGRESS_EVERY", 0.2)
    argv = ["--rtt-ms", "10", "--sync-messages", "60", "--nonblocking-messages", "2000"]
    assert demo.main(argv) == 0
    out = capsys.readouterr().out
    for backend in ("kafka", "jetstream"):
        assert f"{backend}: sending 60 messages one at a time ..." in out
        assert f"{backend}: sending 2,000 messages many at once ..." in out
        assert "of 60 sent one at a time in" in out  # 60 round trips of 10 ms: > 0.6 s
    assert out.count("produced=2000 acked=2000 failed=0") == 2, out
    assert "--rtt-ms 10" not in out


def test_demo_on_loopback_suggests_a_wan(brokers: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--sync-messages", "20", "--nonblocking-messages", "200"]) == 0
    out = capsys.readouterr().out
    assert "Try --rtt-ms 10" in out
    assert out.count("produced=200 acked=200 failed=0") == 2, out
