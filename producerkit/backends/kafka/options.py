"""The Kafka backend's options: which it accepts, how they are checked at construction, and the
aiokafka settings they become."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from typing import Any, Final

from producerkit import _security
from producerkit.backends.base import coerce_options
from producerkit.backends.kafka import codecs
from producerkit.errors import ConfigurationError, MessageError, MissingDependencyError

#: The option (set by the atomic batches' writer on the connection it opens for them, never by
#: users) that makes a connection the transactional one of Kafka's atomic batches, with this
#: transactional id.
TRANSACTIONAL_OPTION: Final = "_transactional_id"

#: aiokafka producer settings accepted as options, with their types. ``acks`` is special-cased.
AIOKAFKA_OPTIONS: Final[dict[str, type]] = {
    "acks": str,  # 0, 1, -1 or all; converted in check_options
    "client_id": str,
    "compression_type": str,
    "compression_level": int,
    "connections_max_idle_ms": int,
    "enable_idempotence": bool,
    "linger_ms": int,
    "max_batch_size": int,
    "max_batches_in_flight": int,
    "max_request_size": int,
    "metadata_max_age_ms": int,
    "request_timeout_ms": int,
    "retry_backoff_ms": int,
    "send_backoff_ms": int,
}
OPTIONS: Final[dict[str, type]] = {
    **AIOKAFKA_OPTIONS,
    **_security.OPTIONS,
    "preset": str,
    "transactional_id": str,
    "fresh_transactional_id": bool,
    "transaction_timeout_ms": int,
}
#: The transaction timeout when ``transaction_timeout_ms`` is not given: the Java client's.
DEFAULT_TRANSACTION_TIMEOUT_MS: Final = 60_000

#: Batches per partition in flight with ``preset="throughput"`` and for the idempotent producer:
#: the Java client's default, and the most a broker keeps sequence state for. Without
#: idempotence (as there and in librdkafka), a retried batch may then land after a later one.
#: The preset does not linger: a partition's batch already grows while its previous ones are
#: with the broker, and a linger only delays it (see docs/tuning.md).
THROUGHPUT_BATCHES_IN_FLIGHT: Final = 5
#: The most batches per partition in flight a broker orders for an idempotent producer.
IDEMPOTENT_BATCHES_IN_FLIGHT_LIMIT: Final = 5
#: The window when ``max_in_flight_messages`` is not given and a partition may have several
#: batches in flight (the idempotent producer, the default, and ``preset="throughput"``): five
#: batches per partition in flight pay only with enough messages in flight to fill them
#: (docs/tuning.md: the preset alone at a window of 1000 ran at confluent-kafka's pace).
THROUGHPUT_WINDOW: Final = 10_000
#: Batches here grow only while the partition's previous batch is still with the broker, so a
#: large ceiling costs no latency and saves a request per 16 KiB (aiokafka's default) under load.
DEFAULT_MAX_BATCH_SIZE: Final = 512 * 1024
#: The ceiling with ``compression_type="zstd"``: librdkafka's ``batch.size``. zstd's window at
#: its default level (2 MiB) spans the whole section, so a larger one compresses smaller and
#: faster; gzip's window (32 KiB) and lz4's and snappy's blocks (64 KiB) do not, and they keep
#: the default. Counted before compression, a batch of it stays within the broker's default
#: ``message.max.bytes`` (1,048,588) even when the values do not compress.
ZSTD_MAX_BATCH_SIZE: Final = 1_000_000

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Types converted and values checked; ConfigurationError names the first bad one."""
    # Security options are checked apart, so that no message can print a password.
    others, security = _security.check_options("kafka", options)
    acks_given = others.get("acks")
    if type(acks_given) is int:  # acks=1 as a keyword, "1" from a URL: both mean the same
        others = {**others, "acks": str(acks_given)}
    checked = coerce_options(OPTIONS, others)
    checked.update(security)
    if checked.get("preset") not in (None, "latency", "throughput"):
        raise ConfigurationError(
            f"unknown preset {checked['preset']!r}: use 'latency' or 'throughput'"
        )
    if checked.get("max_batches_in_flight", 1) < 1:
        raise ConfigurationError(
            f"max_batches_in_flight must be at least 1, got {checked['max_batches_in_flight']}"
        )
    _check_idempotence(checked)
    if checked.get("fresh_transactional_id") and checked.get("transactional_id") is None:
        raise ConfigurationError(
            "fresh_transactional_id=True asks for the given transactional_id only if it is new: "
            "give transactional_id too (the id a producer makes up for itself is always new)"
        )
    if checked.get("transactional_id") is not None and (refusal := transaction_refusal(checked)):
        raise ConfigurationError(f"transactional_id={checked['transactional_id']!r}: {refusal}")
    _check_compression(checked.get("compression_type"))
    level = codecs.check_level(checked.get("compression_type"), checked.get("compression_level"))
    if level is not None:
        checked["compression_level"] = level
    acks = checked.get("acks")
    if acks is not None:
        if acks not in ("0", "1", "-1", "all"):
            raise ConfigurationError(f"acks must be 0, 1, -1 or 'all', got {acks!r}")
        checked["acks"] = acks if acks == "all" else int(acks)
    return checked


def _idempotence_conflict(options: Mapping[str, Any]) -> str | None:
    """The setting that rules the idempotent producer out, or None: ``"acks"`` other than
    'all' (the broker keeps sequence state only for records every in-sync replica has), or
    ``"max_batches_in_flight"`` above what a broker orders per producer."""
    if options.get("acks") not in (None, "all", "-1", -1):
        return "acks"
    if options.get("max_batches_in_flight", 1) > IDEMPOTENT_BATCHES_IN_FLIGHT_LIMIT:
        return "max_batches_in_flight"
    return None


def _check_idempotence(checked: Mapping[str, Any]) -> None:
    """``enable_idempotence=True`` with settings it cannot keep is refused at construction."""
    if checked.get("enable_idempotence") is not True:
        return
    conflict = _idempotence_conflict(checked)
    if conflict == "acks":
        raise ConfigurationError(
            f"enable_idempotence=True needs acks='all' (the broker keeps sequence state only "
            f"for records all in-sync replicas have), got acks={checked.get('acks')}"
        )
    if conflict is not None:
        raise ConfigurationError(
            f"enable_idempotence=True allows at most {IDEMPOTENT_BATCHES_IN_FLIGHT_LIMIT} "
            f"max_batches_in_flight (what a broker orders per producer), got "
            f"{checked.get('max_batches_in_flight')}"
        )


def transaction_refusal(options: Mapping[str, Any]) -> str | None:
    """Why a producer with these options cannot write transactions (atomic batches), or None.
    A transaction is written by the idempotent producer: settings that rule it out are refused,
    as the Java client refuses them beside a ``transactional.id``, never overridden."""
    if options.get("enable_idempotence") is False:
        return (
            "transactions (atomic batches) are written by the idempotent producer; drop "
            "enable_idempotence=False"
        )
    conflict = _idempotence_conflict(options)
    if conflict == "acks":
        return (
            f"transactions (atomic batches) need acks='all' (every in-sync replica has each "
            f"message before the commit), got acks={options.get('acks')}"
        )
    if conflict is not None:
        return (
            f"transactions (atomic batches) allow at most {IDEMPOTENT_BATCHES_IN_FLIGHT_LIMIT} "
            f"max_batches_in_flight (what a broker orders per producer), got "
            f"{options.get('max_batches_in_flight')}"
        )
    return None


def idempotence_wanted(options: Mapping[str, Any]) -> tuple[bool | None, str]:
    """Whether the producer is to be idempotent, and why: True (required: the broker must
    grant a producer id), None (the default: idempotent where the broker grants one, as the
    Java client since 3.0), False (off: asked for, or settings that rule it out, acks other
    than 'all' or more than 5 batches per partition in flight, as the Java client does)."""
    given = options.get("enable_idempotence")
    if given is not None:
        return given, f"enable_idempotence={given}"
    conflict = _idempotence_conflict(options)
    if conflict == "acks":
        return False, f"acks={options.get('acks')} (idempotence needs acks='all')"
    if conflict is not None:
        return False, (
            f"max_batches_in_flight={options.get('max_batches_in_flight')} (idempotence "
            f"allows at most {IDEMPOTENT_BATCHES_IN_FLIGHT_LIMIT})"
        )
    return None, "the default"


def _check_compression(codec: str | None) -> None:
    """A codec aiokafka knows, whose library is installed: both checked at construction."""
    if codec is None:
        return
    if codec not in codecs.CODECS:
        raise ConfigurationError(
            f"unknown compression_type {codec!r}: use one of {', '.join(codecs.CODECS)}"
        )
    if codec != "gzip" and importlib.util.find_spec("cramjam") is None:
        raise MissingDependencyError(
            f"compression_type={codec!r} needs the cramjam library, which is not installed: "
            'run  pip install "producerkit[kafka]"'
        )


def check_topic(topic: str) -> None:
    if not _TOPIC.match(topic) or topic in (".", ".."):
        raise MessageError(
            f"invalid Kafka topic {topic!r}: use 1 to 249 of the characters a-z A-Z 0-9 . _ -"
        )


def client_settings(options: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """The AIOKafkaProducer keyword arguments for checked ``options``, for a producer that is
    not idempotent (the connection makes it so where the broker grants a producer id, see
    :func:`idempotence_wanted`, with :func:`idempotent_settings`)."""
    settings: dict[str, Any] = {
        "linger_ms": 0,
        "acks": 1,
        "max_batch_size": DEFAULT_MAX_BATCH_SIZE,
    }
    given = {name: v for name, v in options.items() if name not in _security.OPTIONS}
    given.pop("preset", None)  # read by batches_in_flight
    given.pop("max_batches_in_flight", None)  # producerkit's own sender setting, not aiokafka's
    given.pop("compression_level", None)  # producerkit's own codecs take it
    given.pop("enable_idempotence", None)  # see idempotence_wanted
    given.pop("transactional_id", None)  # producerkit's own transactions (atomic_batch)
    given.pop(TRANSACTIONAL_OPTION, None)
    given.pop("transaction_timeout_ms", None)
    given.pop("fresh_transactional_id", None)
    if given.get("compression_type") == "zstd":
        settings["max_batch_size"] = ZSTD_MAX_BATCH_SIZE
    settings.update(given)
    settings["enable_idempotence"] = False
    settings.update(security_settings(options))
    settings.setdefault("request_timeout_ms", int(timeout * 1000))
    return settings


def default_window(options: Mapping[str, Any]) -> int | None:
    """The window's default for these options: THROUGHPUT_WINDOW wherever a partition may have
    several batches in flight (the idempotent producer, the default, and the throughput
    preset), else None (the producer's own default). Without the messages to fill them, five
    batches in flight wait on the window as one does."""
    idempotent = idempotence_wanted(options)[0] is not False
    return THROUGHPUT_WINDOW if batches_in_flight(options, idempotent) > 1 else None


def idempotent_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` for aiokafka's own idempotent producer (the public path)."""
    return {**settings, "enable_idempotence": True, "acks": "all"}


def batches_in_flight(options: Mapping[str, Any], idempotent: bool) -> int:
    """Batches per partition in flight: ``max_batches_in_flight``, else 5 for the idempotent
    producer (the broker keeps each key in order) and with the throughput preset, else 1
    (strict per-key order without the broker's help)."""
    throughput = options.get("preset") == "throughput"
    default = THROUGHPUT_BATCHES_IN_FLIGHT if throughput or idempotent else 1
    return int(options.get("max_batches_in_flight", default))


def security_settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """aiokafka settings (``security_protocol``, ``ssl_context``, SASL) for these options."""
    context = _security.ssl_context(options)
    username = options.get("username")
    provider = options.get("sasl_oauth_token_provider")
    if username is None and provider is None:
        return {"security_protocol": "SSL", "ssl_context": context} if context else {}
    settings: dict[str, Any] = {
        "security_protocol": "SASL_SSL" if context else "SASL_PLAINTEXT",
        "sasl_mechanism": options.get("sasl_mechanism", "PLAIN"),
    }
    if provider is not None:
        settings["sasl_oauth_token_provider"] = _aiokafka_token_provider(provider)
    else:
        settings["sasl_plain_username"] = username
        settings["sasl_plain_password"] = _security.reveal(options["password"])
    if context is not None:
        settings["ssl_context"] = context
    return settings


def _aiokafka_token_provider(provider: Any) -> Any:
    """``provider`` as the ``aiokafka.abc.AbstractTokenProvider`` aiokafka requires: itself if it
    is one, else one whose ``token()`` calls it (awaiting the result if it is awaitable)."""
    import inspect

    from aiokafka.abc import AbstractTokenProvider

    if isinstance(provider, AbstractTokenProvider):
        return provider

    class CallableTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
        async def token(self) -> str:
            token = provider()
            if inspect.isawaitable(token):
                token = await token
            return str(token)

    return CallableTokenProvider()
