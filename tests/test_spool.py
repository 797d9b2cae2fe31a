"""The spool: ``Producer(spool=PATH)`` appends every message that ends failed to PATH, and
``producerkit replay PATH --url URL`` sends them again, leaving in PATH only what is still unsent:
every message ends in exactly one place, the broker or the spool."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from time import monotonic, sleep

import pytest
from conftest import read_jetstream, stored_on

import producerkit as pk
from producerkit._spool import read_spool, spool_line
from producerkit.testing.pytest_plugin import NatsSessionBroker

pytestmark = pytest.mark.anyio


async def test_failed_messages_come_back_complete_after_replay(
    nats_broker: NatsSessionBroker, tmp_path: Path, topic: str
) -> None:
    """1,000 messages to a subject no stream stores fail (refused: not stored) into the spool,
    each with its key, headers and msg_id; replay with create_stream sends all of them, once,
    and empties the spool."""
    subject = topic.replace("-", "")
    spool = tmp_path / "failed.spool"
    async with pk.Producer(nats_broker.jetstream_url, topic=subject, spool=str(spool)) as producer:
        for number in range(1000):
            await producer.produce(
                b"v-%d" % number,
                key=b"k-%d" % (number % 7),
                headers={"n": b"%d" % number},
                msg_id=f"id-{number}",
                nonblocking=True,
            )
        with pytest.raises(pk.ProduceError) as caught:
            await producer.flush()
    assert len(caught.value.failures) == 1000
    lines = list(read_spool(spool))
    assert len(lines) == 1000
    first = lines[0][2]
    assert (first.topic, first.value, first.msg_id) == (subject, b"v-0", "id-0")
    assert first.headers == (("n", b"0"),) and first.possibly_stored is False
    assert "no JetStream stream" in first.error

    code = await _replay(str(spool), "--url", nats_broker.jetstream_url, "-o", "create_stream=true")
    assert code == 0
    assert spool.read_bytes() == b""
    stored = await read_jetstream(nats_broker.jetstream_url, subject, 1000)
    assert sorted(record["value"] for record in stored) == sorted(
        b"v-%d" % number for number in range(1000)
    )
    assert {record["headers"]["Nats-Msg-Id"] for record in stored} == {
        f"id-{number}" for number in range(1000)
    }


async def _replay(*argv: str) -> int:
    """``producerkit replay ARGV`` in a process of its own, as a user runs it."""
    import anyio

    done = await anyio.run_process(
        [sys.executable, "-m", "producerkit", "replay", *argv], check=False
    )
    assert done.returncode in (0, 1), done.stderr.decode()[-2000:]
    return done.returncode


def test_a_spool_line_is_self_describing(tmp_path: Path) -> None:
    line = spool_line(
        topic="t",
        value=b"\x00\xff",
        key=None,
        partition=3,
        headers=(("a", None), ("b", b"1")),
        msg_id=None,
        timestamp=1.5,
        error="ProduceTimeout: late",
        possibly_stored=True,
    )
    document = json.loads(line)
    assert document == {
        "topic": "t",
        "partition": 3,
        "key": None,
        "value": "AP8=",
        "headers": [["a", None], ["b", "MQ=="]],
        "msg_id": None,
        "timestamp": 1.5,
        "error": "ProduceTimeout: late",
        "possibly_stored": True,
    }
    path = tmp_path / "s"
    path.write_bytes(line)
    ((number, raw, message),) = read_spool(path)
    assert number == 1 and raw == line
    assert message.produce_kwargs() == {
        "key": None,
        "topic": "t",
        "msg_id": None,
        "headers": [("a", None), ("b", b"1")],
        "partition": 3,
        "timestamp": 1.5,
    }


def test_a_line_that_is_no_spool_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "s"
    path.write_bytes(b'{"topic": "t", "value": "not base64!"}\n')
    with pytest.raises(pk.ConfigurationError, match=r"s:1: not a spool line"):
        list(read_spool(path))


def _spool_of(directory: Path, subject: str, count: int) -> Path:
    """A spool of ``count`` messages ``v-<n>`` (message id ``id-<n>``) to ``subject``, each
    failed before as not stored."""
    spool = directory / "failed.spool"
    spool.write_bytes(
        b"".join(
            spool_line(
                topic=subject, value=b"v-%d" % number, key=None, partition=None, headers=None,
                msg_id=f"id-{number}", timestamp=None, error="DeliveryError: before",
                possibly_stored=False,
            )
            for number in range(count)
        )
    )  # fmt: skip
    return spool


def _replaying(spool: Path, url: str) -> subprocess.Popen[bytes]:
    """``producerkit replay`` of ``spool`` to ``url``, started (its stderr piped)."""
    command = [sys.executable, "-m", "producerkit", "replay", str(spool), "--url", url]
    return subprocess.Popen(
        [*command, "-o", "create_stream=true", "--timeout", "20"], stderr=subprocess.PIPE
    )


def test_a_replay_interrupted_while_it_connects_keeps_the_whole_spool(
    nats_broker: NatsSessionBroker, tmp_path: Path, topic: str
) -> None:
    """Ctrl-C while the replay's producer connects (the link stalled) ends the connecting at
    once: exit 130, nothing sent, every message still in the spool."""
    spool = _spool_of(tmp_path, topic.replace("-", ""), 300)
    nats_broker.faults.pause()
    replaying = _replaying(spool, nats_broker.faulty_jetstream_url)
    try:
        while nats_broker.faults.connections == 0:  # it connects, through the stalled link
            assert replaying.poll() is None, replaying.communicate()[1].decode()
            sleep(0.05)
        sleep(0.3)
        started = monotonic()
        replaying.send_signal(signal.SIGINT)
        _, stderr = replaying.communicate(timeout=30)
        stopped_within = monotonic() - started
    finally:
        nats_broker.faults.clear()
    assert replaying.returncode == 130, stderr.decode()[-2000:]
    assert stopped_within < 5.0  # not the 20 s its connecting may take
    assert [message.value for _, _, message in read_spool(spool)] == [
        b"v-%d" % number for number in range(300)
    ]


def test_an_interrupted_replay_leaves_each_message_in_one_place(
    nats_broker: NatsSessionBroker, tmp_path: Path, topic: str
) -> None:
    """Ctrl-C in the middle of a replay through a slow link: what was acked is gone from the
    spool, the rest (in flight: possibly stored; not read yet: as it was) is in it once."""
    subject = topic.replace("-", "")
    spool = _spool_of(tmp_path, subject, 3000)
    nats_broker.faults.slow(30.0, 64 * 1024)
    replaying = _replaying(spool, nats_broker.faulty_jetstream_url)
    # Ctrl-C once it is sending (a message stored), not at a time a loaded machine may reach
    # before the process has even imported producerkit, or after the replay ended.
    stored_on(nats_broker.jetstream_url, subject, 3000, timeout=30)()
    assert replaying.poll() is None, "the replay ended before it was interrupted"
    replaying.send_signal(signal.SIGINT)
    _, stderr = replaying.communicate(timeout=60)
    assert replaying.returncode == 130, stderr.decode()[-2000:]
    nats_broker.faults.clear()
    left = [message for _, _, message in read_spool(spool)]
    import anyio

    stored = anyio.run(read_jetstream, nats_broker.jetstream_url, subject, 1)
    stored_ids = {record["headers"]["Nats-Msg-Id"] for record in stored}
    left_ids = [message.msg_id for message in left]
    assert len(left_ids) == len(set(left_ids))  # nothing twice in the spool
    everything = {f"id-{number}" for number in range(3000)}
    assert stored_ids | set(left_ids) == everything  # nothing in neither place
    both = stored_ids & set(left_ids)
    assert all(message.possibly_stored for message in left if message.msg_id in both)
    assert stored_ids and left_ids  # it was cut in the middle
