"""The NATS backends' options and the checks made before anything connects: subjects and
headers are validated once per topic and per message here, so nats-py need not."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from producerkit import _security
from producerkit._types import Headers
from producerkit.backends.base import coerce_options
from producerkit.errors import ConfigurationError, MessageError

#: Core NATS options: ``partitions=N`` maps partition p to subject ``{topic}.{p}`` (Memphis-style
#: partitions); ``pending_size`` is nats-py's outgoing buffer (bytes kept while reconnecting).
OPTIONS: Final[dict[str, type]] = {
    "partitions": int,
    "pending_size": int,
    "name": str,
    **_security.OPTIONS,
}
#: JetStream adds ``create_stream`` (create a stream for a topic that has none) and its
#: ``stream_storage``, ``memory`` or ``file``, its ``stream_replicas`` (1 to 5: how many servers
#: of a cluster store it; default 1), and ``allow_atomic`` (the stream it creates takes
#: atomic batches); ``fast_ingest`` (default true): write to a stream that allows fast batches
#: (``allow_batched``) in fast batches, acked a batch at a time (docs/jetstream.md).
JETSTREAM_OPTIONS: Final[dict[str, type]] = {
    **OPTIONS,
    "create_stream": bool,
    "stream_storage": str,
    "stream_replicas": int,
    "allow_atomic": bool,
    "fast_ingest": bool,
}

_BAD_SUBJECT = re.compile(r"[\s*>]|^\.|\.$|\.\.")
_BAD_HEADER_NAME = re.compile(r"[\s:]")


def checker(declared: Mapping[str, type]) -> Any:
    """The check_options of a NATS backend accepting ``declared``."""

    def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
        # Security options are checked apart, so that no message can print a password.
        others, security = _security.check_options("nats", options)
        checked = coerce_options(declared, others)
        checked.update(security)
        if checked.get("stream_storage", "memory") not in ("memory", "file"):
            raise ConfigurationError("stream_storage must be 'memory' or 'file'")
        if not 1 <= checked.get("stream_replicas", 1) <= 5:
            raise ConfigurationError(
                "stream_replicas must be 1 to 5 (JetStream's limit); a cluster of N servers "
                "takes at most N"
            )
        return checked

    return check_options


def check_topic(topic: str) -> None:
    if _BAD_SUBJECT.search(topic):
        raise MessageError(
            f"invalid NATS subject {topic!r}: no spaces, no wildcards (* >), no empty tokens"
        )


def check_headers(headers: Headers) -> None:
    for name, data in headers:
        if _BAD_HEADER_NAME.search(name):
            raise MessageError(f"invalid NATS header name {name!r}: no spaces or colons")
        if data is None:
            raise MessageError(
                f"NATS header {name!r} has a None value: NATS headers have no null value "
                "(give b'' for an empty one)"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise MessageError(
                f"NATS header {name!r} must be UTF-8 text; NATS headers cannot carry binary"
            ) from None
        if "\r" in text or "\n" in text:
            raise MessageError(f"NATS header {name!r} must not contain line breaks")
