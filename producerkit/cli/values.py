"""``producerkit produce --value-format``: how a record's value becomes the message's bytes.

The input format (``--format``) says what a record's value is: a line, a JSONL document or its
``--value-field``, a CSV row or one of its cells. The value format says how it is sent:

========  ========================================================================================
bytes     (the default) as before: a line or JSONL line byte for byte, a JSONL field's string as
          its UTF-8 text (any other field as compact JSON), a CSV row as a compact JSON object
str       the same bytes, but only valid UTF-8 text: a record that is not goes to the failures file
json      the value as JSON, re-serialized compactly by the producer's ``value_serializer="json"``
          (a line is parsed as a JSON document first; a JSONL field that is a string is sent as
          a JSON string, quoted; a CSV row as an object of strings)
avro      the same JSON value encoded with ``--avro-schema FILE`` and framed in the Confluent wire
          format under ``--schema-id N`` (:func:`producerkit.serializers.avro`)
========  ========================================================================================

With ``json`` and ``avro`` the producer serializes each value (a value it cannot serialize fails
that record with ``SerializationError``), and the failures file gets each failed value back as the
JSON it came from, so a rerun with the same flags sends the same bytes.
"""

from __future__ import annotations

import json
from io import BytesIO
from pathlib import Path
from typing import Any

from producerkit.errors import ConfigurationError

VALUE_FORMATS = ("bytes", "str", "json", "avro")

_HEADER_SIZE = 5  # the Confluent wire format's magic byte and 4-byte schema id


class ValueFormat:
    """``bytes``: values are the record's bytes and the producer sends them as they are."""

    name = "bytes"
    #: Whether values are Python objects (parsed JSON) that the producer serializes.
    structured = False
    #: Whether a value must be valid UTF-8 (checked by the input formats).
    text = False

    def serializer(self) -> Any:
        """The producer's ``value_serializer`` (None: values are bytes already)."""
        return None

    def to_object(self, value: Any) -> Any:
        """A structured value as the object it was: a failed message's bytes are decoded, an
        object refused before it was serialized is itself."""
        return value


class TextValues(ValueFormat):
    name = "str"
    text = True


class JsonValues(ValueFormat):
    name = "json"
    structured = True

    def serializer(self) -> Any:
        return "json"

    def to_object(self, value: Any) -> Any:
        return json.loads(value) if isinstance(value, bytes) else value


class AvroValues(ValueFormat):
    name = "avro"
    structured = True

    def __init__(self, schema_path: str, schema_id: int) -> None:
        from producerkit import serializers

        try:
            schema = json.loads(Path(schema_path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigurationError(f"cannot read --avro-schema {schema_path}: {exc}") from None
        except ValueError as exc:
            raise ConfigurationError(f"--avro-schema {schema_path} is not JSON: {exc}") from None
        self._serializer = serializers.avro(schema, schema_id)  # checks the schema and the id
        import fastavro  # installed: avro() needs it too

        self._parsed = fastavro.parse_schema(schema)
        self._read = fastavro.schemaless_reader

    def serializer(self) -> Any:
        return self._serializer

    def to_object(self, value: Any) -> Any:
        if not isinstance(value, bytes):
            return value
        return self._read(BytesIO(value[_HEADER_SIZE:]), self._parsed, self._parsed)


def value_format(name: str, avro_schema: str | None, schema_id: int | None) -> ValueFormat:
    """The value format for ``--value-format NAME`` and the Avro flags (checked together)."""
    if name != "avro":
        if avro_schema is not None or schema_id is not None:
            raise ConfigurationError("--avro-schema/--schema-id need --value-format avro")
        return {"bytes": ValueFormat, "str": TextValues, "json": JsonValues}[name]()
    if avro_schema is None or schema_id is None:
        raise ConfigurationError("--value-format avro needs --avro-schema FILE and --schema-id N")
    return AvroValues(avro_schema, schema_id)  # MissingDependencyError without fastavro
