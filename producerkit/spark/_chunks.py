"""Rows into column chunks, as every Spark entry point hands them to
``producerkit.spark._worker.publish_task``: from Arrow record batches (``publish()`` and the
Arrow writers) or from rows (the row writers, ``partition_writer``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

#: A column by name (a DataFrame's, a Row's, a dict's) or by position (a tuple's, a Row's;
#: only ``partition_writer`` takes positions: a DataFrame's columns are named).
Column = str | int

#: One chunk of rows, column-wise: role -> list of Python values (bytes/str/int/None/...), or,
#: for a value or key column without a serializer read from Arrow, the Arrow binary array itself
#: (``produce_batch`` takes it as it is: no Python object per row here). A value or key column
#: that a serializer turns into bytes may hold anything it takes: structs and maps as dicts,
#: arrays as lists (plain Python, never Spark Rows).
Chunk = Mapping[str, Sequence[Any]]


#: The roles whose values a serializer may take as structures: their maps become dicts.
_SERIALIZED_ROLES = ("value", "key")


def chunks_from_arrow(
    batches: Iterable[Any], columns: Mapping[str, Column], as_bytes: Iterable[str] = ()
) -> Iterator[Chunk]:
    """Arrow record batches -> chunks.

    A string or binary column of an ``as_bytes`` role (a value or key without a serializer)
    stays an Arrow binary array, which ``produce_batch`` takes as it is: a string column is cast
    to binary (the same buffers: no decoding, no Python object per row here). Every other
    column becomes one Python list (one C call each): structs as dicts, arrays as lists; maps
    in the value and key columns as dicts (Arrow's default is a list of pairs, which JSON would
    write as an array), elsewhere (headers) as pairs.
    """
    binary = frozenset(as_bytes)
    for batch in batches:
        yield {
            role: _column_of(batch.column(name), role in _SERIALIZED_ROLES, role in binary)
            for role, name in columns.items()
        }


def _column_of(column: Any, maps_as_dicts: bool, as_bytes: bool) -> Sequence[Any]:
    """One column of a chunk: an ``as_bytes`` text or binary column as an Arrow binary array,
    anything else as a list (:func:`_pylist`)."""
    if as_bytes:
        binary = _as_binary(column)
        if binary is not None:
            return binary  # type: ignore[no-any-return]
    return _pylist(column, maps_as_dicts)


def _as_binary(column: Any) -> Any:
    """A string or binary Arrow array as a binary one (a cast keeps the buffers), else None."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return column
    if pa.types.is_string(kind):
        return column.cast(pa.binary())
    if pa.types.is_large_string(kind):
        return column.cast(pa.large_binary())
    return None


def _pylist(column: Any, maps_as_dicts: bool, text_as_bytes: bool = False) -> list[Any]:
    if text_as_bytes:
        binary = _as_binary(column)
        if binary is not None:
            return binary.to_pylist()  # type: ignore[no-any-return]
    if not (maps_as_dicts and _has_map(column.type)):
        return column.to_pylist()  # type: ignore[no-any-return]
    try:
        return column.to_pylist(maps_as_pydicts="strict")  # type: ignore[no-any-return]
    except TypeError:  # pyarrow < 20 has no maps_as_pydicts
        return [_maps_as_dicts(value, column.type) for value in column.to_pylist()]


def _children(arrow_type: Any) -> list[Any]:
    """The types directly inside an Arrow type (struct fields, list items, map keys/items)."""
    import pyarrow as pa

    if pa.types.is_struct(arrow_type):
        return [arrow_type.field(i).type for i in range(arrow_type.num_fields)]
    if pa.types.is_map(arrow_type):
        return [arrow_type.key_type, arrow_type.item_type]
    lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    if any(is_list(arrow_type) for is_list in lists):
        return [arrow_type.value_type]
    return []


def _has_map(arrow_type: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_map(arrow_type) or any(map(_has_map, _children(arrow_type)))


def _maps_as_dicts(value: Any, arrow_type: Any) -> Any:
    """``to_pylist()``'s value of ``arrow_type`` with every map's (key, item) pairs as a dict."""
    import pyarrow as pa

    if value is None or not _has_map(arrow_type):
        return value
    if pa.types.is_map(arrow_type):
        key_type, item_type = arrow_type.key_type, arrow_type.item_type
        return {
            _maps_as_dicts(key, key_type): _maps_as_dicts(item, item_type) for key, item in value
        }
    if pa.types.is_struct(arrow_type):
        fields = [arrow_type.field(i) for i in range(arrow_type.num_fields)]
        return {field.name: _maps_as_dicts(value[field.name], field.type) for field in fields}
    (item_type,) = _children(arrow_type)
    return [_maps_as_dicts(item, item_type) for item in value]


def chunks_from_rows(
    rows: Iterable[Any],
    columns: Mapping[str, Column],
    size: int = 10_000,
    structured: Iterable[str] = (),
    as_bytes: Iterable[str] = (),
) -> Iterator[Chunk]:
    """Rows -> chunks of ``size`` rows (the row-based writers of Sparks without Arrow ones, and
    ``partition_writer``): Spark Rows, dicts or tuples, each column read as ``row[column]``.
    The ``structured`` roles' values hold structs: each becomes plain Python (a Row a dict,
    recursively), as :func:`chunks_from_arrow` gives; other columns pay nothing. The text of
    the ``as_bytes`` roles is encoded to UTF-8 here, a chunk at a time."""
    names = list(columns.items())
    plain = frozenset(structured)
    encoded = [role for role in as_bytes if role in columns]
    buffer: dict[str, list[Any]] = {role: [] for role, _ in names}
    filled = 0
    for row in rows:
        for role, name in names:
            value = row[name]
            buffer[role].append(_plain(value) if role in plain and value is not None else value)
        filled += 1
        if filled == size:
            yield _encode_text(buffer, encoded)
            buffer = {role: [] for role, _ in names}
            filled = 0
    if filled:
        yield _encode_text(buffer, encoded)


def _encode_text(chunk: dict[str, list[Any]], roles: Iterable[str]) -> dict[str, list[Any]]:
    """Each ``roles`` column's str values as their UTF-8 bytes (what the producer would send);
    text that cannot be encoded (a lone surrogate) stays, for the producer to refuse that row."""
    for role in roles:
        try:
            chunk[role] = [value.encode() if type(value) is str else value for value in chunk[role]]
        except UnicodeEncodeError:
            chunk[role] = [_utf8_or_text(value) for value in chunk[role]]
    return chunk


def _utf8_or_text(value: Any) -> Any:
    if type(value) is not str:
        return value
    try:
        return value.encode()
    except UnicodeEncodeError:
        return value


def _plain(value: Any) -> Any:
    """A Spark value as plain Python: Rows (structs) as dicts, inside lists and dicts too."""
    as_dict = getattr(value, "asDict", None)
    if as_dict is not None:  # a pyspark Row; its asDict(recursive=True) handles what is inside
        return as_dict(recursive=True)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {name: _plain(item) for name, item in value.items()}
    return value
