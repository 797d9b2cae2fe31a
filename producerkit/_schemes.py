"""The one registry of URL schemes: which backend module serves each, the extra that installs its
client library, and its default port. Imports nothing, so the URL parser and the backend loader
can both read it."""

from __future__ import annotations

from typing import Final, NamedTuple


class Scheme(NamedTuple):
    #: Module under ``producerkit.backends`` holding the spec.
    module: str
    #: Name of the :class:`~producerkit.backends.base.BackendSpec` in that module.
    spec: str
    #: The extra that installs the client library (None: no client library).
    extra: str | None
    #: The client library's distribution name (None: no client library).
    client: str | None
    #: Port used when the URL gives none (None: the URL names no server).
    default_port: int | None


SCHEMES: Final[dict[str, Scheme]] = {
    "jetstream": Scheme("nats", "JETSTREAM", "nats", "nats-py", 4222),
    "kafka": Scheme("kafka", "KAFKA", "kafka", "aiokafka", 9092),
    "memory": Scheme("memory", "MEMORY", None, None, None),
    "nats": Scheme("nats", "NATS", "nats", "nats-py", 4222),
    "null": Scheme("null", "NULL", None, None, None),
}
