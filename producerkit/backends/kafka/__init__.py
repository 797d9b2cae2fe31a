"""``kafka://host:port[,host:port]`` on aiokafka, batching with the protocol's own record batches.

The backend in four parts, each in its own module:

- ``options``: the options it accepts, their checks, and the aiokafka settings they become;
- ``accumulator``: records gathered per partition and sealed into record batches
  (``record_batch`` encodes them: C where it was built, else aiokafka's builder);
- ``sender``: batches shipped to their leaders, retried, and settled from the broker's answer;
- ``connection``: one aiokafka client with its accumulator and sender, the seam's Connection;
- ``atomic``: atomic batches as Kafka transactions, on a transactional connection of their own
  (``transactions``: the coordinator's requests).

``errors`` is the one place aiokafka's exceptions become producerkit's, and ``_aiokafka_compat``
the one place aiokafka's internals are touched (the fast path), behind a probe with aiokafka's
public batch API as the fallback.
"""

from __future__ import annotations

from producerkit.backends.base import BackendSpec
from producerkit.backends.kafka import errors, options
from producerkit.backends.kafka.atomic import KafkaAtomicWrites
from producerkit.backends.kafka.connection import KafkaConnection

__all__ = ["KAFKA", "KafkaConnection"]

KAFKA = BackendSpec(
    connection=KafkaConnection,
    options=options.OPTIONS,
    check_options=options.check_options,
    check_topic=options.check_topic,
    translate_error=errors.translate,
    default_keyless="sticky",
    stores_timestamps=True,
    default_window=options.default_window,
    atomic_writes=KafkaAtomicWrites,
)
