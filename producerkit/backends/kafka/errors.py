"""aiokafka's exceptions -> producerkit's: the Kafka backend's one error edge.

:func:`translate` is the only place an aiokafka (or socket) exception becomes a producerkit
error. It looks the exception's class up in :data:`TABLE` (the first entry it is an instance of
wins) and keeps the original as the new error's ``__cause__``. A broker's answer arrives as an
aiokafka error class chosen by its Kafka error code, so the table is in effect keyed by code.
"""

from __future__ import annotations

from aiokafka import errors as kafka_errors

from producerkit.errors import (
    AuthenticationError,
    AuthorizationError,
    BrokerUnavailable,
    DeliveryError,
    MessageError,
    MessageTooLarge,
    ProducerkitError,
    ProduceTimeout,
)

#: (aiokafka exception classes, producerkit error), in order of precedence.
TABLE: tuple[tuple[tuple[type[BaseException], ...], type[ProducerkitError]], ...] = (
    (
        (kafka_errors.MessageSizeTooLargeError, kafka_errors.RecordListTooLargeError),
        MessageTooLarge,
    ),
    (
        (
            kafka_errors.TopicAuthorizationFailedError,
            kafka_errors.ClusterAuthorizationFailedError,
            kafka_errors.GroupAuthorizationFailedError,
        ),
        AuthorizationError,
    ),
    (
        (kafka_errors.AuthenticationFailedError, kafka_errors.UnsupportedSaslMechanismError),
        AuthenticationError,
    ),
    ((kafka_errors.KafkaTimeoutError, kafka_errors.RequestTimedOutError), ProduceTimeout),
    (
        (
            kafka_errors.KafkaConnectionError,
            kafka_errors.NodeNotReadyError,
            kafka_errors.NotLeaderForPartitionError,
            kafka_errors.LeaderNotAvailableError,
            ConnectionError,
            OSError,
        ),
        BrokerUnavailable,
    ),
    ((kafka_errors.InvalidTopicError,), MessageError),
)


def translate(exc: BaseException) -> ProducerkitError:
    """The producerkit error for ``exc`` (itself if it already is one), with ``exc`` as its
    ``__cause__``; anything the table does not name is a DeliveryError."""
    if isinstance(exc, ProducerkitError):
        return exc
    kind: type[ProducerkitError] = DeliveryError
    for classes, producerkit_error in TABLE:
        if isinstance(exc, classes):
            kind = producerkit_error
            break
    error = kind(describe(exc))
    error.__cause__ = exc
    return error


def describe(exc: BaseException) -> str:
    """``"ClassName: message"`` once (an aiokafka error's str already starts with its name)."""
    name, text = type(exc).__name__, str(exc)
    return text if text.startswith(f"{name}:") or text == name else f"{name}: {text}"
