"""The seam: one small interface every backend implements.

A backend is one connection to a broker. The producer above it owns everything else, written once:
the in-flight window, deadlines, stats, partition choice, connection pooling and failure
accounting. A backend only moves records and reports, for each record it was handed, exactly one
outcome through its :class:`DeliverySink`: ``acked(record, offset)`` (offset may be None), or
``acked_run(records, first_offset)`` for a batch stored at consecutive offsets, or
``failed(record, exc)`` with a producerkit error. Late or duplicate reports are ignored above, so
a backend need not track deadlines. A record is a plain tuple: read it as ``record[TOPIC]``,
``record[VALUE]``... with the positions in ``producerkit._types``.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Mapping
from typing import Any, ClassVar, Protocol

from producerkit._config import ParsedURL, coerce_option
from producerkit._types import Headers, Record
from producerkit.errors import ConfigurationError, DeliveryError, ProducerError


class DeliverySink(Protocol):
    def acked(self, record: Record, offset: int | None) -> None: ...

    def acked_run(self, records: list[Record], first_offset: int | None) -> None:
        """``acked`` for records stored at consecutive offsets (one batch), counted at once."""

    def failed(self, record: Record, exc: BaseException) -> None: ...

    def topic_changed(self, topic: str) -> None:
        """The partition count of ``topic`` may have changed: ask ``prepare_topic`` again."""

    def batch_sent(self, topic: str, partition: int) -> None:
        """A batch for this partition left: sticky keyless partitioning may move on (KIP-480)."""


class Backend(abc.ABC):
    """One connection to a broker (or to memory, or to nowhere)."""

    #: Options this backend accepts (as keywords or URL query parameters) and their types.
    OPTIONS: ClassVar[Mapping[str, type]] = {}
    #: How keyless messages spread when the user does not say: sticky suits backends that batch.
    DEFAULT_KEYLESS: ClassVar[str] = "round_robin"
    #: Whether records stay with the backend after send() returns (batches, acks to come).
    HOLDS_RECORDS: ClassVar[bool] = True
    #: Largest message (value + key + headers) this backend accepts; set by ``connect()``.
    max_message_size: int = 1024 * 1024
    #: ``"fast"`` or ``"public"``: how ``connect()`` chose to use the client library, and why
    #: (see ``producerkit.backends._clients``); None for backends without one.
    client_path: str | None = None
    client_path_reason: str = ""

    def __init__(
        self,
        url: ParsedURL,
        options: Mapping[str, Any],
        sink: DeliverySink,
        *,
        timeout: float,
        index: int = 0,
    ) -> None:
        self.url = url
        self.options = dict(options)
        self.sink = sink
        self.timeout = timeout
        self.index = index

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """Convert options to their declared types; unknown names are a ConfigurationError."""
        checked: dict[str, Any] = {}
        for name, value in options.items():
            kind = cls.OPTIONS.get(name)
            if kind is None:
                known = ", ".join(sorted(cls.OPTIONS)) or "none"
                raise ConfigurationError(
                    f"unknown option {name!r} for {cls.__name__}; options it accepts: {known}"
                )
            checked[name] = coerce_option(name, value, kind)
        if checked.get("partitions", 1) < 1:
            raise ConfigurationError(f"partitions must be at least 1, got {checked['partitions']}")
        return checked

    @classmethod
    def check_topic(cls, topic: str) -> None:
        """Raise MessageError if ``topic`` is not valid on this backend (once per topic)."""

    @classmethod
    def check_headers(cls, headers: Headers) -> None:
        """Raise MessageError if this backend cannot carry these headers."""

    @classmethod
    def translate_error(cls, exc: BaseException) -> ProducerError:
        """The producerkit error for an exception raised by ``send()`` or its awaitable."""
        if isinstance(exc, ProducerError):
            return exc
        return DeliveryError(f"{type(exc).__name__}: {exc}")

    @abc.abstractmethod
    async def connect(self) -> None:
        """Open the connection; raise BrokerUnavailable (or a subclass) if it cannot be opened."""

    async def prepare_topic(self, topic: str) -> int | None:
        """Called once per topic before its first message: the partition count, or None."""
        return None

    @abc.abstractmethod
    def send(self, record: Record) -> Awaitable[None] | None:
        """Hand a record off. Return None, or an awaitable when the backend needs the caller to
        wait for buffer space (not for the ack). Report the outcome later through the sink."""

    async def flush(self) -> None:
        """Push out anything buffered; acks still arrive through the sink."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection. Records not yet reported are failed by the producer above."""

    def __repr__(self) -> str:
        where = ",".join(self.url.server_strings()) or self.url.name
        return f"<{type(self).__name__} {self.url.scheme}://{where}>"
