"""Turning values and keys into bytes before they are produced.

``Producer(value_serializer=..., key_serializer=...)`` takes a callable ``(obj) -> bytes`` or
the name of a built-in one:

============  ==============================================================================
name          what it does
============  ==============================================================================
``"bytes"``   bytes-like objects as they are (``bytes(obj)``); anything else is refused
``"str"``     ``str`` encoded as UTF-8; bytes-like objects as they are
``"json"``    compact JSON, UTF-8: orjson where it is installed (``producerkit[json]``),
              else the standard library's ``json`` (same output for the usual types)
============  ==============================================================================

:func:`avro` makes an Avro serializer in the Confluent wire format (magic byte 0, the 4-byte
schema id, then the schemaless Avro body), readable by consumers of a Confluent or Karapace
schema registry. producerkit does not talk to a schema registry: you give the schema and the id
it was registered under.

A serializer runs once per message, before the message is admitted; if it raises, ``produce()``
raises :class:`~producerkit.SerializationError` naming the message, nothing is counted, and the
producer goes on.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from io import BytesIO
from typing import Any

from producerkit.errors import ConfigurationError, MissingDependencyError

__all__ = ["Serializer", "avro", "resolve"]

Serializer = Callable[[Any], bytes]

_CONFLUENT_HEADER = struct.Struct(">bI")  # magic byte 0, schema id


def _bytes(obj: Any) -> bytes:
    if isinstance(obj, bytes | bytearray | memoryview):
        return bytes(obj)
    raise TypeError(f"expected bytes, bytearray or memoryview, not {type(obj).__name__}")


def _str(obj: Any) -> bytes:
    if isinstance(obj, str):
        return obj.encode("utf-8")
    return _bytes(obj)


def _json_stdlib(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _json() -> Serializer:
    try:
        import orjson
    except ImportError:
        return _json_stdlib
    from producerkit import _core

    # orjson builds each result in a 1 KiB buffer and shrinks it in place: the values kept
    # until their acks then fragment the heap. An exact-size copy made at once costs less.
    dumps: Serializer = _core.active().exact_bytes(orjson.dumps)
    return dumps


_BUILT_IN: dict[str, Callable[[], Serializer]] = {
    "bytes": lambda: _bytes,
    "str": lambda: _str,
    "json": _json,
}


def resolve(serializer: str | Serializer | None, what: str) -> Serializer | None:
    """The serializer for ``value_serializer``/``key_serializer`` (``what``): None, a callable,
    or a built-in's name; ConfigurationError for anything else."""
    if serializer is None or callable(serializer):
        return serializer
    if isinstance(serializer, str):
        make = _BUILT_IN.get(serializer)
        if make is not None:
            return make()
        raise ConfigurationError(
            f"unknown {what} {serializer!r}: use one of {', '.join(sorted(_BUILT_IN))} "
            "or a callable (obj) -> bytes"
        )
    raise ConfigurationError(
        f"{what} must be a callable (obj) -> bytes or a name, not {type(serializer).__name__}"
    )


def avro(schema: Mapping[str, Any] | str, schema_id: int) -> Serializer:
    """An Avro serializer for ``schema`` (a dict, or its JSON text), framing each value in the
    Confluent wire format under ``schema_id`` (the id the schema registry gave the schema).
    Needs fastavro (``pip install "producerkit[avro]"``)."""
    try:
        import fastavro
    except ImportError as exc:
        raise MissingDependencyError(
            'Avro serialization needs fastavro: run  pip install "producerkit[avro]"'
        ) from exc
    if type(schema_id) is not int or not 0 <= schema_id < 2**31:
        raise ConfigurationError(f"schema_id must be an int in [0, 2**31), got {schema_id!r}")
    try:
        parsed = fastavro.parse_schema(
            json.loads(schema) if isinstance(schema, str) else dict(schema)
        )
    except Exception as exc:
        raise ConfigurationError(f"invalid Avro schema: {exc}") from exc
    header = _CONFLUENT_HEADER.pack(0, schema_id)
    write = fastavro.schemaless_writer

    def serialize(obj: Any) -> bytes:
        buffer = BytesIO()
        buffer.write(header)
        write(buffer, parsed, obj)
        return buffer.getvalue()

    return serialize
