"""JetStream expectations: publish only if the stream is as the writer last saw it.

``produce(..., expect=Expect(...))`` adds the headers saying an :class:`Expect`'s expectations
to the message (``header_pairs()`` gives them, for raw headers). The server stores the message
only if every expectation holds, else it refuses it with a JetStream error code, which producerkit
reports as :class:`~producerkit.ExpectationFailed` (see docs/reliability.md). This is the
optimistic concurrency of event sourcing: read a stream (or one subject of it) up to sequence n,
decide, and append with ``last_subject_sequence=n``; a writer that appended in between makes the
append fail instead of interleaving.

::

    expect = Expect(stream="ORDERS", last_subject_sequence=41)
    await producer.produce(event, topic="orders.1234", expect=expect)
"""

from __future__ import annotations

import re
from typing import Final

import attrs

from producerkit.backends.jetstream_headers import EXPECTED_HEADERS
from producerkit.errors import MessageError

__all__ = ["EXPECTED_HEADERS", "Expect"]

_LARGEST_SEQUENCE: Final = 2**64 - 1  # JetStream's sequences are unsigned 64-bit
# What nats-server refuses in a stream name: whitespace, '.', wildcards and path separators.
_BAD_STREAM_NAME = re.compile(r"[\s.*>/\\]")


def _check_sequence(_: object, field: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and (type(value) is not int or not 0 <= value <= _LARGEST_SEQUENCE):
        raise MessageError(
            f"Expect({field.name}=...) must be a stream sequence, an int from 0 to 2**64-1 "
            f"(0: nothing stored yet), or None; got {value!r}"
        )


def _check_stream(_: object, field: attrs.Attribute[str | None], value: str | None) -> None:
    if value is None:
        return
    if type(value) is not str or not value or not value.isprintable():
        raise MessageError(f"Expect(stream=...) must be a non-empty stream name, got {value!r}")
    if _BAD_STREAM_NAME.search(value):
        raise MessageError(
            f"Expect(stream={value!r}) cannot name a JetStream stream: no spaces, '.', '*', '>' "
            "or slashes"
        )


def _check_msg_id(_: object, field: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and (type(value) is not str or not value or not value.isprintable()):
        raise MessageError(
            "Expect(last_msg_id=...) must be a non-empty msg_id without line breaks or control "
            f"characters, got {value!r}"
        )


@attrs.frozen(slots=True)
class Expect:
    """What the stream must look like for JetStream to store a message; None expects nothing.

    - ``stream``: the subject is stored by the stream of this name;
    - ``last_sequence``: the stream's last message has this sequence (0: the stream is empty);
    - ``last_subject_sequence``: the last message on this message's subject has this stream
      sequence (0: there is none yet), the usual check of an event-sourced aggregate;
    - ``last_msg_id``: the stream's last message was published with this ``msg_id``.

    A value that cannot be any of these is a :class:`~producerkit.MessageError` here, at
    construction. A publish whose expectations do not hold fails with
    :class:`~producerkit.ExpectationFailed` (its ``code`` says which held not).
    """

    stream: str | None = attrs.field(default=None, validator=_check_stream)
    last_sequence: int | None = attrs.field(default=None, validator=_check_sequence)
    last_subject_sequence: int | None = attrs.field(default=None, validator=_check_sequence)
    last_msg_id: str | None = attrs.field(default=None, validator=_check_msg_id)

    def header_pairs(self) -> tuple[tuple[str, bytes], ...]:
        """The headers saying this (``backends.jetstream_headers``), as (name, value) pairs;
        empty if it expects nothing."""
        values = (self.stream, self.last_sequence, self.last_subject_sequence, self.last_msg_id)
        return tuple(
            (name, str(value).encode())
            for name, value in zip(EXPECTED_HEADERS, values, strict=True)
            if value is not None
        )
