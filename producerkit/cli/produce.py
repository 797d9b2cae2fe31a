"""``producerkit produce``: publish each record of a file or stdin, kcat-style.

Every record read ends up in exactly one of two places: acknowledged by the broker, or written to
``--failed-out FILE`` in the input's own format (and counted in the summary, and the exit code is
1). A rerun with that file as input (and the same flags) therefore retries exactly what failed::

    producerkit produce --url jetstream://127.0.0.1:4222 --topic orders \\
        --key-field user --failed-out failed.jsonl orders.jsonl
    producerkit produce ... --failed-out failed.jsonl failed.jsonl     # retry, same flags

A record can fail in three ways, all written to the failures file: the broker did not ack it in
``--timeout`` seconds or refused it (``on_error``, or the exception of a blocking produce), the
producer refused it at the call (too large, bad header), or the input line could not be parsed
(written verbatim, so it can be fixed and replayed). An interrupted run (Ctrl-C, SIGTERM: exit
130) adds the records it read and never sent, as ``Interrupted``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import anyio

import producerkit as pk
from producerkit import settings
from producerkit.cli._args import ArgumentParser
from producerkit.cli._reader import InputReader
from producerkit.cli._signals import interruptible
from producerkit.cli.values import VALUE_FORMATS, ValueFormat, value_format
from producerkit.errors import (
    ConfigurationError,
    MessageError,
    ProduceError,
    ProducerClosed,
    ProducerError,
)

if TYPE_CHECKING:
    from anyio.abc import TaskGroup, TaskStatus

    from producerkit.cli.metrics import Metrics

FORMATS = ("lines", "jsonl", "csv")

#: A parsed record: (value, key, msg_id). The value is bytes, or with a structured value format
#: (json, avro) the parsed JSON value the producer serializes.
Parsed = tuple[Any, bytes | None, str | None]
#: Writes one failed record back: (value, key, msg_id), the value as :data:`Parsed` has it or as
#: the bytes the producer made of it.
Writer = Callable[[Any, bytes | None, str | None], None]


class InvalidRecord(Exception):
    """An input record that cannot become a message; ``raw`` is its original text."""

    def __init__(self, raw: bytes, reason: str) -> None:
        super().__init__(reason)
        self.raw = raw


class Interrupted(Exception):
    """Why a record read was never sent: the run was interrupted (Ctrl-C, SIGTERM) first."""


def _cli_syntax(message: str) -> str:
    """A message's hints in this command's syntax: a producer keyword written as
    ``create_stream=True`` reads ``-o create_stream=true``."""
    return re.sub(
        r"\b([a-z_]+)=(True|False)\b",
        lambda match: f"-o {match[1]}={match[2].lower()}",
        message,
    )


# ---------------------------------------------------------------------- formats


class Format:
    """Parses input records and writes failed ones back in the same format.

    ``records`` turns input records into (value, key, msg_id) or InvalidRecord; ``open_writer``
    is its inverse for what a rerun needs: parsing a written record gives the same value, key
    and msg_id again. ``values`` (``--value-format``) says whether a value is bytes or a parsed
    JSON value, and whether it must be UTF-8 text.
    """

    def __init__(self, args: argparse.Namespace, values: ValueFormat | None = None) -> None:
        self.values = values if values is not None else ValueFormat()
        self.key_field: str | None = args.key_field
        self.value_field: str | None = args.value_field
        self.msg_id_field: str | None = args.msg_id_field
        self.key_delimiter: bytes | None = (
            args.key_delimiter.encode() if args.key_delimiter is not None else None
        )

    def records(self, lines: Iterable[bytes]) -> Iterator[Parsed | InvalidRecord]:
        raise NotImplementedError

    def open_writer(self, file: IO[bytes]) -> Writer:
        raise NotImplementedError

    def preamble(self) -> bytes:
        """What a failures file starts with, before any record (CSV: the input's header)."""
        return b""

    def not_text(self, value: bytes) -> str | None:
        """Why ``value`` may not be sent with ``--value-format str`` (None: it may)."""
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"the value is not UTF-8 text ({exc.reason} at byte {exc.start})"
        return None


class LinesFormat(Format):
    """A line is the value; with ``--key-delimiter D``, ``KEY<D>VALUE`` (like kcat's ``-K``).
    With a structured value format, each value is a JSON document."""

    def records(self, lines: Iterable[bytes]) -> Iterator[Parsed | InvalidRecord]:
        delimiter = self.key_delimiter
        structured, text = self.values.structured, self.values.text
        for line in lines:
            value = _strip_newline(line)
            if not value:
                continue
            key = None
            if delimiter is not None:
                key, found, value = value.partition(delimiter)
                if not found:
                    yield InvalidRecord(line, f"no key delimiter {delimiter!r}")
                    continue
            if not structured:
                reason = self.not_text(value) if text else None
                yield (value, key, None) if reason is None else InvalidRecord(line, reason)
                continue
            try:
                document = _json_value(json.loads(value))
            except ValueError as exc:
                yield InvalidRecord(line, f"invalid JSON: {exc}")
            except InvalidRecord as invalid:
                yield InvalidRecord(line, str(invalid))
            else:
                yield document, key, None

    def open_writer(self, file: IO[bytes]) -> Writer:
        delimiter = self.key_delimiter
        structured = self.values.structured
        to_object = self.values.to_object

        def write(value: Any, key: bytes | None, msg_id: str | None) -> None:
            if delimiter is not None:
                file.write(key or b"")
                file.write(delimiter)
            file.write(_compact(to_object(value)) if structured else value)
            file.write(b"\n")

        return write


class JsonlFormat(Format):
    """One JSON document per line. The whole line is the value unless ``--value-field``; with
    a structured value format, the parsed document (or field) is."""

    def records(self, lines: Iterable[bytes]) -> Iterator[Parsed | InvalidRecord]:
        key_field, value_field, id_field = self.key_field, self.value_field, self.msg_id_field
        structured, text = self.values.structured, self.values.text
        needs_parse = structured or any(f is not None for f in (key_field, value_field, id_field))
        for line in lines:
            raw = _strip_newline(line)
            if not raw.strip():
                continue
            if not needs_parse:
                # Sent as read: no parse, no re-serialisation, the bytes on the wire are the file's.
                reason = self.not_text(raw) if text else None
                yield (raw, None, None) if reason is None else InvalidRecord(line, reason)
                continue
            try:
                document = json.loads(raw)
            except ValueError as exc:
                yield InvalidRecord(line, f"invalid JSON: {exc}")
                continue
            try:
                yield _fields(document, raw, key_field, value_field, id_field, structured)
            except InvalidRecord as invalid:
                invalid.raw = line
                yield invalid

    def open_writer(self, file: IO[bytes]) -> Writer:
        key_field, value_field, id_field = self.key_field, self.value_field, self.msg_id_field
        structured = self.values.structured
        to_object = self.values.to_object

        def write(value: Any, key: bytes | None, msg_id: str | None) -> None:
            if value_field is None and not structured:
                file.write(value)  # the line itself, which holds the key and id fields too
            elif value_field is None:
                # The document, with the key and id fields it had (Avro may have left them out)
                document = _with_fields(to_object(value), key_field, key, id_field, msg_id)
                file.write(_compact(document))
            else:
                # Only the fields a rerun reads; strings re-encode to exactly these bytes.
                document = _with_fields({}, key_field, key, id_field, msg_id)
                document[value_field] = to_object(value) if structured else _text(value)
                file.write(json.dumps(document, ensure_ascii=False).encode())
            file.write(b"\n")

        return write


class CsvFormat(Format):
    """CSV with a header row. The value is the row as a JSON object unless ``--value-field``
    (with a structured value format: the row as a dict of strings, or the cell's string)."""

    header: list[str] | None = None  # the input's, once read

    def records(self, lines: Iterable[bytes]) -> Iterator[Parsed | InvalidRecord]:
        reader = csv.reader(line.decode("utf-8", "surrogateescape") for line in lines)
        header = next(reader, None)
        if header is None:
            return
        self.header = header
        for name in (self.key_field, self.value_field, self.msg_id_field):
            if name is not None and name not in header:
                raise ConfigurationError(f"CSV header {header} has no column {name!r}")
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raw = _csv_line(row)
                yield InvalidRecord(raw, f"{len(row)} columns, the header has {len(header)}")
                continue
            document = dict(zip(header, row, strict=True))
            value: Any = document if self.value_field is None else document[self.value_field]
            if not self.values.structured:
                # Bytes as read: cells that are not UTF-8 keep their bytes (surrogateescape).
                value = _encode(_compact_text(value) if self.value_field is None else value)
                reason = self.not_text(value) if self.values.text else None
                if reason is not None:
                    yield InvalidRecord(_csv_line(row), reason)
                    continue
            key = None
            if self.key_field is not None and document[self.key_field] != "":
                key = _encode(document[self.key_field])
            msg_id = None
            if self.msg_id_field is not None:
                msg_id = document[self.msg_id_field] or None
            yield value, key, msg_id

    def preamble(self) -> bytes:
        # The input's header: rows the reader could not use are written back as they were.
        return _csv_line(self.header) if self.header is not None else b""

    def open_writer(self, file: IO[bytes]) -> Writer:
        structured = self.values.structured
        to_object = self.values.to_object

        def write(value: Any, key: bytes | None, msg_id: str | None) -> None:
            if self.value_field is None:
                # the whole row, as read (Avro may have left out the key and id columns)
                row = to_object(value) if structured else json.loads(value)
                row = _with_fields(row, self.key_field, key, self.msg_id_field, msg_id or "")
            else:  # the columns a rerun reads; the others empty
                row = _with_fields({}, self.key_field, key, self.msg_id_field, msg_id or "")
                row[self.value_field] = to_object(value) if structured else _text(value)
            file.write(_csv_line([row.get(name, "") for name in self.header or ()]))

        return write


def _fields(
    document: object,
    raw: bytes,
    key_field: str | None,
    value_field: str | None,
    id_field: str | None,
    structured: bool = False,
) -> Parsed:
    """A JSONL document's (value, key, msg_id): the value is the line (or the document, when
    ``structured``), or its ``value_field`` as bytes (or as it is, when ``structured``)."""
    named = key_field is not None or value_field is not None or id_field is not None
    if named and not isinstance(document, dict):
        raise InvalidRecord(raw, f"expected a JSON object, got {type(document).__name__}")
    if not named:
        return _json_value(document), None, None
    assert isinstance(document, dict)
    key = msg_id = None
    if key_field is not None:
        if key_field not in document:
            raise InvalidRecord(raw, f"no key field {key_field!r}")
        key = _field_bytes(document[key_field])
    if id_field is not None:
        if id_field not in document:
            raise InvalidRecord(raw, f"no msg-id field {id_field!r}")
        field = document[id_field]
        msg_id = field if isinstance(field, str) else json.dumps(field)
    if value_field is None:
        return (document if structured else raw), key, msg_id
    if value_field not in document:
        raise InvalidRecord(raw, f"no value field {value_field!r}")
    if structured:
        return _json_value(document[value_field]), key, msg_id
    value = _field_bytes(document[value_field])
    return (value if value is not None else b"null"), key, msg_id


def _json_value(value: object) -> object:
    """A parsed JSON value the producer will serialize: null is refused (the producer sends no
    value for None; the ``bytes`` value format sends a JSON null field as ``null``)."""
    if value is None:
        raise InvalidRecord(b"", "the value is JSON null: nothing to serialize")
    return value


def _with_fields(
    document: Any, key_field: str | None, key: bytes | None, id_field: str | None, msg_id: Any
) -> Any:
    """``document`` (if a dict) with the key and msg-id fields a rerun reads, where missing."""
    if isinstance(document, dict):
        if key_field is not None and key_field not in document:
            document[key_field] = _text(key)
        if id_field is not None and id_field not in document:
            document[id_field] = msg_id
    return document


def _compact(value: object) -> bytes:
    """A JSON value as one line of compact UTF-8 JSON (lone surrogates back to their bytes)."""
    return _encode(_compact_text(value))


def _compact_text(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _field_bytes(field: object) -> bytes | None:
    """A JSON field as message bytes: strings as their UTF-8, null as None, others as JSON."""
    if field is None:
        return None
    if isinstance(field, str):
        return field.encode()
    return json.dumps(field, ensure_ascii=False, separators=(",", ":")).encode()


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "surrogateescape")


def _strip_newline(line: bytes) -> bytes:
    if line.endswith(b"\n"):
        line = line[:-1]
        if line.endswith(b"\r"):
            line = line[:-1]
    return line


def _csv_line(row: Sequence[str | None]) -> bytes:
    class _Line:
        text = ""

        def write(self, text: str) -> None:
            self.text += text

    out = _Line()
    csv.writer(out, lineterminator="\n").writerow(row)
    return out.text.encode("utf-8", "surrogateescape")


_FORMAT_CLASSES: dict[str, type[Format]] = {
    "lines": LinesFormat,
    "jsonl": JsonlFormat,
    "csv": CsvFormat,
}


# ---------------------------------------------------------------------- failures file


class FailureSink:
    """Counts failed records by reason and writes them to ``--failed-out`` as they happen.

    Writes go to ``FILE.partial`` and replace FILE at the end, so FILE may also be this run's
    input (the usual retry). When nothing failed, FILE is created or emptied: it always exists
    after a run and holds what is left to send; replaying an empty file sends nothing.
    """

    def __init__(self, fmt: Format, path: Path | None, metrics: Metrics | None = None) -> None:
        self.path = path
        self._metrics = metrics
        self.count = 0
        self.reasons: dict[str, int] = {}
        self.examples: list[str] = []
        self._finished = False
        self._fmt = fmt
        self._file: IO[bytes] | None = None
        self._write: Writer | None = None
        self._partial = path.with_name(path.name + ".partial") if path is not None else None

    def _open(self) -> IO[bytes] | None:
        if self._file is None and self._partial is not None:
            self._file = open(self._partial, "wb")  # noqa: SIM115 - closed in finish()
            self._file.write(self._fmt.preamble())
            self._write = self._fmt.open_writer(self._file)
        return self._file

    def add(self, value: Any, key: bytes | None, msg_id: str | None, exc: BaseException) -> None:
        self._count(exc)
        if self._metrics is not None and isinstance(exc, MessageError):
            self._metrics.rejected(exc)  # refused at the call: never a message
        if self._open() is not None:
            assert self._write is not None
            self._write(value, key, msg_id)

    def add_failure(self, failure: pk.Failure) -> None:
        self.add(failure.value, failure.key, failure.msg_id, failure.exception)

    def add_raw(self, raw: bytes, exc: BaseException) -> None:
        self._count(exc)
        if self._metrics is not None:
            self._metrics.rejected(exc)
        file = self._open()
        if file is not None:
            file.write(raw if raw.endswith(b"\n") else raw + b"\n")

    def _count(self, exc: BaseException) -> None:
        self.count += 1
        name = type(exc).__name__
        seen = self.reasons.get(name, 0)
        self.reasons[name] = seen + 1
        if not seen and len(self.examples) < 3:
            # One example per kind of failure, so a user sees why without a log per record.
            self.examples.append(f"{name}: {_cli_syntax(str(exc))}")

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self._file is not None:
            self._file.close()
        if self.path is None or self._partial is None:
            return
        if self.count:
            os.replace(self._partial, self.path)
        else:  # an empty file: replaying it (the usual next step) sends nothing and exits 0
            self.path.write_bytes(b"")

    def add_unsent(self, item: Parsed | InvalidRecord) -> None:
        """A record read but never handed to the producer (the run was interrupted)."""
        if isinstance(item, InvalidRecord):
            self.add_raw(item.raw, item)
        else:
            self.add(*item, Interrupted("read, not sent: the run was interrupted"))

    def write_raw(self, data: bytes) -> None:
        """Input copied as it is (nothing could be sent); counted by :meth:`input_unsent`."""
        file = self._open()
        if file is not None:
            file.write(data)

    def input_unsent(self, records: int, exc: BaseException) -> None:
        """The whole input (``records`` of it) was left to send because of ``exc``."""
        name = type(exc).__name__
        self.count += records
        self.reasons[name] = self.reasons.get(name, 0) + records
        self.examples.append(f"{name}: {_cli_syntax(str(exc))}")


# ---------------------------------------------------------------------- progress


class _Progress:
    """A rich progress line, refreshed ~10 times a second by a task, never per record.

    ``records`` counts the records taken from the reader; the bar follows the bytes it read.
    """

    def __init__(
        self, enabled: bool, total_bytes: int | None, label: str, bytes_read: Callable[[], int]
    ) -> None:
        self.records = 0
        self._bytes_read = bytes_read
        self._producer: pk.Producer | None = None
        self._failures: FailureSink | None = None
        self._progress: Any = None
        self._started = time.perf_counter()
        if not enabled:
            return
        try:
            from rich.console import Console
            from rich.progress import Progress
        except ImportError:
            print(
                'producerkit produce: no progress bar without rich: pip install "producerkit[cli]"',
                file=sys.stderr,
            )
            return
        console = Console(stderr=True)
        self._progress = Progress(
            *progress_columns(console.width),
            console=console,
            auto_refresh=False,
            transient=False,
        )
        self._id = self._progress.add_task(
            label, total=total_bytes, records=0, rate="0", in_flight=0, acked=0, failed=0
        )

    def start(self, producer: pk.Producer, failures: FailureSink) -> None:
        self._producer = producer
        self._failures = failures
        self._started = time.perf_counter()
        if self._progress is not None:
            self._progress.start()

    async def refresh_every(self, seconds: float) -> None:
        """Refresh until cancelled (a task of the run's task group)."""
        if self._progress is None:
            return
        while True:
            self.refresh()
            await anyio.sleep(seconds)

    def refresh(self) -> None:
        if self._progress is None or self._producer is None or self._failures is None:
            return
        stats = self._producer.stats
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        self._progress.update(
            self._id,
            completed=self._bytes_read(),
            records=self.records,
            rate=_short_number(self.records / elapsed),
            in_flight=stats.in_flight,
            acked=stats.acked,
            failed=self._failures.count,
            refresh=True,
        )

    def stop(self) -> None:
        if self._progress is not None:
            self.refresh()
            self._progress.stop()


#: Below this many columns the progress line is the counts alone (no label, bar or clock).
_WIDE = 100


def progress_columns(width: int) -> list[Any]:
    """The progress line's columns for a terminal ``width`` wide: the counts in one column that
    never wraps or truncates; the label, the bar (taking what is left) and the clock only
    where there is room for them."""
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
    from rich.table import Column

    counts = TextColumn(
        "{task.fields[records]:,} read {task.fields[rate]}/s  acked {task.fields[acked]:,}  "
        "failed {task.fields[failed]:,}  in flight {task.fields[in_flight]:,}",
        table_column=Column(no_wrap=True),
    )
    if width < _WIDE:
        return [counts]
    return [
        TextColumn("[bold]{task.description}"),
        BarColumn(bar_width=None),
        counts,
        TimeElapsedColumn(),
    ]


def _short_number(number: float) -> str:
    """``number`` in at most 5 characters: 935, 63.1k, 1.23M."""
    for divisor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if number >= divisor:
            scaled = number / divisor
            return f"{scaled:.3g}{suffix}" if scaled < 1000 else f"{scaled:.0f}{suffix}"
    return f"{number:.0f}"


# ---------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="producerkit produce",
        description="Publish each record of a file (or stdin) to Kafka, NATS or JetStream.",
        epilog=(
            "Settings not given as flags come from PRODUCERKIT_* environment variables, then a "
            "TOML file (--config, $PRODUCERKIT_CONFIG or ./producerkit.toml). Exit code: 0 all "
            "acked, 1 some failed (see --failed-out), 2 usage or configuration error, 130 "
            "interrupted."
        ),
    )
    parser.add_argument("file", nargs="?", default="-", help="input file; - or none for stdin")
    parser.add_argument("--url", help="kafka://, jetstream://, nats://, memory:// or null:// URL")
    parser.add_argument("--topic", "-t", help="topic (Kafka) or subject (NATS)")
    parser.add_argument("--config", help="TOML settings file (default ./producerkit.toml)")
    parser.add_argument(
        "--format",
        "-f",
        choices=FORMATS,
        help="lines: a message per line; jsonl: a JSON document per line; csv: a header row, then "
        "a message per row (multi-line quoted fields kept). Default: from the file's extension "
        "(.csv, .jsonl or .ndjson), else lines (stdin too)",
    )
    parser.add_argument(
        "--value-format",
        choices=VALUE_FORMATS,
        default="bytes",
        help=(
            "how each value is sent: bytes (default) as read, a JSONL/CSV field's text, a CSV row "
            "as a JSON object; str: the same, refusing values that are not UTF-8; json: the "
            "value (a line, a JSONL document or field, a CSV row or cell) as compact JSON; avro: "
            "that JSON value as Avro (--avro-schema, --schema-id)"
        ),
    )
    parser.add_argument("--avro-schema", metavar="FILE", help="avro: the schema (.avsc JSON)")
    parser.add_argument(
        "--schema-id", type=int, metavar="N", help="avro: the schema's registry id (framed)"
    )
    parser.add_argument("--key-field", help="jsonl/csv: the field whose value is the key")
    parser.add_argument("--value-field", help="jsonl/csv: send only this field as the value")
    parser.add_argument(
        "--msg-id-field", help="jsonl/csv: field used as msg_id (JetStream de-duplicates reruns)"
    )
    parser.add_argument("--key-delimiter", help="lines: split each line into KEY<delim>VALUE")
    parser.add_argument(
        "--header",
        "-H",
        action="append",
        default=[],
        metavar="K=V",
        help="add this header to every message (repeatable)",
    )
    parser.add_argument("--partitioner", help="xxhash (default), murmur2, memphis or crc32")
    parser.add_argument(
        "--one-by-one",
        action="store_true",
        help="wait for each record's ack before sending the next (default: pipelined, up to "
        "--max-in-flight-messages in flight, each key's records kept in order)",
    )
    parser.add_argument(  # pipelined is the default now; the flag stays accepted
        "--nonblocking", action="store_true", help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--max-rate", type=float, metavar="N", help="send at most N messages per second"
    )
    parser.add_argument(
        "--max-bytes-rate",
        type=float,
        metavar="B",
        help="send at most B bytes (values and keys) per second",
    )
    parser.add_argument("--max-in-flight-messages", type=int, help="window size (default 1000)")
    parser.add_argument(  # the old name, for one more release
        "--concurrent-task-limit",
        dest="max_in_flight_messages",
        type=int,
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--timeout", type=float, help="seconds a message may stay unacked")
    parser.add_argument("--connections", type=int, help="connections to the broker (default 1)")
    parser.add_argument(
        "--option",
        "-o",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="backend option, e.g. -o create_stream=true -o linger_ms=5 (repeatable)",
    )
    parser.add_argument(
        "--failed-out",
        metavar="FILE",
        help="write records that failed here, in the input format, to rerun them",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar (default: when stderr is a terminal)",
    )
    add_metrics_arguments(parser)
    return parser


def add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--metrics-linger`` (shared with ``producerkit demo``)."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics (0: a free port, "
        'printed); needs pip install "producerkit[metrics]"',
    )
    parser.add_argument(
        "--metrics-linger",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --metrics-port: keep serving the final metrics this long after the run "
        "(Ctrl-C ends it), so a scraper sees them",
    )


def start_metrics(args: argparse.Namespace) -> Metrics | None:
    """The metrics server for ``--metrics-port`` (None without it); ConfigurationError if it
    cannot start. prometheus-client is imported only here."""
    if args.metrics_port is None:
        if args.metrics_linger:
            raise ConfigurationError("--metrics-linger needs --metrics-port")
        return None
    if not 0 <= args.metrics_port <= 65535 or args.metrics_linger < 0:
        raise ConfigurationError("--metrics-port takes 0-65535 and --metrics-linger seconds >= 0")
    from producerkit.cli.metrics import Metrics

    metrics = Metrics()
    metrics.serve(args.metrics_port)
    return metrics


def linger(metrics: Metrics | None, seconds: float) -> None:
    """Keep serving the final metrics for ``seconds`` (Ctrl-C ends it early), then stop."""
    if metrics is None:
        return
    try:
        with interruptible():
            if seconds > 0:
                time.sleep(seconds)
    except KeyboardInterrupt:
        pass
    finally:
        metrics.close()


def _pairs(items: list[str], what: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        name, found, value = item.partition("=")
        if not found or not name:
            raise ConfigurationError(f"{what} {item!r} must look like NAME=VALUE")
        pairs[name] = value
    return pairs


def detect_format(file: str) -> str:
    """The input format a file's extension names (``lines`` for stdin and anything else)."""
    return _FORMATS_BY_EXTENSION.get(Path(file).suffix.lower(), "lines") if file != "-" else "lines"


_FORMATS_BY_EXTENSION = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.one_by_one and args.nonblocking:
            raise ConfigurationError("--one-by-one and --nonblocking contradict each other")
        args.format = args.format or detect_format(args.file)
        values = value_format(args.value_format, args.avro_schema, args.schema_id)
        fmt = _FORMAT_CLASSES[args.format](args, values)
        if args.format == "lines" and (args.key_field or args.value_field or args.msg_id_field):
            raise ConfigurationError(
                "--key-field/--value-field/--msg-id-field need --format jsonl or csv"
            )
        if args.format != "lines" and args.key_delimiter is not None:
            raise ConfigurationError("--key-delimiter is for --format lines")
        headers = _pairs(args.header, "--header") or None
        overrides: dict[str, Any] = _pairs(args.option, "--option")
        overrides.update(
            url=args.url,
            topic=args.topic,
            partitioner=args.partitioner,
            max_in_flight_messages=args.max_in_flight_messages,
            timeout=args.timeout,
            connections=args.connections,
            max_rate=args.max_rate,
            max_bytes_rate=args.max_bytes_rate,
        )
        kwargs = settings.load(args.config, **overrides)
        if "topic" not in kwargs:
            raise ConfigurationError("no topic: pass --topic, set PRODUCERKIT_TOPIC or topic =")
        if args.file != "-" and not os.path.isfile(args.file):
            raise ConfigurationError(f"no such file: {args.file}")
        metrics = start_metrics(args)
    except ConfigurationError as exc:
        parser.error(str(exc))  # exits with code 2
    failed_out = Path(args.failed_out) if args.failed_out else None
    show_progress = args.progress if args.progress is not None else sys.stderr.isatty()
    try:
        return anyio.run(_produce, args, fmt, kwargs, headers, failed_out, show_progress, metrics)
    except ConfigurationError as exc:  # e.g. a backend option, checked when the Producer is built
        print(f"producerkit produce: error: {_cli_syntax(str(exc))}", file=sys.stderr)
        return 2
    finally:
        linger(metrics, args.metrics_linger)


def _open_input(name: str) -> tuple[IO[bytes], int | None]:
    if name == "-":
        return sys.stdin.buffer, None
    file = open(name, "rb")  # noqa: SIM115 - closed by the caller
    return file, os.fstat(file.fileno()).st_size


class _Run:
    """One run: the producer, the input's reader, the failures file, and what a signal does.

    SIGINT and SIGTERM are taken on the event loop, never as a KeyboardInterrupt raised at a
    random point: they cancel what the run waits for and stop the reader. Every record read and
    not handed to the producer then goes to the failures file, and the producer closes, settling
    what is in flight (acked, or failed and written by ``on_error``). So the summary's ``read ==
    acked + failed`` holds after an interrupt as after a full run.
    """

    def __init__(
        self,
        producer: pk.Producer,
        reader: InputReader[Parsed | InvalidRecord],
        failures: FailureSink,
        progress: _Progress,
        headers: dict[str, str] | None,
        pipelined: bool,
        metrics: Metrics | None,
    ) -> None:
        self.producer = producer
        self.reader = reader
        self.failures = failures
        self.progress = progress
        self.headers = headers
        self.pipelined = pipelined
        self.metrics = metrics
        self.interrupted = False
        self.records_copied: int | None = None  # the producer never started: input copied
        self._scope: anyio.CancelScope | None = None
        self._closing = False
        # The batch being produced and how much of it is done, for what an interrupt leaves.
        self._batch: list[Parsed | InvalidRecord] = []
        self._done = 0
        self._in_call = False  # inside produce() for self._batch[self._done]
        self._calls = 0  # produce() calls made ...
        self._refused = 0  # ... and refused at the call, never a message

    @property
    def records_read(self) -> int:
        return self.reader.parsed if self.records_copied is None else self.records_copied

    async def watch_signals(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Until cancelled: a SIGINT or SIGTERM interrupts the run; another one while the
        producer closes stops waiting for the messages in flight (they fail as Purged)."""
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started()
            async for _ in signals:
                if self._closing and self.interrupted:
                    self.producer.purge()  # on_error writes each to the failures file
                self.interrupted = True
                self.reader.stop()
                if self._scope is not None:
                    self._scope.cancel()

    @contextlib.contextmanager
    def _interruptible(self) -> Iterator[None]:
        """A block that a signal cancels (at once, if one came already)."""
        with anyio.CancelScope() as scope:
            self._scope = scope
            if self.interrupted:
                scope.cancel()
            try:
                yield
            finally:
                self._scope = None

    async def run(self, tasks: TaskGroup) -> None:
        """Start the producer and publish the input; if the producer cannot start, the whole
        input goes to the failures file."""
        error: ProducerError | None = None
        with self._interruptible():
            try:
                await self.producer.start()
            except ProducerError as exc:
                error = exc
        if error is not None:
            self.records_copied = await self.reader.copy(self.failures.write_raw)
            self.failures.input_unsent(self.records_copied, error)
            return
        if self.interrupted:
            return
        self.progress.start(self.producer, self.failures)
        tasks.start_soon(self.progress.refresh_every, 0.1)
        if self.metrics is not None:
            self.metrics.attach(self.producer)
        send, receive = self.reader.open_stream()
        tasks.start_soon(self.reader.run, send)
        try:
            with self._interruptible():
                await self._produce_all(receive)
        finally:
            for item in self._unsent() + await self.reader.stopped(receive):
                self.failures.add_unsent(item)

    async def _produce_all(self, receive: AsyncIterable[list[Parsed | InvalidRecord]]) -> None:
        """Produce every record received, then flush; a record refused at the call (a
        MessageError) or a one-by-one produce's own failure goes to the failures file."""
        produce, headers, nonblocking = self.producer.produce, self.headers, self.pipelined
        failures, progress = self.failures, self.progress
        async for batch in receive:
            self._batch, self._done = batch, 0
            for item in batch:
                progress.records += 1
                if isinstance(item, InvalidRecord):
                    failures.add_raw(item.raw, item)
                else:
                    value, key, msg_id = item
                    self._calls += 1
                    self._in_call = True
                    try:
                        await produce(
                            value, key=key, headers=headers, msg_id=msg_id, nonblocking=nonblocking
                        )
                    except (MessageError, ProducerClosed) as exc:
                        self._refused += 1
                        failures.add(value, key, msg_id, exc)
                    except ProducerError as exc:  # a one-by-one produce's own failure
                        failures.add(value, key, msg_id, exc)
                    self._in_call = False
                self._done += 1
                if self._done & 1023 == 0:
                    # A burst that never waits would starve the progress task and sockets.
                    await anyio.sleep(0)
        with contextlib.suppress(ProduceError):  # its failures were written by on_error
            await self.producer.flush()

    def _unsent(self) -> list[Parsed | InvalidRecord]:
        """The records of the current batch not handed to the producer (after a cancel)."""
        rest, self._batch = self._batch[self._done :], []
        if rest and self._in_call:
            admitted_before = self._calls - 1 - self._refused
            if self.producer.stats.produced > admitted_before:
                rest = rest[1:]  # it became a message: the producer settles it
        return rest

    async def close(self) -> None:
        """Close the producer (not cancellable: it settles every message in flight)."""
        self._closing = True
        in_flight = self.producer.stats.in_flight
        if self.interrupted and in_flight:
            print(
                f"producerkit produce: interrupted; waiting for the acks of {in_flight:,} "
                "messages in flight (Ctrl-C again: stop waiting, they go to the failures file)",
                file=sys.stderr,
            )
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(ProduceError):  # its failures were written by on_error
                await self.producer.close()
            if self.metrics is not None:
                self.metrics.detach()


async def _produce(
    args: argparse.Namespace,
    fmt: Format,
    kwargs: dict[str, Any],
    headers: dict[str, str] | None,
    failed_out: Path | None,
    show_progress: bool,
    metrics: Metrics | None = None,
) -> int:
    failures = FailureSink(fmt, failed_out, metrics)
    # Delivery failures are written the moment they happen (so a killed run keeps what it
    # learnt); flush()/close() raise the same failures again, which are therefore not re-added.
    producer = pk.Producer(
        **kwargs,
        on_error=failures.add_failure,
        on_outcome=metrics.observe if metrics is not None else None,
        value_serializer=fmt.values.serializer(),
    )
    source, size = _open_input(args.file)
    reader: InputReader[Parsed | InvalidRecord] = InputReader(fmt.records, source)
    progress = _Progress(show_progress, size, f"→ {kwargs['topic']}", lambda: reader.bytes)
    run = _Run(producer, reader, failures, progress, headers, not args.one_by_one, metrics)
    started = time.perf_counter()
    try:
        async with anyio.create_task_group() as tasks:
            await tasks.start(run.watch_signals)
            try:
                await run.run(tasks)
            finally:
                await run.close()
                progress.stop()
                tasks.cancel_scope.cancel()  # the signal watcher and the progress refresh
    finally:
        reader.close()
        if source is not sys.stdin.buffer:
            source.close()
        failures.finish()
    if reader.error is not None:
        raise reader.error  # e.g. a CSV header without the --key-field column
    elapsed = time.perf_counter() - started
    _summary(
        kwargs, producer.stats, run.records_read, failures, elapsed, failed_out, run.interrupted
    )
    if run.interrupted:
        return 130
    return 1 if failures.count else 0


def _summary(
    kwargs: dict[str, Any],
    stats: pk.Stats | None,
    records: int,
    failures: FailureSink,
    elapsed: float,
    failed_out: Path | None,
    interrupted: bool = False,
) -> None:
    acked = stats.acked if stats is not None else 0
    rate = records / elapsed if elapsed > 0 else 0.0
    line = (
        f"producerkit produce: {records:,} records in {elapsed:.2f} s ({rate:,.0f}/s) "
        f"to {kwargs['topic']!r}: {acked:,} acked, {failures.count:,} failed"
    )
    if failures.count:
        reasons = ", ".join(f"{count:,} {name}" for name, count in sorted(failures.reasons.items()))
        line += f" ({reasons})"
    if interrupted:
        line += "; interrupted (the input after the last record read was left unread)"
    print(line, file=sys.stderr)
    for example in failures.examples:
        print(f"  e.g. {example}", file=sys.stderr)
    if failures.count:
        if failed_out is not None:
            print(
                f"failed records written to {failed_out}: rerun with it as the input to retry them",
                file=sys.stderr,
            )
        else:
            print("pass --failed-out FILE to keep the failed records for a rerun", file=sys.stderr)
