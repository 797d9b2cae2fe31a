"""What a producer accepts as a message, checked without I/O: :class:`MessageRules`.

``MessageRules.message(value, key, headers, topic, partition, msg_id, ...)`` serializes the value
and key (``value_serializer``/``key_serializer``), adds the trace context and JetStream
expectations to the headers, and returns the :class:`~producerkit._record.Message` the producer
sends, or raises a :class:`~producerkit.MessageError` naming what is wrong (nothing is counted).
It runs in whichever thread produces (``SyncProducer`` validates in the caller's thread) and
touches no producer state but its settings.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from producerkit._record import Message
from producerkit._types import HeaderPairs
from producerkit.errors import (
    ConfigurationError,
    MessageError,
    MessageTooLarge,
    MissingDependencyError,
    ProducerkitError,
    SerializationError,
)
from producerkit.jetstream import Expect

if TYPE_CHECKING:
    from producerkit.backends.base import BackendSpec
    from producerkit.serializers import Serializer

#: What ``produce(headers=...)`` takes: a mapping, or (name, value) pairs where names may repeat.
HeadersArgument = Mapping[str, bytes | str | None] | Sequence[tuple[str, bytes | str | None]]

#: Bytes a backend adds around a record (lengths, timestamps, attributes); used in the size check.
RECORD_OVERHEAD: Final = 64
#: The latest CreateTime accepted, in seconds: the end of year 9999.
_MAX_TIMESTAMP: Final = 253_402_300_800
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MILLISECOND: Final = datetime.timedelta(milliseconds=1)
_new = tuple.__new__


class MessageRules:
    """The checks and conversions one producer applies to every message it is given."""

    __slots__ = (
        "_inject_trace",
        "_scheme",
        "_spec",
        "default_topic",
        "key_serializer",
        "max_payload",
        "takes_context",
        "trace_headers",
        "transforms",
        "value_serializer",
    )

    def __init__(
        self,
        spec: BackendSpec,
        scheme: str,
        default_topic: str | None,
        *,
        value_serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
        propagate_trace: bool = False,
        takes_context: bool = False,
    ) -> None:
        self._spec = spec
        self._scheme = scheme
        if default_topic is not None:
            check_topic_type(default_topic, ConfigurationError)
            try:
                spec.check_topic(default_topic)
            except MessageError as exc:  # a bad default topic is a bad setting: say so now
                raise ConfigurationError(str(exc)) from None
        self.default_topic = default_topic
        self.value_serializer = value_serializer
        self.key_serializer = key_serializer
        self._inject_trace: Callable[[Any], Any] | None = None
        #: ``trace_headers()``: the current trace context as header pairs (None without an
        #: active span), computed once per context; None without ``propagate_trace``.
        self.trace_headers: Callable[[], HeaderPairs | None] | None = None
        if propagate_trace:
            self._inject_trace, self.trace_headers = trace_injectors()
        self.takes_context = takes_context
        #: Whether values, keys or headers are transformed before they are checked.
        self.transforms = bool(value_serializer or key_serializer or propagate_trace)
        #: The most bytes of value, key and headers a message may have; the connections' own
        #: limit once they are connected.
        self.max_payload = spec.connection.max_message_size - RECORD_OVERHEAD

    def message(
        self,
        value: object,
        key: object = None,
        headers: object = None,
        topic: object = None,
        partition: object = None,
        msg_id: object = None,
        *,
        context: object = None,
        expect: object = None,
        timestamp: object = None,
        reported: bool = False,
        transformed: bool = False,
    ) -> Message:
        """The Message to send for these arguments of ``produce()``. ``reported``: the
        message's Delivery is awaited (a blocking produce), so its CreateTime is fixed here.
        ``transformed``: the value, key and headers come from :meth:`transformed_columns`."""
        if self.transforms and not transformed:
            value, key, headers = self._transformed(value, key, headers, topic)
        if expect is not None:
            headers = self._with_expectation(headers, expect)
        if type(value) is not bytes or (key is not None and type(key) is not bytes):
            value, key = self._value_and_key(value, key)
        if topic is None:
            topic = self.default_topic
            if topic is None:
                raise MessageError("no topic: pass topic= to produce() or to the Producer")
        elif type(topic) is not str or not topic:
            check_topic_type(topic, MessageError)
        if partition is not None or msg_id is not None:
            _check_ids(partition, msg_id)
        header_pairs = None
        if headers is not None:
            header_pairs = self._header_pairs(headers)
        size = message_size(value, key, header_pairs)
        if size > self.max_payload:
            self._refuse_size(size)
        if context is not None and not self.takes_context:
            raise MessageError("context= is for on_delivery: create the Producer with one")
        stamp = None
        if timestamp is not None or reported or self.takes_context:
            stamp = self._stamp(timestamp)
        return _new(Message, (value, key, topic, partition, header_pairs, msg_id, stamp))

    def _value_and_key(self, value: object, key: object) -> tuple[bytes | None, bytes | None]:
        """The value and key as bytes (a None value: a tombstone, checked)."""
        if value is None:
            self._check_tombstone(key)
        elif type(value) is not bytes:
            value = to_bytes("value", value)
        if key is not None and type(key) is not bytes:
            key = to_bytes("key", key)
        return value, key

    def _header_pairs(self, headers: object) -> HeaderPairs:
        pairs = normalize_headers(headers)
        # The spec's check takes Headers: the backends that refuse None values say so.
        self._spec.check_headers(pairs)  # type: ignore[arg-type]
        return pairs

    def _refuse_size(self, size: int) -> None:
        raise MessageTooLarge(
            f"message of {size} bytes (value, key and headers) is larger than "
            f"{self.max_payload}, the most this {self._scheme}:// connection accepts"
        )

    def _stamp(self, timestamp: object) -> int | None:
        """The record's CreateTime in epoch ms: ``timestamp``'s, else now (its Delivery reports
        it: a blocking produce, on_delivery) where the backend stores one, else None."""
        if timestamp is not None:
            return self._timestamp_ms(timestamp)
        return int(time.time() * 1000) if self._spec.stores_timestamps else None

    @property
    def stores_timestamps(self) -> bool:
        return self._spec.stores_timestamps

    @property
    def takes_tombstones(self) -> bool:
        return self._spec.takes_tombstones

    def check_topic(self, topic: str) -> None:
        """MessageError if ``topic`` is no topic of this backend (checked once per topic)."""
        check_topic_type(topic, MessageError)
        self._spec.check_topic(topic)

    def _check_tombstone(self, key: object) -> None:
        """A None value is a tombstone: it needs a key, and a backend that stores it."""
        refusal = self._spec.tombstone_refusal
        if refusal is not None:
            raise MessageError(f"value is None (a Kafka tombstone), but {refusal}")
        if key is None:
            raise MessageError(
                "value is None without a key: a tombstone deletes a key from a compacted "
                "topic, so it needs the key (produce(None, key=...))"
            )

    def _timestamp_ms(self, timestamp: object) -> int:
        """``timestamp`` as epoch milliseconds; MessageError if it is not one this backend
        stores."""
        refusal = self._spec.timestamp_refusal
        if refusal is not None:
            raise MessageError(f"timestamp= is for Kafka: {refusal}")
        if isinstance(timestamp, datetime.datetime):
            if timestamp.utcoffset() is None:
                raise MessageError(
                    f"timestamp {timestamp!r} has no time zone: give an aware datetime "
                    "(tzinfo=datetime.timezone.utc, say) or epoch seconds"
                )
            return (timestamp - _EPOCH) // _MILLISECOND
        if (
            isinstance(timestamp, bool)
            or not isinstance(timestamp, (int, float))
            or not math.isfinite(timestamp)
            or not 0 <= timestamp < _MAX_TIMESTAMP
        ):
            raise MessageError(
                "timestamp must be epoch seconds (an int or float from 0, before year 10000) "
                f"or an aware datetime, got {timestamp!r}"
            )
        return round(timestamp * 1000)

    def _with_expectation(self, headers: Any, expect: object) -> Any:
        """The message's headers with the headers saying ``expect``'s expectations added."""
        if not isinstance(expect, Expect):
            raise MessageError(f"expect must be a producerkit.Expect, not {type(expect).__name__}")
        if not self._spec.takes_expectations:
            raise MessageError(
                f"expect= is for JetStream (jetstream://); this producer is {self._scheme}://"
            )
        pairs = expect.header_pairs()
        if headers is None:
            return pairs
        given = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
        return given + list(pairs)

    def _transformed(
        self, value: Any, key: Any, headers: Any, topic: object
    ) -> tuple[Any, Any, Any]:
        """The value and key serialized, the trace context added to the headers;
        SerializationError naming the message if a serializer raises."""
        original_value = value
        if self.value_serializer is not None and value is not None:
            try:
                value = self.value_serializer(value)
            except Exception as exc:
                raise self._serialization_error("value", exc, value, key, topic) from exc
        if self.key_serializer is not None and key is not None:
            try:
                key = self.key_serializer(key)
            except Exception as exc:
                raise self._serialization_error("key", exc, original_value, key, topic) from exc
        if self._inject_trace is not None:
            headers = self._inject_trace(headers)
        return value, key, headers

    def transformed_columns(
        self, values: list[Any], keys: list[Any] | None, headers: list[Any] | None, topic: object
    ) -> tuple[list[Any], list[Any] | None, list[Any] | None]:
        """``produce_batch``'s transforms a column at a time: every value and key serialized,
        and the trace context added to every message's headers, as :meth:`message` transforms
        one message's (the trace context taken once, for the whole batch). SerializationError
        naming the index of the first message a serializer raised on."""
        originals = values, keys
        if self.value_serializer is not None:
            values = self._serialized_column("value", self.value_serializer, originals, topic)
        if self.key_serializer is not None and keys is not None:
            keys = self._serialized_column("key", self.key_serializer, originals, topic)
        if self._inject_trace is not None and self.trace_headers is not None:
            if headers is None:
                trace = self.trace_headers()
                headers = None if trace is None else [trace] * len(values)
            else:
                headers = [self._inject_trace(given) for given in headers]
        return values, keys, headers

    def _serialized_column(
        self,
        what: str,
        serializer: Serializer,
        originals: tuple[list[Any], list[Any] | None],
        topic: object,
    ) -> list[Any]:
        values, keys = originals
        column = values if what == "value" else keys
        assert column is not None
        serialized = list(column)
        for index, original in enumerate(column):
            if original is None:
                continue
            try:
                serialized[index] = serializer(original)
            except Exception as exc:
                key = None if keys is None else keys[index]
                error = self._serialization_error(what, exc, values[index], key, topic)
                raise SerializationError(f"produce_batch: message {index}: {error}") from exc
        return serialized

    def _serialization_error(
        self, what: str, exc: Exception, value: object, key: object, topic: object
    ) -> SerializationError:
        return SerializationError(
            f"{what}_serializer failed on the message with key {_short(key)} to topic "
            f"{topic or self.default_topic!r} (value {_short(value)}): "
            f"{type(exc).__name__}: {exc}"
        )


def _check_ids(partition: object, msg_id: object) -> None:
    """MessageError if an explicit partition is no int, or a msg_id no non-empty str."""
    if partition is not None and type(partition) is not int:
        raise MessageError(f"partition must be an int, not {type(partition).__name__}")
    if msg_id is not None and (type(msg_id) is not str or not msg_id):
        raise MessageError(f"msg_id must be a non-empty str, got {msg_id!r}")


def check_partition(partition: int, num_partitions: int | None, topic: str) -> None:
    """MessageError if ``partition`` is not one of ``topic``'s ``num_partitions``."""
    if num_partitions is None:
        raise MessageError(
            f"partition={partition} given but topic {topic!r} is not partitioned on this backend "
            "(NATS: create the producer with partitions=N)"
        )
    if not 0 <= partition < num_partitions:
        raise MessageError(
            f"partition {partition} is out of range for topic {topic!r} "
            f"with {num_partitions} partition(s)"
        )


def check_topic_type(topic: object, error: type[ProducerkitError]) -> None:
    if not isinstance(topic, str) or not topic:
        raise error(f"topic must be a non-empty str, got {topic!r}")
    if not topic.isascii():  # rare: only then pay for the UTF-8 check
        try:
            topic.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates
            raise error(f"topic {topic!r} is not valid UTF-8 text") from None


def message_size(value: bytes | None, key: bytes | None, headers: HeaderPairs | None) -> int:
    """The bytes of a message that count against ``max_in_flight_bytes`` and the size limit (a
    tombstone's None value and a None header value count nothing)."""
    size = 0 if value is None else len(value)
    if key is not None:
        size += len(key)
    if headers:
        size += sum(len(name) + len(data or b"") for name, data in headers)
    return size


def to_bytes(what: str, data: object) -> bytes:
    if isinstance(data, str):
        try:
            return data.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates
            raise MessageError(f"{what} is not valid UTF-8 text: {exc}") from None
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise MessageError(
        f"{what} must be bytes, bytearray, memoryview or str, not {type(data).__name__}"
    )


def normalize_headers(headers: object) -> HeaderPairs:
    pairs: Iterable[Any]
    if isinstance(headers, Mapping):
        pairs = headers.items()
    elif isinstance(headers, (list, tuple)):
        pairs = headers
    else:
        raise MessageError(
            "headers must be a mapping of str to bytes/str/None, or a list of (name, value) "
            f"pairs, not {type(headers).__name__}"
        )
    normalized = []
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise MessageError(f"headers must be (name, value) pairs, got {pair!r}")
        name, data = pair
        if not isinstance(name, str) or not name:
            raise MessageError(f"header names must be non-empty str, got {name!r}")
        if not name.isascii():
            to_bytes(f"header name {name!r}", name)
        if isinstance(data, str):
            data = to_bytes(f"header {name!r}", data)
        elif isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        elif data is not None and not isinstance(data, bytes):
            raise MessageError(
                f"header {name!r} must have a bytes, str or None value, not {type(data).__name__}"
            )
        normalized.append((name, data))
    return tuple(normalized)


def trace_injectors() -> tuple[Callable[[Any], Any], Callable[[], HeaderPairs | None]]:
    """For ``propagate_trace``: ``(headers) -> headers`` with the current OpenTelemetry context
    injected as headers (headers the caller gave win over injected ones of the same name), and
    ``() -> pairs``, the context alone as normalized header pairs (None without an active span);
    both compute the headers once per context."""
    try:
        from opentelemetry import context as otel_context
        from opentelemetry import propagate
    except ImportError as exc:
        raise MissingDependencyError(
            'propagate_trace needs OpenTelemetry: run  pip install "producerkit[otel]"'
        ) from exc
    get_current, inject = otel_context.get_current, propagate.inject
    last_context: object = None
    last_carrier: dict[str, str] = {}
    last_pairs: HeaderPairs | None = None

    def current() -> dict[str, str]:
        nonlocal last_context, last_carrier, last_pairs
        context = get_current()
        if context is not last_context:  # a Context is immutable: same object, same headers
            last_carrier = {}
            inject(last_carrier, context=context)
            last_context = context
            last_pairs = normalize_headers(last_carrier) or None
        return last_carrier

    def trace_headers() -> HeaderPairs | None:
        if get_current() is not last_context:
            current()
        return last_pairs

    def with_trace(headers: Any) -> Any:
        carrier = current()  # only read below
        if not carrier:
            return headers  # no active span: nothing to propagate
        if headers is None:
            return carrier
        pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
        given = {pair[0] for pair in pairs if isinstance(pair, tuple) and pair}
        return pairs + [(name, data) for name, data in carrier.items() if name not in given]

    return with_trace, trace_headers


def _short(obj: object) -> str:
    """A repr that names a message without printing all of it."""
    text = repr(obj)
    return text if len(text) <= 60 else text[:57] + "..."
