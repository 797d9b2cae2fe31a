"""``producerkit dev``: foreground until Ctrl-C, and --detach / status / stop."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import producerkit as pk
from producerkit.cli.dev import process_running
from producerkit.testing.brokers import free_port

CLI = [sys.executable, "-m", "producerkit", "dev"]


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    return process_running(pid)  # zombie-aware: an orphan nobody reaped yet is not running


def publish_one(url: str, **options: Any) -> pk.Delivery | None:
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


def _foreground(
    port: int, workdir: Path, env: dict[str, str], *, ignoring_sigint: bool = False
) -> tuple[subprocess.Popen[str], list[dict[str, Any]]]:
    """``producerkit dev nats`` in the foreground, and the brokers it printed: the line it prints
    once Ctrl-C stops them (its readiness signal)."""
    command = [*CLI, "nats", "--json", "--nats-port", str(port), "--workdir", str(workdir)]
    if ignoring_sigint:  # as a command started with & from a script inherits it
        command = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *command]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.kill()
        pytest.fail(f"producerkit dev printed no brokers: {process.communicate()[1]}")
    brokers: list[dict[str, Any]] = json.loads(line)["brokers"]
    return process, brokers


def _interrupt(process: subprocess.Popen[str], broker_pid: int) -> str:
    """SIGINT, then wait for the command; if it hangs, kill it and its broker (own session)."""
    process.send_signal(signal.SIGINT)
    try:
        return process.communicate(timeout=30)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if pid_alive(broker_pid):
            os.killpg(broker_pid, signal.SIGKILL)


def test_foreground_until_ctrl_c(env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    process, brokers = _foreground(port, tmp_path / "w", env)
    pid = brokers[0]["pid"]
    try:
        assert brokers[0]["urls"] == [f"jetstream://127.0.0.1:{port}", f"nats://127.0.0.1:{port}"]
        assert publish_one(brokers[0]["url"], create_stream=True) is not None
    finally:
        stderr = _interrupt(process, pid)
    assert process.returncode == 0, stderr
    assert not listening(port) and not pid_alive(pid)
    assert (tmp_path / "w" / "jetstream").is_dir()  # a --workdir is kept: JetStream data lives on


@pytest.mark.parametrize(
    "ignoring_sigint", [False, True], ids=["sigint", "sigint-inherited-ignored"]
)
def test_ctrl_c_as_soon_as_the_brokers_are_printed(
    env: dict[str, str], tmp_path: Path, ignoring_sigint: bool
) -> None:
    """The brokers are printed once Ctrl-C stops them: a SIGINT sent the moment the line arrives
    stops the broker and exits 0. (It used to come before the handler: 10 of 30 such runs ended
    in a KeyboardInterrupt traceback, exit -2, and a nats-server left running.) A SIGINT
    inherited as ignored (``producerkit dev &`` in a script) is handled too (it used to hang)."""
    for attempt in range(5):
        port = free_port()
        process, brokers = _foreground(
            port, tmp_path / f"w{attempt}", env, ignoring_sigint=ignoring_sigint
        )
        pid = brokers[0]["pid"]
        stderr = _interrupt(process, pid)
        assert process.returncode == 0, stderr
        assert "stopped" in stderr
        assert not pid_alive(pid) and not listening(port)


@pytest.mark.skipif(shutil.which("java") is None, reason="Apache Kafka needs Java")
def test_apache_kafka_detached(env: dict[str, str]) -> None:
    """``--kafka apache``: an Apache Kafka node (the jars cached by the first use), stopped by
    ``producerkit dev stop`` with its temp workdir."""
    port = free_port()
    started = subprocess.run(
        [*CLI, "kafka", "--kafka", "apache", "--kafka-port", str(port), "--detach", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        assert started.returncode == 0, started.stderr
        [broker] = json.loads(started.stdout)["brokers"]
        assert broker["url"] == f"kafka://127.0.0.1:{port}"
        assert Path(broker["log"]).is_file()
        delivery = publish_one(broker["url"])
        assert delivery is not None and delivery.offset == 0
    finally:
        stopped = subprocess.run(
            [*CLI, "stop"], env=env, capture_output=True, text=True, timeout=60
        )
    assert stopped.returncode == 0, stopped.stderr
    assert not listening(port) and not pid_alive(broker["pid"])
    assert not Path(broker["workdir"]).exists()


def test_apache_kafka_without_java(env: dict[str, str], tmp_path: Path) -> None:
    """Where no java is on the PATH, ``--kafka apache`` says what to install."""
    result = subprocess.run(
        [*CLI, "kafka", "--kafka", "apache"],
        env={**env, "PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "no java on the PATH" in result.stderr and "openjdk" in result.stderr


def test_usage(env: dict[str, str]) -> None:
    result = subprocess.run([*CLI, "zookeeper"], env=env, capture_output=True, text=True)
    assert result.returncode == 2 and "unknown broker 'zookeeper'" in result.stderr
    result = subprocess.run([*CLI, "stop"], env=env, capture_output=True, text=True)
    assert result.returncode == 0 and "nothing to stop" in result.stderr
    result = subprocess.run(
        [*CLI, "kafka", "--kafka-brokers", "3"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 2 and "--kafka-brokers needs --kafka apache" in result.stderr


# ---------------------------------------------------------------------- the other commands' help


def test_top_level_help_names_version(capsys: pytest.CaptureFixture[str]) -> None:
    from producerkit import cli

    assert cli.main(["--help"]) == 0
    assert "--version" in capsys.readouterr().out
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == pk.__version__


def test_demo_help_is_plain_words(capsys: pytest.CaptureFixture[str]) -> None:
    from producerkit import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for jargon in ("``", ":class:", "WAN", "sync vs", "RTT"):
        assert jargon not in text, jargon
    for said in ("one at a time", "many at once", "wait for their confirmation"):
        assert said in " ".join(text.split()), said


def test_a_mistyped_option_gets_a_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    from producerkit import cli

    for argv, hint in (
        (["produce", "--max-rates", "3", "in.txt"], "--max-rates: did you mean --max-rate?"),
        (["dev", "--detatch"], "--detatch: did you mean --detach?"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 2
        assert hint in capsys.readouterr().err


@pytest.mark.parametrize(
    "command", [["produce"], ["bench"], ["bench", "plot"], ["demo"], ["dev"], ["replay"]]
)
def test_every_command_help_has_examples(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each command's --help ends with examples, kept line by line (not wrapped together)."""
    from producerkit import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main([*command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    examples = text[text.index("\nexamples:\n") :].splitlines()
    runs = [line for line in examples if line.lstrip().startswith("producerkit ")]
    assert len(runs) >= 2, text
    assert all(len(line) <= 100 for line in text.splitlines()), text


def test_every_bench_flag_has_a_help_text() -> None:
    from producerkit.cli.bench import build_parser

    for action in build_parser()._actions:
        assert action.help, action.option_strings


def test_a_configuration_error_is_the_error_and_a_pointer_to_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No usage block above the error (it was ~20 lines for produce): the error, whole, and one
    line pointing at --help; the exit code stays 2."""
    from producerkit import cli

    for argv, error in (
        (
            ["produce", "--url", "null://"],
            "producerkit produce: error: no topic: pass --topic NAME, set "
            'PRODUCERKIT_TOPIC=NAME, or write topic = "NAME" in the TOML file',
        ),
        (["produce", "--url", "null://", "--topic", "t", "missing.txt"], "no such file"),
        (["produce", "--bogus"], "unrecognized arguments: --bogus"),
        (["bench", "--url", "null://"], "the following arguments are required: --topic"),
        (["bench", "--url", "null://", "--topic", "t", "--rate", "-1"], "--rate is out of range"),
        (["replay", "missing.spool"], "no such spool"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 2, argv
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 2 and error in lines[0], lines
        assert (
            lines[1]
            == f"Run '{' '.join(['producerkit', argv[0]])} --help' for its options and examples."
        )
    # Refused when the producer is built: the same two lines, exit code 2.
    assert cli.main(["bench", "--url", "null://", "--topic", "t", "-o", "bogus=1"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "unknown option 'bogus'" in lines[0], lines
