"""``producerkit produce``: formats, the failures file and its replay, against real brokers.

The issue's "done when": a broker goes down for part of a run, the run exits 1 with a failures
file holding exactly the unacknowledged records, and replaying that file puts every record in the
stream (test_broker_down_mid_run_then_replay).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import read_jetstream, read_kafka

from producerkit.backends.memory import MemoryStore, get_store
from producerkit.cli.produce import main
from producerkit.testing.brokers import LocalBroker, start_nats

CLI = [sys.executable, "-m", "producerkit", "produce"]


def memory() -> tuple[str, MemoryStore]:
    name = uuid.uuid4().hex
    return f"memory://{name}", get_store(name)  # holding the store keeps it alive


def jsonl(path: Path, documents: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(document) + "\n" for document in documents))
    return path


def summary(stderr: str) -> dict[str, int]:
    match = re.search(r"([\d,]+) records .*: ([\d,]+) acked, ([\d,]+) failed", stderr)
    assert match, stderr
    records, acked, failed = (int(group.replace(",", "")) for group in match.groups())
    return {"records": records, "acked": acked, "failed": failed}


def test_lines_with_headers_and_key_delimiter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, store = memory()
    source = tmp_path / "in.txt"
    source.write_bytes(b"k1:hello\nk2:world\r\n\nno-delimiter\n")
    failed = tmp_path / "failed.txt"
    code = main(
        [
            str(source),
            "--url",
            url,
            "--topic",
            "t",
            "--key-delimiter",
            ":",
            "-H",
            "origin=cli",
            "--failed-out",
            str(failed),
        ]
    )
    assert code == 1  # the line without a delimiter
    assert [(r.key, r.value, r.headers) for r in store.records] == [
        (b"k1", b"hello", (("origin", b"cli"),)),
        (b"k2", b"world", (("origin", b"cli"),)),
    ]
    assert failed.read_bytes() == b"no-delimiter\n"
    assert summary(capsys.readouterr().err) == {"records": 3, "acked": 2, "failed": 1}


@pytest.mark.parametrize("value_field", [None, "body"])
def test_jsonl_fields_and_replay_of_refused_records(
    tmp_path: Path, value_field: str | None
) -> None:
    """Records refused at the call (too large) are written so that a rerun sends them unchanged."""
    documents = [
        {"id": f"o-{i}", "user": f"u{i % 3}", "body": ("x" * 300 if i % 4 == 0 else f"b{i}")}
        for i in range(20)
    ] + [{"id": "o-num", "user": 7, "body": {"nested": [1, 2]}}]
    source = jsonl(tmp_path / "in.jsonl", documents)
    source.write_text(source.read_text() + "not json\n")
    failed = tmp_path / "failed.jsonl"
    fields = ["--key-field", "user", "--msg-id-field", "id"]
    if value_field:
        fields += ["--value-field", value_field]
    url, store = memory()
    argv = ["--url", url, "--topic", "t", "--format", "jsonl", *fields, "--nonblocking"]
    code = main([str(source), *argv, "-o", "max_message_size=300", "--failed-out", str(failed)])
    assert code == 1
    first = [(r.key, r.value, r.msg_id) for r in store.records]
    assert len(first) == 21 - 5 and first[-1][0] == b"7"  # a non-string key field, as JSON
    if value_field:
        assert first[-1][1] == b'{"nested":[1,2]}'
    failed_lines = failed.read_text().splitlines()
    assert len(failed_lines) == 6 and failed_lines[-1] == "not json"

    # Fix the broken line, lift the limit, replay the file in place: exactly the rest arrives.
    failed.write_text("\n".join(failed_lines[:-1]) + "\n")
    store.clear()
    assert main([str(failed), *argv, "--failed-out", str(failed)]) == 0
    expected = [
        (f"u{i % 3}".encode(), (b"x" * 300 if value_field else None), f"o-{i}")
        for i in range(0, 20, 4)
    ]
    replayed = [(r.key, r.value if value_field else None, r.msg_id) for r in store.records]
    assert replayed == expected
    if not value_field:  # the whole line is the value, byte for byte
        assert [r.value for r in store.records] == [
            json.dumps(documents[i]).encode() for i in range(0, 20, 4)
        ]
    assert failed.read_bytes() == b""  # nothing left to send


def test_csv_rows_as_json_and_replay(tmp_path: Path) -> None:
    source = tmp_path / "in.csv"
    rows = [
        ["id", "user", "note"],
        ["1", "alice", "short"],
        ["2", "bob", "y" * 200],
        ["3", "", "multi\nline, quoted"],
    ]
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    source.write_text(buffer.getvalue())
    failed = tmp_path / "failed.csv"
    url, store = memory()
    argv = ["--url", url, "--topic", "t", "--format", "csv", "--key-field", "user"]
    assert (
        main([str(source), *argv, "-o", "max_message_size=200", "--failed-out", str(failed)]) == 1
    )
    assert [(r.key, json.loads(r.value)) for r in store.records] == [
        (b"alice", {"id": "1", "user": "alice", "note": "short"}),
        (None, {"id": "3", "user": "", "note": "multi\nline, quoted"}),  # empty cell: no key
    ]
    assert list(csv.reader(io.StringIO(failed.read_text()))) == [rows[0], rows[2]]
    store.clear()
    assert main([str(failed), *argv]) == 0
    assert [(r.key, json.loads(r.value)["note"]) for r in store.records] == [(b"bob", "y" * 200)]


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["--url", "null://", "--topic", "t", "--key-field", "k"],  # lines has no fields
        ["--url", "null://", "--topic", "t", "missing.txt"],
        ["--url", "null://"],  # no topic
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2, argv
    source = tmp_path / "in.txt"
    source.write_text("a\n")
    assert main([str(source), "--url", "null://", "--topic", "t", "-o", "bogus=1"]) == 2
    assert "unknown option 'bogus'" in capsys.readouterr().err
    assert main([str(source), "--url", "nope://x", "--topic", "t"]) == 2
    assert "unknown URL scheme" in capsys.readouterr().err


def test_no_broker_leaves_the_whole_input_to_send(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("a\nb\nc\n")
    failed = tmp_path / "failed.txt"
    port = _closed_port()
    result = subprocess.run(
        [
            *CLI,
            str(source),
            "--url",
            f"nats://127.0.0.1:{port}",
            "--topic",
            "t",
            "--timeout",
            "2",
            "--failed-out",
            str(failed),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert "BrokerUnavailable" in result.stderr
    assert failed.read_text() == "a\nb\nc\n"


def _closed_port() -> int:
    from producerkit.testing.brokers import free_port

    return free_port()


def test_100k_jsonl_keyed_nonblocking_on_jetstream(
    tmp_path: Path, nats_broker: LocalBroker
) -> None:
    """The issue's scenario, all up: 100,000 JSONL lines, keys from a field, progress, summary."""
    count = 100_000
    source = tmp_path / "orders.jsonl"
    with open(source, "w") as file:
        for i in range(count):
            file.write(f'{{"id": "o-{i}", "user": "user-{i % 1000}", "amount": {i}}}\n')
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    result = subprocess.run(
        [
            *CLI,
            str(source),
            "--url",
            f"jetstream://{nats_broker.host_port}",
            "--topic",
            topic,
            "-o",
            "create_stream=true",
            "--format",
            "jsonl",
            "--key-field",
            "user",
            "--nonblocking",
            "--progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    assert summary(result.stderr) == {"records": count, "acked": count, "failed": 0}
    assert "records" in result.stderr.splitlines()[0]  # the progress line came first
    assert _stream_count(nats_broker.url, topic) == count
    print(f"100k JSONL lines to JetStream in {elapsed:.2f} s (process included)")
    assert elapsed < 60


def test_kafka_keys_from_a_field(tmp_path: Path, kafka_broker: LocalBroker) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    documents = [{"user": f"u{i % 5}", "n": i} for i in range(50)]
    source = jsonl(tmp_path / "in.jsonl", documents)
    result = subprocess.run(
        [
            *CLI,
            str(source),
            "--url",
            kafka_broker.url,
            "--topic",
            topic,
            "--format",
            "jsonl",
            "--key-field",
            "user",
            "--value-field",
            "n",
            "--partitioner",
            "murmur2",
            "--nonblocking",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    records = asyncio.run(read_kafka(kafka_broker.url, topic, len(documents)))
    assert sorted((r["key"], int(r["value"])) for r in records) == sorted(
        (d["user"].encode(), d["n"]) for d in documents
    )


def _stream_count(url: str, subject: str) -> int:
    async def count() -> int:
        import nats

        client = await nats.connect(url.replace("jetstream://", "nats://"))
        try:
            js = client.jetstream()
            name = await js.find_stream_name_by_subject(subject)
            info = await js.stream_info(name)
            return int(info.state.messages)
        finally:
            await client.close()

    return asyncio.run(count())


def _wait_for_count(url: str, subject: str, expected: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _stream_count(url, subject) >= expected:
                return
        except Exception:  # the stream is created by the first publish
            pass
        time.sleep(0.1)
    raise AssertionError(f"stream never reached {expected} messages")


@pytest.mark.brokers  # starts a broker of its own
def test_broker_down_mid_run_then_replay(tmp_path: Path) -> None:
    """Done when: broker down for part of the run -> exit 1 + failures file -> replay -> all in."""
    half = 2000
    lines = [
        json.dumps({"id": f"o-{i}", "user": f"user-{i % 50}", "n": i}) for i in range(2 * half)
    ]
    failed = tmp_path / "failed.jsonl"
    topic = "orders"
    with start_nats(jetstream=True, workdir=tmp_path / "nats") as broker:
        url = f"{broker.url}?create_stream=true&stream_storage=file"
        argv = [
            "--url",
            url,
            "--topic",
            topic,
            "--format",
            "jsonl",
            "--key-field",
            "user",
            "--msg-id-field",
            "id",
            "--nonblocking",
            "--timeout",
            "2",
            "--failed-out",
            str(failed),
            "--no-progress",
        ]
        process = subprocess.Popen(
            [*CLI, "-", *argv], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert process.stdin is not None
        try:
            process.stdin.write("\n".join(lines[:half]) + "\n")
            process.stdin.flush()
            _wait_for_count(broker.url, topic, half)
            broker.kill()  # down for the rest of this run
            _, stderr = process.communicate("\n".join(lines[half:]) + "\n", timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 1, stderr
        counts = summary(stderr)
        assert counts["records"] == 2 * half and counts["acked"] >= half

        failed_lines = failed.read_text().splitlines()
        # Exactly the records not acked, each once, each an input line as it was read.
        assert len(failed_lines) == counts["failed"] == 2 * half - counts["acked"]
        assert len(set(failed_lines)) == len(failed_lines) and set(failed_lines) <= set(lines)

        broker.start()  # back on the same port, with the file store
        stored = {r["value"].decode() for r in asyncio.run(read_jetstream(broker.url, topic, half))}
        assert stored | set(failed_lines) == set(lines)

        replay = subprocess.run(
            [*CLI, str(failed), *argv], capture_output=True, text=True, timeout=120
        )
        assert replay.returncode == 0, replay.stderr
        assert summary(replay.stderr)["acked"] == len(failed_lines)
        assert failed.read_text() == ""
        records = asyncio.run(read_jetstream(broker.url, topic, 2 * half))
        # msg ids make the rerun idempotent: records stored before their ack was lost are not
        # stored twice.
        assert sorted(r["value"].decode() for r in records) == sorted(lines)


# ---------------------------------------------------------------------- --value-format

ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "n", "type": "long"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}


def test_value_format_json_re_serializes_compactly_on_kafka(
    tmp_path: Path, kafka_broker: LocalBroker
) -> None:
    """The default sends a JSONL line as it is; json sends the document (or field) compactly,
    as the producer's value_serializer writes it. Read back with aiokafka."""
    lines = [
        f'{{ "id" : "o-{i}",  "user": "ü{i % 3}", "n": [ {i}, {{"x": null}} ] }}' for i in range(30)
    ]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def run(topic: str, *flags: str) -> list[dict[str, Any]]:
        argv = ["--url", kafka_broker.url, "--topic", topic, "--format", "jsonl", *flags]
        result = subprocess.run(
            [*CLI, str(source), *argv, "--nonblocking"], capture_output=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        return asyncio.run(read_kafka(kafka_broker.url, topic, len(lines)))

    as_read = run(f"t-{uuid.uuid4().hex[:8]}", "--key-field", "user")
    assert sorted(r["value"] for r in as_read) == sorted(line.encode() for line in lines)

    compact = run(f"t-{uuid.uuid4().hex[:8]}", "--key-field", "user", "--value-format", "json")
    expected = {
        f"o-{i}": f'{{"id":"o-{i}","user":"ü{i % 3}","n":[{i},{{"x":null}}]}}'.encode()
        for i in range(30)
    }
    assert {json.loads(r["value"])["id"]: r["value"] for r in compact} == expected
    assert {r["key"] for r in compact} == {"ü0".encode(), "ü1".encode(), "ü2".encode()}

    fields = run(f"t-{uuid.uuid4().hex[:8]}", "--value-field", "id", "--value-format", "json")
    assert sorted(r["value"] for r in fields) == sorted(b'"o-%d"' % i for i in range(30))


def test_value_format_json_failures_replay_to_the_same_bytes(tmp_path: Path) -> None:
    """Refused values (too large, JSON null, not JSON) go to the failures file as JSON records a
    rerun sends as the same bytes; lines, jsonl fields and csv rows alike."""
    url, store = memory()
    failed = tmp_path / "failed"
    cases: list[tuple[list[str], str]] = [
        (["--format", "lines"], '{"a": 1}\n{"big": "' + "x" * 300 + '"}\nnull\nnot json\n'),
        (
            ["--format", "jsonl", "--value-field", "v", "--key-field", "k"],
            '{"k": "a", "v": {"z": [1, 2]}}\n{"k": 7, "v": "' + "y" * 300 + '"}\n'
            '{"k": "c", "v": null}\n',
        ),
        (["--format", "csv", "--key-field", "k"], "k,v\na,1\nb," + "z" * 300 + "\n"),
    ]
    for flags, text in cases:
        source = tmp_path / "in"
        source.write_text(text)
        argv = ["--url", url, "--topic", "t", *flags, "--value-format", "json"]
        store.clear()
        assert (
            main([str(source), *argv, "-o", "max_message_size=300", "--failed-out", str(failed)])
            == 1
        )
        first = [(r.key, r.value) for r in store.records]
        assert len(first) == 1, (flags, first)
        refused = failed.read_text()
        store.clear()
        assert main([str(failed), *argv, "--failed-out", str(failed)]) == (
            1 if "null" in text or "not json" in text else 0
        ), (flags, refused)
        replayed = [(r.key, r.value) for r in store.records]
        if flags[1] == "lines":
            assert first == [(None, b'{"a":1}')]
            assert replayed == [(None, b'{"big":"' + b"x" * 300 + b'"}')]
            assert failed.read_text() == "null\nnot json\n"  # still unsendable, as they were
        elif flags[1] == "jsonl":
            assert first == [(b"a", b'{"z":[1,2]}')]
            assert replayed == [(b"7", b'"' + b"y" * 300 + b'"')]
        else:
            assert first == [(b"a", b'{"k":"a","v":"1"}')]
            assert replayed == [(b"b", b'{"k":"b","v":"' + b"z" * 300 + b'"}')]


def test_value_format_str_refuses_what_is_not_utf8(tmp_path: Path) -> None:
    url, store = memory()
    source = tmp_path / "in.txt"
    source.write_bytes(b"caf\xc3\xa9\nbad \xff byte\n")
    failed = tmp_path / "failed.txt"
    argv = ["--url", url, "--topic", "t", "--failed-out", str(failed)]
    assert main([str(source), *argv]) == 0  # bytes: as read
    assert [r.value for r in store.records] == ["café".encode(), b"bad \xff byte"]
    store.clear()
    assert main([str(source), *argv, "--value-format", "str"]) == 1
    assert [r.value for r in store.records] == ["café".encode()]
    assert failed.read_bytes() == b"bad \xff byte\n"

    source = tmp_path / "in.csv"  # a cell that is not UTF-8: its bytes kept, or refused
    source.write_bytes(b"k,v\na,caf\xc3\xa9\nb,bad \xff\n")
    argv += ["--format", "csv", "--key-field", "k", "--value-field", "v"]
    store.clear()
    assert main([str(source), *argv]) == 0
    assert [r.value for r in store.records] == ["café".encode(), b"bad \xff"]
    store.clear()
    assert main([str(source), *argv, "--value-format", "str"]) == 1
    assert [(r.key, r.value) for r in store.records] == [(b"a", "café".encode())]
    assert failed.read_bytes() == b"k,v\nb,bad \xff\n"


def test_value_format_avro_on_jetstream_and_replay_of_delivery_failures(
    tmp_path: Path, nats_broker: LocalBroker
) -> None:
    """avro: each document Avro-encoded in the Confluent framing, read back with fastavro. A run
    whose messages all fail (no stream yet) writes them back as JSON documents; replaying them
    with the stream created stores every one, and a document the schema refuses stays failed."""
    fastavro = pytest.importorskip("fastavro")
    schema_file = tmp_path / "order.avsc"
    schema_file.write_text(json.dumps(ORDER_SCHEMA))
    documents = [
        {"id": f"o-{i}", "user": f"u{i % 4}", "n": i, "tags": ["a"] * (i % 3)} for i in range(40)
    ]
    source = jsonl(
        tmp_path / "in.jsonl", [*documents, {"id": "bad", "user": "u0", "n": "not a long"}]
    )
    failed = tmp_path / "failed.jsonl"
    topic = f"avro-{uuid.uuid4().hex[:8]}"
    url = f"jetstream://{nats_broker.host_port}"
    flags = [
        "--url", url, "--topic", topic, "--format", "jsonl", "--key-field", "user",
        "--msg-id-field", "id", "--value-format", "avro", "--avro-schema", str(schema_file),
        "--schema-id", "7", "--nonblocking", "--timeout", "5", "--failed-out", str(failed),
    ]  # fmt: skip
    down = subprocess.run([*CLI, str(source), *flags], capture_output=True, text=True, timeout=120)
    assert down.returncode == 1, down.stderr
    assert summary(down.stderr) == {"records": 41, "acked": 0, "failed": 41}
    assert "1 SerializationError" in down.stderr
    written = [json.loads(line) for line in failed.read_text().splitlines()]
    # decoded back from the Avro bytes: the schema's fields, plus the key field it lacks
    good = sorted((d for d in written if d["id"] != "bad"), key=lambda d: d["n"])
    assert good == [
        {"id": d["id"], "n": d["n"], "tags": d["tags"], "user": d["user"]} for d in documents
    ]
    assert {"id": "bad", "user": "u0", "n": "not a long"} in written

    replay = subprocess.run(
        [*CLI, str(failed), *flags, "-o", "create_stream=true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert replay.returncode == 1, replay.stderr
    assert summary(replay.stderr) == {"records": 41, "acked": 40, "failed": 1}
    assert [json.loads(line)["id"] for line in failed.read_text().splitlines()] == ["bad"]
    parsed = fastavro.parse_schema(ORDER_SCHEMA)
    stored = asyncio.run(read_jetstream(nats_broker.url, topic, 40))
    decoded = []
    for record in stored:
        assert record["value"][:5] == b"\x00\x00\x00\x00\x07"
        decoded.append(fastavro.schemaless_reader(io.BytesIO(record["value"][5:]), parsed, parsed))
        assert record["headers"]["Nats-Msg-Id"] == decoded[-1]["id"]
    assert sorted(decoded, key=lambda d: d["n"]) == [
        {"id": d["id"], "n": d["n"], "tags": d["tags"]} for d in documents
    ]


def test_value_format_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema = tmp_path / "s.avsc"
    schema.write_text(json.dumps(ORDER_SCHEMA))
    base = ["--url", "null://", "--topic", "t"]
    for extra, message in (
        (["--avro-schema", str(schema)], "need --value-format avro"),
        (
            ["--value-format", "avro", "--avro-schema", str(schema)],
            "needs --avro-schema FILE and --schema-id N",
        ),
        (
            [
                "--value-format",
                "avro",
                "--avro-schema",
                str(tmp_path / "no.avsc"),
                "--schema-id",
                "1",
            ],
            "cannot read --avro-schema",
        ),
        (
            ["--value-format", "avro", "--avro-schema", str(schema), "--schema-id", "-1"],
            "schema_id must be",
        ),
        (["--value-format", "yaml"], "invalid choice"),
        (["--metrics-linger", "5"], "--metrics-linger needs --metrics-port"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main([*base, *extra])
        assert exit_info.value.code == 2, extra
        assert message in capsys.readouterr().err, extra
