"""``produce_batch``'s columns: each argument as one list (or None), checked for length.

``produce_batch(values, keys=..., headers=..., partitions=..., msg_ids=..., timestamps=...,
contexts=...)`` takes each per-message argument as a column: a sequence with one item per message
(a list, a tuple, an Arrow array or chunked array; for keys, values and message ids, Arrow
binary, string and their large variants). A column is None when the argument is not given.
Arrow text becomes its UTF-8 bytes without decoding (a cast to binary keeps the buffers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from producerkit._message import MessageRules
from producerkit._record import Message
from producerkit.errors import MessageError

__all__ = ["Columns", "columns_of", "message_at", "transformed"]


class Columns(NamedTuple):
    """One list per argument (None where not given), all of ``size`` items."""

    size: int
    values: list[Any]
    keys: list[Any] | None
    headers: list[Any] | None
    partitions: list[Any] | None
    msg_ids: list[Any] | None
    timestamps: list[Any] | None
    contexts: list[Any] | None
    #: The values, keys and headers are the producer's transforms of the ones given
    #: (:func:`transformed`).
    transformed: bool = False

    @property
    def plain(self) -> bool:
        """Whether every message has only a value and a key (what the core's Admission takes)."""
        return (
            self.headers is None
            and self.partitions is None
            and self.msg_ids is None
            and self.timestamps is None
            and self.contexts is None
        )


def columns_of(
    values: Any,
    *,
    keys: Any = None,
    headers: Any = None,
    partitions: Any = None,
    msg_ids: Any = None,
    timestamps: Any = None,
    contexts: Any = None,
) -> Columns:
    """The arguments of ``produce_batch`` as :class:`Columns`; MessageError if one is not a
    sequence or its length differs from the values'."""
    value_list = _column("values", values, as_bytes=True)
    assert value_list is not None
    count = len(value_list)
    named = {
        "keys": _column("keys", keys, as_bytes=True),
        "headers": _column("headers", headers),
        "partitions": _column("partitions", partitions),
        "msg_ids": _column("msg_ids", msg_ids, as_text=True),
        "timestamps": _column("timestamps", timestamps),
        "contexts": _column("contexts", contexts),
    }
    for name, column in named.items():
        if column is not None and len(column) != count:
            raise MessageError(
                f"produce_batch: {name} has {len(column)} items for {count} values (one per "
                "message, or None)"
            )
    return Columns(
        count,
        value_list,
        keys=named["keys"],
        headers=named["headers"],
        partitions=named["partitions"],
        msg_ids=named["msg_ids"],
        timestamps=named["timestamps"],
        contexts=named["contexts"],
    )


def transformed(rules: MessageRules, columns: Columns, topic: str | None) -> Columns:
    """``columns`` with the producer's serializers and trace context applied, a column at a
    time (see ``MessageRules.transformed_columns``); the same where it has none."""
    if not rules.transforms:
        return columns
    values, keys, headers = rules.transformed_columns(
        columns.values, columns.keys, columns.headers, topic
    )
    return columns._replace(values=values, keys=keys, headers=headers, transformed=True)


def _column(
    name: str, data: Any, *, as_bytes: bool = False, as_text: bool = False
) -> list[Any] | None:
    if data is None:
        return None
    if isinstance(data, list):
        return data
    if _is_arrow(data):
        return _arrow_list(data, as_bytes, as_text)
    if isinstance(data, (str, bytes, bytearray, memoryview)) or not isinstance(data, Sequence):
        raise MessageError(
            f"produce_batch: {name} must be a sequence (a list, a tuple or an Arrow array) "
            f"with one item per message, not {type(data).__name__}"
        )
    return list(data)


def _is_arrow(data: Any) -> bool:
    module = type(data).__module__
    return module.startswith("pyarrow") and hasattr(data, "to_pylist")


def _arrow_list(data: Any, as_bytes: bool, as_text: bool) -> list[Any]:
    """An Arrow column as a list: text as its UTF-8 bytes where bytes are wanted (values,
    keys), bytes as text where text is (message ids)."""
    import pyarrow as pa

    kind = data.type
    if as_bytes and pa.types.is_string(kind):
        data = data.cast(pa.binary())
    elif as_bytes and pa.types.is_large_string(kind):
        data = data.cast(pa.large_binary())
    elif as_text and (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        data = data.cast(pa.string())
    return data.to_pylist()  # type: ignore[no-any-return]


def message_at(rules: MessageRules, columns: Columns, topic: str | None, index: int) -> Message:
    """The Message of the ``index``-th item, validated as ``produce()`` validates one; its
    MessageError names the index."""

    def item(column: list[Any] | None) -> Any:
        return None if column is None else column[index]

    try:
        return rules.message(
            columns.values[index],
            item(columns.keys),
            item(columns.headers),
            topic,
            item(columns.partitions),
            item(columns.msg_ids),
            context=item(columns.contexts),
            timestamp=item(columns.timestamps),
            transformed=columns.transformed,
        )
    except MessageError as exc:
        raise type(exc)(f"produce_batch: message {index}: {exc}") from exc
