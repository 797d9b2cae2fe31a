"""Whether a JetStream topic is written with fast ingest, and why not, shows in the log once per
producer and topic, and in ``producerkit bench``'s output and JSON (an existing stream without
``allow_batched`` stays per message: that is said, not left to guess)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ON_THE_PUBLIC_PATH

import producerkit as pk
from producerkit.bench.report import final_lines
from producerkit.cli import bench as bench_command
from producerkit.testing.pytest_plugin import NatsSessionBroker

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        ON_THE_PUBLIC_PATH,
        reason="fast batches are written on producerkit's own path only",
    ),
]


@pytest.fixture
async def plain_nats(nats_broker: NatsSessionBroker) -> AsyncIterator[Any]:
    import nats

    client = await nats.connect(nats_broker.url)
    try:
        yield client
    finally:
        await client.close()


def _modes_logged(caplog: pytest.LogCaptureFixture, topic: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "producerkit.nats"
        and "is written with" in record.getMessage()
        and repr(topic) in record.getMessage()
    ]


async def test_a_stream_without_allow_batched_is_said_once_per_producer(
    nats_broker: NatsSessionBroker, plain_nats: Any, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    await plain_nats.jetstream().add_stream(name=topic, subjects=[topic])
    caplog.set_level(logging.INFO, logger="producerkit.nats")
    async with pk.Producer(nats_broker.jetstream_url, topic=topic, connections=2) as producer:
        for number in range(20):
            await producer.produce(b"%d" % number)
        await producer.flush()
        assert producer.backend.topic_modes[topic].startswith("per message: ")
    (line,) = _modes_logged(caplog, topic)
    assert "does not allow fast batches (allow_batched" in line


async def test_a_topic_with_fast_ingest_is_said_once(
    nats_broker: NatsSessionBroker, plain_nats: Any, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    await plain_nats.jetstream().add_stream(name=topic, subjects=[topic], allow_batched=True)
    caplog.set_level(logging.INFO, logger="producerkit.nats")
    async with pk.Producer(nats_broker.jetstream_url, topic=topic, connections=2) as producer:
        await producer.produce(b"x")
        assert producer.backend.topic_modes == {topic: "fast ingest"}
    (line,) = _modes_logged(caplog, topic)
    assert line.endswith("written with fast ingest")
    async with pk.Producer(
        f"{nats_broker.jetstream_url}?fast_ingest=false", topic=topic
    ) as producer:
        await producer.produce(b"y")
        assert producer.backend.topic_modes == {topic: "per message: fast_ingest=False"}


async def test_the_bench_says_whether_its_topic_used_fast_ingest(
    nats_broker: NatsSessionBroker,
    plain_nats: Any,
    topic: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import anyio.to_thread

    await plain_nats.jetstream().add_stream(name=topic, subjects=[topic])
    out = tmp_path / "result.json"
    argv = [
        *("--url", nats_broker.jetstream_url, "--topic", topic, "--num-records", "200"),
        *("--rate", "2000", "--warmup-records", "10", "--json", str(out)),
    ]
    assert await anyio.to_thread.run_sync(bench_command.main, argv) == 0
    result = json.loads(out.read_text())
    assert result["fast_ingest"] is False
    assert "allow_batched" in result["topic_modes"][topic]
    assert f"topic         {topic!r} written with per message: " in capsys.readouterr().out


def test_the_bench_report_prints_each_topics_mode() -> None:
    result: dict[str, Any] = {
        "summary": {"sent": 1, "acked": 1, "failed": 0, "unacknowledged": 0,
                    "throughput_msgs": 1.0, "throughput_mb": 0.0, "elapsed_s": 1.0},
        "percentiles": {},
        "topic_modes": {"orders": "fast ingest"},
    }  # fmt: skip
    result["percentiles"] = {m: {} for m in ("errors", *_measures())}
    assert "  topic         'orders' written with fast ingest." in final_lines(result)


def _measures() -> tuple[str, ...]:
    from producerkit.bench.report import MEASURES

    return tuple(MEASURES)
