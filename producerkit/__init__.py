"""producerkit: publish messages to Kafka and NATS fast, and never lose track of one.

::

    import producerkit as pk

    async with pk.Producer("kafka://127.0.0.1:9092", topic="orders") as producer:
        await producer.produce(b"v", key=b"user-1", nonblocking=True)
"""

from producerkit._logging import route_client_logs
from producerkit._options import ProducerOptions
from producerkit._producer import Producer
from producerkit._sync import SyncProducer
from producerkit._types import ConnectionStats, Delivery, Failure, Outcome, Stats
from producerkit.errors import (
    AtomicBatchError,
    AuthenticationError,
    AuthorizationError,
    BrokerUnavailable,
    ConfigurationError,
    DeliveryError,
    ExpectationFailed,
    IncompatibleClientError,
    LoopThreadError,
    MessageError,
    MessageTooLarge,
    MissingDependencyError,
    ProduceError,
    ProducerClosed,
    ProducerForked,
    ProducerkitError,
    ProduceTimeout,
    Purged,
    SerializationError,
    TLSError,
)
from producerkit.jetstream import Expect

__version__ = "0.1.0"

__all__ = [
    "AtomicBatchError",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerUnavailable",
    "ConfigurationError",
    "ConnectionStats",
    "Delivery",
    "DeliveryError",
    "Expect",
    "ExpectationFailed",
    "Failure",
    "IncompatibleClientError",
    "LoopThreadError",
    "MessageError",
    "MessageTooLarge",
    "MissingDependencyError",
    "Outcome",
    "ProduceError",
    "ProduceTimeout",
    "Producer",
    "ProducerClosed",
    "ProducerForked",
    "ProducerOptions",
    "ProducerkitError",
    "Purged",
    "SerializationError",
    "Stats",
    "SyncProducer",
    "TLSError",
    "__version__",
    "route_client_logs",
]
