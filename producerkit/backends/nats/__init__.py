"""``nats://`` (core NATS) and ``jetstream://`` (acked, stored) on nats-py.

- ``options``: the options both accept and the subject and header checks;
- ``connection``: the nats-py client both use (connecting, the publish path, refusals);
- ``core``: core NATS, acknowledged a burst at a time by PING/PONG;
- ``jetstream``: JetStream, PubAcks matched by reply subject;
- ``fast_ingest``: JetStream fast batches (ADR-50), many messages acked at once, on streams that
  allow them;
- ``atomic``: atomic batches (ADR-50), the writer of ``Producer.atomic_batch()``;
- ``streams``: what a stream keeps, asked without a producer (its duplicate window);
- ``pubacks``: reading a PubAck's sequence or refusal, a fast batch's replies and an atomic
  batch's commit.

``errors`` is the one place nats-py's exceptions become producerkit's, and ``_natspy_compat`` the
one place nats-py's internals are touched (the fast path), behind a probe with nats-py's public
API as the fallback.
"""

from __future__ import annotations

from producerkit.backends.base import BackendSpec
from producerkit.backends.nats import errors, options
from producerkit.backends.nats.atomic import JetStreamAtomicWrites
from producerkit.backends.nats.core import NatsConnection
from producerkit.backends.nats.jetstream import JetStreamConnection
from producerkit.backends.nats.streams import duplicate_window

__all__ = ["JETSTREAM", "NATS", "JetStreamConnection", "NatsConnection"]

#: NATS stores no time given by the publisher: why ``timestamp=`` is refused.
_NO_TIMESTAMP = (
    "NATS stores no time given by the publisher (JetStream records its own receive time): "
    "carry yours in a header, e.g. headers={'Timestamp': '...'}"
)

NATS = BackendSpec(
    connection=NatsConnection,
    options=options.OPTIONS,
    check_options=options.checker(options.OPTIONS),
    check_topic=options.check_topic,
    check_headers=options.check_headers,
    translate_error=errors.translate,
    timestamp_refusal=_NO_TIMESTAMP,
    tombstone_refusal="NATS has no null value (an empty payload is a message like any other)",
    acks_with_offset=False,
    partitioned=False,
    takes_null_header_values=False,
    stores_records=False,
    atomic_batch_refusal="core NATS stores nothing; atomic batches are JetStream's "
    "(jetstream://, a stream created with allow_atomic=True)",
)
JETSTREAM = BackendSpec(
    connection=JetStreamConnection,
    options=options.JETSTREAM_OPTIONS,
    check_options=options.checker(options.JETSTREAM_OPTIONS),
    check_topic=options.check_topic,
    check_headers=options.check_headers,
    translate_error=errors.translate,
    takes_expectations=True,
    timestamp_refusal=_NO_TIMESTAMP,
    tombstone_refusal="JetStream has no null value (an empty payload is a message like any "
    "other); to delete a subject's messages, purge the stream by subject",
    partitioned=False,
    takes_null_header_values=False,
    atomic_writes=JetStreamAtomicWrites,
    duplicate_window=duplicate_window,
)
