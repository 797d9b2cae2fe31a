"""The input formats of ``producerkit produce`` (``--format lines|jsonl|csv``), both ways.

A :class:`Format` turns the input's lines into records (value, key, msg_id), or into an
:class:`InvalidRecord` holding the original text, and writes a failed record back in the same
format, such that reading the written record gives the same value, key and msg_id again: a rerun
with the failures file as its input sends what failed, unchanged.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from producerkit.cli.values import ValueFormat
from producerkit.errors import ConfigurationError

__all__ = [
    "FORMATS",
    "CsvFormat",
    "Format",
    "InvalidRecord",
    "JsonlFormat",
    "LinesFormat",
    "Parsed",
    "Writer",
    "detect_format",
    "input_format",
]

FORMATS = ("lines", "jsonl", "csv")

#: A parsed record: (value, key, msg_id). The value is bytes, or with a structured value format
#: (json, avro) the parsed JSON value the producer serializes.
Parsed = tuple[Any, bytes | None, str | None]
#: Writes one failed record back: (value, key, msg_id), the value as :data:`Parsed` has it or as
#: the bytes the producer made of it.
Writer = Callable[[Any, bytes | None, str | None], None]


class InvalidRecord(Exception):
    """An input record that cannot become a message; ``raw`` is its original text, ``line``
    the number of the input's line it starts on (from 1; None where it is not known)."""

    def __init__(self, raw: bytes, reason: str, line: int | None = None) -> None:
        super().__init__(reason)
        self.raw = raw
        self.reason = reason
        self.line = line

    def __str__(self) -> str:
        return self.reason if self.line is None else f"line {self.line}: {self.reason}"


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
        for number, line in enumerate(lines, 1):
            value = _strip_newline(line)
            if not value:
                continue
            key = None
            if delimiter is not None:
                key, found, value = value.partition(delimiter)
                if not found:
                    yield InvalidRecord(line, f"no key delimiter {delimiter!r}", number)
                    continue
            if not structured:
                reason = self.not_text(value) if text else None
                yield (value, key, None) if reason is None else InvalidRecord(line, reason, number)
                continue
            try:
                document = _json_value(json.loads(value))
            except ValueError as exc:
                yield InvalidRecord(line, _invalid_json(exc), number)
            except InvalidRecord as invalid:
                yield InvalidRecord(line, invalid.reason, number)
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
        for number, line in enumerate(lines, 1):
            raw = _strip_newline(line)
            if not raw.strip():
                continue
            if not needs_parse:
                # Sent as read: no parse, no re-serialisation, the bytes on the wire are the file's.
                reason = self.not_text(raw) if text else None
                yield (raw, None, None) if reason is None else InvalidRecord(line, reason, number)
                continue
            try:
                document = json.loads(raw)
            except ValueError as exc:
                yield InvalidRecord(line, _invalid_json(exc), number)
                continue
            try:
                yield _fields(document, raw, key_field, value_field, id_field, structured)
            except InvalidRecord as invalid:
                invalid.raw, invalid.line = line, number
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
        read = reader.line_num  # a row starts on the line after the last one read before it
        if header is None:
            return
        self.header = header
        for name in (self.key_field, self.value_field, self.msg_id_field):
            if name is not None and name not in header:
                raise ConfigurationError(f"CSV header {header} has no column {name!r}")
        for row in reader:
            number, read = read + 1, reader.line_num
            if not row:
                continue
            if len(row) != len(header):
                raw = _csv_line(row)
                columns = f"{len(row)} columns, the header has {len(header)}"
                yield InvalidRecord(raw, columns, number)
                continue
            document = dict(zip(header, row, strict=True))
            value: Any = document if self.value_field is None else document[self.value_field]
            if not self.values.structured:
                # Bytes as read: cells that are not UTF-8 keep their bytes (surrogateescape).
                value = _encode(_compact_text(value) if self.value_field is None else value)
                reason = self.not_text(value) if self.values.text else None
                if reason is not None:
                    yield InvalidRecord(_csv_line(row), reason, number)
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


def _invalid_json(exc: ValueError) -> str:
    """Why a record is not JSON, with the column inside the record (the line is the file's,
    given apart: json's own "line 1 column 24" is the record's first and only line)."""
    if isinstance(exc, json.JSONDecodeError):
        where = f"line {exc.lineno} column {exc.colno}" if exc.lineno > 1 else f"column {exc.colno}"
        return f"invalid JSON at {where} of the record: {exc.msg}"
    return f"invalid JSON: {exc}"


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
_FORMATS_BY_EXTENSION = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def detect_format(file: str) -> str:
    """The input format a file's extension names (``lines`` for stdin and anything else)."""
    return _FORMATS_BY_EXTENSION.get(Path(file).suffix.lower(), "lines") if file != "-" else "lines"


def input_format(args: argparse.Namespace, values: ValueFormat) -> Format:
    """The format ``args.format`` names, for the field flags of ``args``; ConfigurationError
    for a field flag the format has no use for."""
    fmt = _FORMAT_CLASSES[args.format](args, values)
    if args.format == "lines" and (args.key_field or args.value_field or args.msg_id_field):
        raise ConfigurationError(
            "--key-field/--value-field/--msg-id-field need --format jsonl or csv"
        )
    if args.format != "lines" and args.key_delimiter is not None:
        raise ConfigurationError("--key-delimiter is for --format lines")
    return fmt
