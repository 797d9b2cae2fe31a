"""Deprecated: moved to :mod:`producerkit.testing.brokers`; this alias goes in the next release."""

from producerkit import _deprecated
from producerkit.testing.brokers import (
    LocalBroker,
    free_port,
    nats_server_binary,
    start_kafka,
    start_nats,
    tansu_binary,
)

__all__ = [
    "LocalBroker",
    "free_port",
    "nats_server_binary",
    "start_kafka",
    "start_nats",
    "tansu_binary",
]

_deprecated.moved_module("producerkit.brokers", "producerkit.testing.brokers")
