"""``producerkit dev``: foreground until Ctrl-C, and --detach / status / stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import producerkit as pk
from producerkit._cli_dev import _alive
from producerkit.brokers import free_port

CLI = [sys.executable, "-m", "producerkit", "dev"]


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    return _alive(pid)  # zombie-aware: an orphan nobody reaped yet is not running


def publish_one(url: str, **options: object) -> pk.Delivery | None:
    with pk.SyncProducer(url, topic="dev-check", timeout=20, **options) as producer:
        return producer.produce(b"hello")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PRODUCERKIT_DEV_STATE": str(tmp_path / "dev.json")}


def test_detach_status_stop(env: dict[str, str], tmp_path: Path) -> None:
    kafka_port, nats_port = free_port(), free_port()
    ports = ["--kafka-port", str(kafka_port), "--nats-port", str(nats_port)]
    started = subprocess.run(
        [*CLI, "kafka", "nats", "--detach", "--json", *ports],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert started.returncode == 0, started.stderr
        brokers = json.loads(started.stdout)["brokers"]
        assert [b["url"] for b in brokers] == [
            f"kafka://127.0.0.1:{kafka_port}",
            f"jetstream://127.0.0.1:{nats_port}",
        ]
        # The command has exited; the brokers stay and answer.
        delivery = publish_one(brokers[0]["url"])
        assert delivery is not None and delivery.offset == 0
        assert publish_one(brokers[1]["url"], create_stream=True) is not None

        status = subprocess.run(
            [*CLI, "status", "--json"], env=env, capture_output=True, text=True, timeout=30
        )
        assert status.returncode == 0 and json.loads(status.stdout)["brokers"] == brokers
        again = subprocess.run(
            [*CLI, "nats", "--detach", *ports], env=env, capture_output=True, text=True, timeout=30
        )
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        stopped = subprocess.run(
            [*CLI, "stop"], env=env, capture_output=True, text=True, timeout=60
        )
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped kafka" in stopped.stdout and "stopped nats" in stopped.stdout
    assert not listening(kafka_port) and not listening(nats_port)
    assert not any(pid_alive(b["pid"]) for b in brokers)
    assert not Path(env["PRODUCERKIT_DEV_STATE"]).exists()
    assert not Path(brokers[0]["workdir"]).exists()  # a temporary workdir goes with them
    status = subprocess.run([*CLI, "status"], env=env, capture_output=True, text=True, timeout=30)
    assert status.returncode == 1


def test_foreground_until_ctrl_c(env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [*CLI, "nats", "--json", "--nats-port", str(port), "--workdir", str(tmp_path / "w")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        brokers = json.loads(process.stdout.readline())["brokers"]
        assert brokers[0]["urls"] == [f"jetstream://127.0.0.1:{port}", f"nats://127.0.0.1:{port}"]
        assert publish_one(brokers[0]["url"], create_stream=True) is not None
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert not listening(port) and not pid_alive(brokers[0]["pid"])
    assert (tmp_path / "w" / "jetstream").is_dir()  # a --workdir is kept: JetStream data lives on


def test_usage(env: dict[str, str]) -> None:
    result = subprocess.run([*CLI, "zookeeper"], env=env, capture_output=True, text=True)
    assert result.returncode == 2 and "unknown broker 'zookeeper'" in result.stderr
    result = subprocess.run([*CLI, "stop"], env=env, capture_output=True, text=True)
    assert result.returncode == 0 and "nothing to stop" in result.stderr
