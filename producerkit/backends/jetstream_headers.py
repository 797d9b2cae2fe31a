"""The headers JetStream reads a publisher's expectations from (``producerkit.Expect``): the
stream, its last sequence, a subject's last sequence, the last message id. Kept here, below the
seam, and importable without nats-py."""

from __future__ import annotations

from typing import Final

STREAM_HEADER: Final = "Nats-Expected-Stream"
LAST_SEQUENCE_HEADER: Final = "Nats-Expected-Last-Sequence"
LAST_SUBJECT_SEQUENCE_HEADER: Final = "Nats-Expected-Last-Subject-Sequence"
LAST_MSG_ID_HEADER: Final = "Nats-Expected-Last-Msg-Id"
#: Every header an Expect may set, in the order of its fields.
EXPECTED_HEADERS: Final = (
    STREAM_HEADER,
    LAST_SEQUENCE_HEADER,
    LAST_SUBJECT_SEQUENCE_HEADER,
    LAST_MSG_ID_HEADER,
)
