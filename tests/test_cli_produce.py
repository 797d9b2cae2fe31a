"""``producerkit produce``: formats, the failures file and its replay, against real brokers.

The issue's "done when": a broker goes down for part of a run, the run exits 1 with a failures
file holding exactly the unacknowledged records, and replaying that file puts every record in the
stream (test_broker_down_mid_run_then_replay).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import attrs
import pytest
from conftest import BackendCase, read_jetstream, read_kafka

from producerkit import ProducerOptions, settings
from producerkit.backends.memory import MemoryStore, get_store
from producerkit.cli._args import cli_syntax
from producerkit.cli.formats import detect_format
from producerkit.cli.produce import (
    SHORT_OPTIONS,
    add_setting_flags,
    build_parser,
    main,
    setting_fields,
)
from producerkit.cli.progress import progress_columns
from producerkit.testing.brokers import LocalBroker, start_nats

pytestmark = pytest.mark.anyio

CLI = [sys.executable, "-m", "producerkit", "produce"]


@pytest.fixture
def anyio_backend() -> str:
    """One event loop for this module's async tests: the command runs in a process of its own,
    on its own loop, and the test's loop only reads the broker back."""
    return "asyncio"


async def run_cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``producerkit produce *argv`` in a process of its own, its output decoded."""
    with anyio.fail_after(timeout):
        result = await anyio.run_process([*CLI, *argv], check=False)
    stdout, stderr = (data.decode(errors="replace") for data in (result.stdout, result.stderr))
    return subprocess.CompletedProcess(result.args, result.returncode, stdout, stderr)


def memory() -> tuple[str, MemoryStore]:
    name = uuid.uuid4().hex
    return f"memory://{name}", get_store(name)  # holding the store keeps it alive


def backend_flags(backend: BackendCase) -> list[str]:
    """``--url`` and a ``-o name=value`` for each option the backend's producers need."""
    flags = ["--url", backend.url]
    for name, value in backend.options.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        flags += ["-o", f"{name}={text}"]
    return flags


def jsonl(path: Path, documents: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(document) + "\n" for document in documents))
    return path


def summary(stderr: str) -> dict[str, int]:
    match = re.search(r"([\d,]+) records .*: ([\d,]+) acked, ([\d,]+) failed", stderr)
    assert match, stderr
    records, acked, failed = (int(group.replace(",", "")) for group in match.groups())
    return {"records": records, "acked": acked, "failed": failed}


def test_lines_with_headers_and_key_delimiter(
    backend: BackendCase, topic: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"k1:hello\nk2:world\r\n\nno-delimiter\n")
    failed = tmp_path / "failed.txt"
    code = main(
        [
            str(source),
            *backend_flags(backend),
            "--topic",
            topic,
            "--key-delimiter",
            ":",
            "-H",
            "origin=cli",
            "--failed-out",
            str(failed),
        ]
    )
    assert code == 1  # the line without a delimiter
    assert failed.read_bytes() == b"no-delimiter\n"
    assert summary(capsys.readouterr().err) == {"records": 3, "acked": 2, "failed": 1}
    if backend.spec.stores_records:
        stored = sorted(
            (r["value"], r["key"], r["headers"]) for r in anyio.run(backend.read, topic, 2)
        )
        keys = (b"k1", b"k2") if backend.spec.partitioned else (None, None)  # NATS: no keys
        assert stored == [
            (b"hello", keys[0], {"origin": b"cli"}),
            (b"world", keys[1], {"origin": b"cli"}),
        ]


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
    argv = ["--url", url, "--topic", "t", "--format", "jsonl", *fields]
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


def test_no_kafka_broker_is_reported_in_producerkits_words_only(tmp_path: Path) -> None:
    """aiokafka logs "Unable connect to ..." at ERROR on every attempt; the command's stderr has
    producerkit's report of the same failure only."""
    source = tmp_path / "in.txt"
    source.write_text("a\n")
    url = f"kafka://127.0.0.1:{_closed_port()}"
    argv = [*CLI, str(source), "--url", url, "--topic", "t", "--timeout", "2"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "BrokerUnavailable: cannot reach a Kafka bootstrap server" in result.stderr
    assert "Unable connect" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("name", "text", "error"),
    [
        (
            "in.jsonl",
            '{"id": 1}\n\n{"id": 2}\n{"id": 3, "user": x}\n',
            "InvalidRecord: line 4: invalid JSON at column 19 of the record: Expecting value",
        ),
        ("in.jsonl", '{"id": 1}\n[1, 2]\n', "InvalidRecord: line 2: expected a JSON object"),
        (
            "in.csv",
            'id,user\n1,a\n"2\nsecond line",b\n3\n',
            "InvalidRecord: line 5: 1 columns, the header has 2",
        ),
        ("in.txt", "k:v\nk:v\nno delimiter\n", "InvalidRecord: line 3: no key delimiter"),
    ],
)
def test_an_invalid_record_names_its_line_in_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, error: str
) -> None:
    """The line of the file (blank lines and a CSV record's own lines counted), not json's
    "line 1" of the record; the column is the record's."""
    source = tmp_path / name
    source.write_text(text)
    fields = ["--key-field", "id"] if name != "in.txt" else ["--key-delimiter", ":"]
    assert main([str(source), "--url", "null://", "--topic", "t", *fields]) == 1
    assert error in capsys.readouterr().err


def _closed_port() -> int:
    from producerkit.testing.brokers import free_port

    return free_port()


async def test_100k_jsonl_keyed_pipelined_on_jetstream(
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
    result = await run_cli(
        str(source),
        *("--url", nats_broker.jetstream_url, "--topic", topic, "-o", "create_stream=true"),
        *("--format", "jsonl", "--key-field", "user", "--progress"),
    )
    elapsed = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    assert summary(result.stderr) == {"records": count, "acked": count, "failed": 0}
    assert "acked" in result.stderr.splitlines()[0]  # the progress line came first
    assert await _stream_count(nats_broker.url, topic) == count
    print(f"100k JSONL lines to JetStream in {elapsed:.2f} s (process included)")
    assert elapsed < 60


async def test_kafka_keys_from_a_field(tmp_path: Path, kafka_broker: LocalBroker) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    documents = [{"user": f"u{i % 5}", "n": i} for i in range(50)]
    source = jsonl(tmp_path / "in.jsonl", documents)
    result = await run_cli(
        str(source),
        *("--url", kafka_broker.url, "--topic", topic, "--format", "jsonl"),
        *("--key-field", "user", "--value-field", "n", "--partitioner", "murmur2"),
    )
    assert result.returncode == 0, result.stderr
    records = await read_kafka(kafka_broker.url, topic, len(documents))
    assert sorted((r["key"], int(r["value"])) for r in records) == sorted(
        (d["user"].encode(), d["n"]) for d in documents
    )


async def _stream_count(url: str, subject: str) -> int:
    import nats

    client = await nats.connect(url.replace("jetstream://", "nats://"))
    try:
        js = client.jetstream()
        name = await js.find_stream_name_by_subject(subject)
        info = await js.stream_info(name)
        return int(info.state.messages)
    finally:
        await client.close()


async def _wait_for_count(url: str, subject: str, expected: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if await _stream_count(url, subject) >= expected:
                return
        except Exception:  # the stream is created by the first publish
            pass
        await anyio.sleep(0.1)
    raise AssertionError(f"stream never reached {expected} messages")


@pytest.mark.brokers  # starts a broker of its own
async def test_broker_down_mid_run_then_replay(tmp_path: Path) -> None:
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
            await _wait_for_count(broker.url, topic, half)
            broker.kill()  # down for the rest of this run
            rest = "\n".join(lines[half:]) + "\n"
            _, stderr = await anyio.to_thread.run_sync(
                functools.partial(process.communicate, rest, timeout=120)
            )
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 1, stderr
        counts = summary(stderr)
        assert counts["records"] == 2 * half and counts["acked"] >= half

        # Exactly the records not acked, each once, each an input line as it was read: those
        # never sent in FILE, those whose answer was lost (possibly stored) beside it.
        maybe = failed.with_name("failed.possibly-stored.jsonl")
        unsent_lines = failed.read_text().splitlines()
        failed_lines = unsent_lines + (maybe.read_text().splitlines() if maybe.exists() else [])
        assert len(failed_lines) == counts["failed"] == 2 * half - counts["acked"]
        assert len(set(failed_lines)) == len(failed_lines) and set(failed_lines) <= set(lines)

        broker.start()  # back on the same port, with the file store
        stored = {r["value"].decode() for r in await read_jetstream(broker.url, topic, half)}
        assert stored | set(failed_lines) == set(lines)

        replay = await run_cli(str(failed), *argv)
        assert replay.returncode == 0, replay.stderr
        assert summary(replay.stderr)["acked"] == len(unsent_lines)
        assert failed.read_text() == ""
        if maybe.exists():  # msg ids: JetStream drops the ones it stored before
            again = await run_cli(
                str(maybe), *argv[:-3], "--failed-out", str(maybe), "--no-progress"
            )
            assert again.returncode == 0, again.stderr
        records = await read_jetstream(broker.url, topic, 2 * half)
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


async def test_value_format_json_re_serializes_compactly_on_kafka(
    tmp_path: Path, kafka_broker: LocalBroker
) -> None:
    """The default sends a JSONL line as it is; json sends the document (or field) compactly,
    as the producer's value_serializer writes it. Read back with aiokafka."""
    lines = [
        f'{{ "id" : "o-{i}",  "user": "ü{i % 3}", "n": [ {i}, {{"x": null}} ] }}' for i in range(30)
    ]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")

    async def run(topic: str, *flags: str) -> list[dict[str, Any]]:
        argv = ["--url", kafka_broker.url, "--topic", topic, "--format", "jsonl", *flags]
        result = await run_cli(str(source), *argv)
        assert result.returncode == 0, result.stderr
        return await read_kafka(kafka_broker.url, topic, len(lines))

    as_read = await run(f"t-{uuid.uuid4().hex[:8]}", "--key-field", "user")
    assert sorted(r["value"] for r in as_read) == sorted(line.encode() for line in lines)

    compact = await run(
        f"t-{uuid.uuid4().hex[:8]}", "--key-field", "user", "--value-format", "json"
    )
    expected = {
        f"o-{i}": f'{{"id":"o-{i}","user":"ü{i % 3}","n":[{i},{{"x":null}}]}}'.encode()
        for i in range(30)
    }
    assert {json.loads(r["value"])["id"]: r["value"] for r in compact} == expected
    assert {r["key"] for r in compact} == {"ü0".encode(), "ü1".encode(), "ü2".encode()}

    fields = await run(f"t-{uuid.uuid4().hex[:8]}", "--value-field", "id", "--value-format", "json")
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


async def test_value_format_avro_on_jetstream_and_replay_of_delivery_failures(
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
    url = nats_broker.jetstream_url
    flags = [
        "--url", url, "--topic", topic, "--format", "jsonl", "--key-field", "user",
        "--msg-id-field", "id", "--value-format", "avro", "--avro-schema", str(schema_file),
        "--schema-id", "7", "--timeout", "5", "--failed-out", str(failed),
    ]  # fmt: skip
    down = await run_cli(str(source), *flags)
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

    replay = await run_cli(str(failed), *flags, "-o", "create_stream=true")
    assert replay.returncode == 1, replay.stderr
    assert summary(replay.stderr) == {"records": 41, "acked": 40, "failed": 1}
    assert [json.loads(line)["id"] for line in failed.read_text().splitlines()] == ["bad"]
    parsed = fastavro.parse_schema(ORDER_SCHEMA)
    stored = await read_jetstream(nats_broker.url, topic, 40)
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


# ---------------------------------------------------------------------- Ctrl-C


def _interrupted_run(
    url: str, topic: str, lines: list[str], failed: Path, feed: str, rng: random.Random
) -> dict[str, int]:
    """Run the command on a pipe, send SIGINT at a random moment once the broker has acked a
    record, and return its summary. ``idle``: a few lines, then the pipe stays open with
    nothing to read; ``fast``: every line, written as fast as the command takes them."""
    flags = ["--format", "jsonl", "--key-field", "user", "--failed-out", str(failed)]
    flags += ["--no-progress", "--metrics-port", "0"]  # metrics: to see when the first ack came
    process = subprocess.Popen(
        [*CLI, "-", "--url", url, "--topic", topic, *flags],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdin is not None and process.stderr is not None
    stdin = process.stdin

    def write(chunk: list[str]) -> None:
        with contextlib.suppress(BrokenPipeError, ValueError, OSError):  # the command ended
            stdin.write("".join(line + "\n" for line in chunk))
            stdin.flush()

    writer = threading.Thread(
        target=lambda: [write(lines[i : i + 500]) for i in range(0, len(lines), 500)]
    )
    stderr = ""
    try:
        if feed == "idle":
            write(lines)
        else:
            writer.start()
        while (match := re.search(r"metrics on (http://\S+)", stderr)) is None:
            line = process.stderr.readline()
            assert line, stderr
            stderr += line
        _wait_for_an_ack(match[1])
        time.sleep(rng.uniform(0.0, 0.8))
        process.send_signal(signal.SIGINT)
        stderr += process.stderr.read()
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
        with contextlib.suppress(BrokenPipeError, OSError):
            stdin.close()
        if writer.is_alive():
            writer.join(timeout=60)
    assert process.returncode == 130, stderr
    for abort in ("Fatal Python error", "never awaited", "Traceback"):
        assert abort not in stderr, stderr
    return summary(stderr)


def _wait_for_an_ack(metrics_url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(metrics_url, timeout=10) as response:
            text = response.read().decode()
        if re.search(r"^producerkit_messages_acked_total [1-9]", text, re.MULTILINE):
            return
        time.sleep(0.05)
    raise AssertionError(f"no ack within {timeout} s")


@pytest.mark.parametrize("feed", ["idle", "fast"])
@pytest.mark.parametrize("broker", ["jetstream", "kafka"])
async def test_ctrl_c_exits_130_with_every_record_read_acked_or_in_the_failures_file(
    tmp_path: Path, request: pytest.FixtureRequest, broker: str, feed: str
) -> None:
    """Done when: SIGINT exits 130, read == acked + failed, every unsent record in --failed-out,
    no abort, on every interrupt (idle stdin and a fast pipe, at random moments)."""
    rng = random.Random()
    local: LocalBroker = request.getfixturevalue(
        f"{'nats' if broker == 'jetstream' else broker}_broker"
    )
    if broker == "jetstream":
        url = f"jetstream://{local.host_port}?create_stream=true"
    else:
        url = local.url
    for repetition in range(2):  # two random moments per case, eight per run (was four each)
        topic = f"interrupt-{uuid.uuid4().hex[:8]}"
        lines = [
            json.dumps({"id": f"{repetition}-{i}", "user": f"user-{i % 50}", "n": i})
            for i in range(200 if feed == "idle" else 300_000)
        ]
        failed = tmp_path / f"failed-{repetition}.jsonl"
        counts = await anyio.to_thread.run_sync(
            _interrupted_run, url, topic, lines, failed, feed, rng
        )
        read = counts["records"]
        assert read == counts["acked"] + counts["failed"], counts
        failed_lines = failed.read_text().splitlines()
        assert len(failed_lines) == counts["failed"]
        stored = [r["value"].decode() for r in await _read_back(local.url, topic, counts["acked"])]
        assert len(stored) == counts["acked"]
        # The records read are the input's first ones: each either stored or in the file, once.
        assert sorted(stored + failed_lines) == sorted(lines[:read])
        # idle: everything written was read; fast: interrupted mid-input
        assert read == len(lines) if feed == "idle" else 0 < read < len(lines)


async def _read_back(url: str, topic: str, expected: int) -> list[dict[str, Any]]:
    if url.startswith("kafka://"):
        return await read_kafka(url, topic, expected)
    return await read_jetstream(url, topic, expected)


# ---------------------------------------------------------------------- first hour


def test_csv_detected_from_the_extension_and_its_bom_dropped(tmp_path: Path) -> None:
    """An Excel export: a .csv with a UTF-8 BOM and a quoted multi-line field, no --format."""
    source = tmp_path / "export.csv"
    source.write_bytes(b'\xef\xbb\xbfid,note\r\n1,"two\r\nlines"\r\n2,plain\r\n')
    url, store = memory()
    assert main([str(source), "--url", url, "--topic", "t", "--key-field", "id"]) == 0
    assert [(r.key, json.loads(r.value)) for r in store.records] == [
        (b"1", {"id": "1", "note": "two\r\nlines"}),
        (b"2", {"id": "2", "note": "plain"}),
    ]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.csv", "csv"),
        ("A.CSV", "csv"),
        ("a.jsonl", "jsonl"),
        ("a.ndjson", "jsonl"),
        ("a.txt", "lines"),
        ("a", "lines"),
        ("-", "lines"),
    ],
)
def test_format_from_the_extension(name: str, expected: str) -> None:
    assert detect_format(name) == expected


def test_help_says_the_defaults() -> None:
    text = build_parser().format_help()
    for said in ("from the file's extension", "--one-by-one", "pipelined", "--max-rate"):
        assert said in " ".join(text.split()), said


def test_one_by_one_waits_for_each_ack(
    backend: BackendCase, topic: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.txt"
    source.write_text("".join(f"{i}\n" for i in range(50)))
    assert main([str(source), *backend_flags(backend), "--topic", topic, "--one-by-one"]) == 0
    assert summary(capsys.readouterr().err) == {"records": 50, "acked": 50, "failed": 0}
    if backend.spec.stores_records:  # each partition holds its records in the file's order
        stored = anyio.run(backend.read, topic, 50)
        assert sorted(r["value"] for r in stored) == sorted(b"%d" % i for i in range(50))
        for partition in {r.get("partition") for r in stored}:
            numbers = [int(r["value"]) for r in stored if r.get("partition") == partition]
            assert numbers == sorted(numbers)


@pytest.mark.parametrize("removed", [["--nonblocking"], ["--concurrent-task-limit", "10"]])
def test_removed_flags_are_unknown_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], removed: list[str]
) -> None:
    source = tmp_path / "in.txt"
    source.write_text("a\n")
    with pytest.raises(SystemExit) as exit_info:
        main([str(source), "--url", "null://", "--topic", "t", *removed])
    assert exit_info.value.code == 2
    assert f"unrecognized arguments: {removed[0]}" in capsys.readouterr().err


def test_setting_flags_agree_with_producer_options() -> None:
    """The command's setting flags are exactly the ProducerOptions fields marked ``cli``: each
    named after its field, converting to its text type, with its doc as help and no default."""
    fields = {field.name: field for field in attrs.fields(ProducerOptions) if field.metadata["cli"]}
    actions = {action.dest: action for action in add_setting_flags(argparse.ArgumentParser())}
    assert list(actions) == list(fields) == [field.name for field in setting_fields()]
    assert set(fields) <= set(settings.SETTINGS)  # so settings.load takes every one
    for name, field in fields.items():
        action, flag, kind = actions[name], "--" + name.replace("_", "-"), field.metadata["text"]
        assert action.option_strings[0] == flag
        assert set(action.option_strings[1:]) <= {
            flag.replace("--", "--no-"),
            *SHORT_OPTIONS.get(name, ()),
        }
        assert action.help is not None and action.help.replace("%%", "%") == field.metadata["doc"]
        assert action.default is None
        if kind is bool:
            assert isinstance(action, argparse.BooleanOptionalAction)
        else:
            assert action.type is kind
    assert set(SHORT_OPTIONS) <= set(fields)

    # The command's parser has them all, unset by default, and no flag for the other fields.
    parser = build_parser()
    unset = parser.parse_args([])
    assert all(getattr(unset, name) is None for name in fields)
    for field in attrs.fields(ProducerOptions):
        if field.name not in fields:
            flag = "--" + field.name.replace("_", "-")
            assert parser.parse_known_args([flag, "x"])[1][0] == flag, field.name


def test_setting_flags_convert_and_reach_the_producer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parsed = build_parser().parse_args(
        ["-t", "orders", "--max-in-flight-bytes", "4096", "--resume-at", "0.9", "--propagate-trace"]
    )
    assert (parsed.topic, parsed.max_in_flight_bytes, parsed.resume_at) == ("orders", 4096, 0.9)
    assert parsed.propagate_trace is True
    assert build_parser().parse_args(["--no-propagate-trace"]).propagate_trace is False

    source = tmp_path / "in.txt"
    source.write_text("a\nb\n")
    url, store = memory()
    argv = [str(source), "--url", url, "--topic", "t"]
    flags = ["--max-in-flight-bytes", "4096", "--resume-at", "0.9", "--keyless", "round_robin"]
    assert main([*argv, *flags, "--no-propagate-trace"]) == 0
    assert [r.value for r in store.records] == [b"a", b"b"]
    assert main([*argv, "--resume-at", "2"]) == 2  # checked by ProducerOptions
    assert "resume_at must be a number from 0 to 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--max-in-flight-bytes", "many"])
    assert exit_info.value.code == 2
    assert "invalid int value: 'many'" in capsys.readouterr().err


def test_progress_line_fits_80_columns() -> None:
    from rich.console import Console
    from rich.progress import Progress

    for width in (80, 120):
        console = Console(file=io.StringIO(), width=width)
        progress = Progress(*progress_columns(width), console=console)
        progress.add_task(
            "→ a-topic-name",
            total=100,
            records=12_345_678,
            rate="1.23M",
            in_flight=10_000,
            acked=12_335_678,
            failed=12_345,
        )
        console.print(progress.make_tasks_table(progress.tasks))
        line = console.file.getvalue()  # type: ignore[attr-defined]
        assert "…" not in line and line.count("\n") == 1, line
        for number in ("12,345,678", "1.23M/s", "10,000", "12,335,678", "12,345"):
            assert number in line, (number, line)


def test_hints_in_cli_syntax() -> None:
    assert (
        cli_syntax("no stream for subject 'orders': create one or pass create_stream=True")
        == "no stream for subject 'orders': create one or pass -o create_stream=true"
    )


def test_a_clean_run_leaves_an_empty_failures_file_to_replay(
    backend: BackendCase, topic: str, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"user": "u1"}\n')
    failed = tmp_path / "failed.jsonl"
    argv = [*backend_flags(backend), "--topic", topic, "--key-field", "user"]
    argv += ["--failed-out", str(failed)]
    assert main([str(source), *argv]) == 0
    assert failed.read_bytes() == b""
    assert main([str(failed), *argv]) == 0  # the quickstart's replay step, after a clean run
    if backend.spec.stores_records:
        assert [r["value"] for r in anyio.run(backend.read, topic, 1)] == [b'{"user": "u1"}']


def test_rate_flags_reach_the_producer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.txt"
    source.write_text("".join(f"{i}\n" for i in range(20)))
    url, store = memory()
    argv = [str(source), "--url", url, "--topic", "t"]
    started = time.perf_counter()
    assert main([*argv, "--max-rate", "40"]) == 0
    # 20 messages at 40/s: about half a second after the first; far less would mean no limit.
    assert time.perf_counter() - started > 0.3
    assert len(store.records) == 20
    assert main([*argv, "--max-rate", "0"]) == 2
    assert "max_rate must be a positive number" in capsys.readouterr().err
    assert main([*argv, "--max-bytes-rate", "-1"]) == 2
    assert "max_bytes_rate must be a positive number" in capsys.readouterr().err


def test_ctrl_c_while_starting_exits_130_without_a_traceback(tmp_path: Path) -> None:
    """SIGINT as soon as the metrics server is up: before or just as the run takes the signal."""
    for _ in range(3):
        process = subprocess.Popen(
            [*CLI, "-", "--url", "null://", "--topic", "t", "--metrics-port", "0"],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stderr is not None
        try:
            stderr = process.stderr.readline()
            assert "metrics on" in stderr, stderr
            process.send_signal(signal.SIGINT)
            stderr += process.stderr.read()
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
            assert process.stdin is not None
            process.stdin.close()
        assert process.returncode == 130, stderr
        assert "Traceback" not in stderr and "interrupted" in stderr, stderr


@pytest.mark.brokers  # starts a broker of its own, and freezes it
async def test_a_second_ctrl_c_stops_waiting_for_acks(tmp_path: Path) -> None:
    """The broker stops answering: the first Ctrl-C waits for the acks in flight, the second
    fails them (Purged) into the failures file, and the accounting still adds up."""
    lines = [json.dumps({"id": i, "user": f"u{i % 7}"}) for i in range(5000)]
    failed = tmp_path / "failed.jsonl"
    flags = ["--format", "jsonl", "--failed-out", str(failed), "--timeout", "300"]
    with start_nats(jetstream=True, workdir=tmp_path / "nats") as broker:
        assert broker.process is not None
        process = subprocess.Popen(
            [*CLI, "-", "--url", f"{broker.url}?create_stream=true", "--topic", "t", *flags],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdin is not None and process.stderr is not None
        try:
            process.stdin.write("".join(line + "\n" for line in lines[:2500]))
            process.stdin.flush()
            await _wait_for_count(broker.url, "t", 2500)
            os.kill(broker.process.pid, signal.SIGSTOP)  # no more acks
            process.stdin.write("".join(line + "\n" for line in lines[2500:]))
            process.stdin.flush()
            await anyio.sleep(1.0)
            process.send_signal(signal.SIGINT)
            assert "Ctrl-C again" in await anyio.to_thread.run_sync(process.stderr.readline)
            process.send_signal(signal.SIGINT)
            stderr = await anyio.to_thread.run_sync(process.stderr.read)
            wait = functools.partial(process.wait, timeout=60)  # not the 300 s --timeout
            await anyio.to_thread.run_sync(wait)
        finally:
            os.kill(broker.process.pid, signal.SIGCONT)
            if process.poll() is None:
                process.kill()
            process.stdin.close()
    assert process.returncode == 130, stderr
    counts = summary(stderr)
    assert counts["records"] == counts["acked"] + counts["failed"] and counts["failed"] > 0
    assert "Purged" in stderr
    maybe = failed.with_name("failed.possibly-stored.jsonl")
    failed_lines = failed.read_text().splitlines()
    failed_lines += maybe.read_text().splitlines() if maybe.exists() else []
    assert len(failed_lines) == counts["failed"] and set(failed_lines) <= set(lines)
