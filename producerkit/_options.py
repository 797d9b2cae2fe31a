"""Every Producer setting, declared once: :class:`ProducerOptions`.

Each field has its type, its default, a one-line doc, the backends that take it and where else it
may come from. The rest is derived from these fields: :class:`~producerkit.Producer`'s keyword
arguments (``tests/test_options.py`` checks that the signature lists exactly these), the
environment and TOML loader (``producerkit.settings``), the Spark sink's keywords and options
(with :data:`SPARK_DEFAULTS`, its own defaults) and the flags of ``producerkit produce``. Backend
options (``linger_ms``, ``create_stream``, ...) are declared by each backend's spec and passed
through as they are.

A ``ProducerOptions`` checks every value when it is built and raises
:class:`~producerkit.ConfigurationError` naming the first bad one.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import attrs

from producerkit.errors import ConfigurationError

if TYPE_CHECKING:
    from producerkit import partitioners
    from producerkit._types import DeliveryCallback, Failure, Outcome, Stats
    from producerkit.serializers import Serializer

__all__ = [
    "ALL_BACKENDS",
    "SPARK_DEFAULTS",
    "Accepted",
    "ProducerOptions",
    "backends_taking",
    "check_option_names",
    "configurable",
    "convert_text",
    "did_you_mean",
    "producer_accepts",
    "unknown_option",
]

ALL_BACKENDS: Final = frozenset({"kafka", "jetstream", "nats", "memory", "null"})


def _positive_int(_: object, field: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (type(value) is not int or value <= 0):
        raise ConfigurationError(f"{field.name} must be a positive int, got {value!r}")


def _positive_number(_: object, field: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not is_positive_seconds(value):
        raise ConfigurationError(
            f"{field.name} must be a positive number of seconds, got {value!r}"
        )


#: The most ``connections`` a producer opens (to each broker): far beyond any use, and short of
#: the per-connection counters a mistyped huge number would allocate (10**10: a MemoryError).
MAX_CONNECTIONS: Final = 1024


def _connections(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """A positive int up to :data:`MAX_CONNECTIONS` (``connections`` has no None)."""
    if value is None:
        raise ConfigurationError(f"{field.name} must be a positive int, got None")
    _positive_int(instance, field, value)
    if isinstance(value, int) and value > MAX_CONNECTIONS:
        raise ConfigurationError(f"{field.name} must be at most {MAX_CONNECTIONS}, got {value!r}")


def _given_positive_number(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """``_positive_number`` for a setting that has no None (``timeout``, ``stats_interval``)."""
    if value is None:
        raise ConfigurationError(f"{field.name} must be a positive number of seconds, got None")
    _positive_number(instance, field, value)


def _fraction(_: object, field: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigurationError(f"{field.name} must be a number from 0 to 1, got {value!r}")


def _callback(_: object, field: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not callable(value):
        raise ConfigurationError(f"{field.name} must be a callable ({field.metadata['doc']})")


def _flag(_: object, field: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not bool:
        raise ConfigurationError(f"{field.name} must be True or False, got {value!r}")


def is_positive_seconds(value: object) -> bool:
    """Whether ``value`` is a finite number of seconds above zero."""
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and value > 0
        and value != float("inf")
    )


def _setting(
    default: Any,
    doc: str,
    *,
    text: type | None,
    check: Callable[[Any, attrs.Attribute[Any], Any], None] | None = None,
    backends: frozenset[str] = ALL_BACKENDS,
    cli: bool = True,
) -> Any:
    """A field of ProducerOptions. ``text``: the type its text converts to where it comes from
    text (environment, TOML, Spark options, command line); None: only code can give it (a
    callable). ``cli``: ``producerkit produce`` has a flag for it."""
    return attrs.field(
        default=default,
        validator=check,
        metadata={"doc": doc, "text": text, "backends": backends, "cli": cli and text is not None},
    )


@attrs.frozen(kw_only=True)
class ProducerOptions:
    """The settings of one Producer (backend options apart), checked."""

    topic: str | None = _setting(
        None, "default topic (Kafka topic, NATS subject) for produces that name none", text=str
    )
    max_in_flight_messages: int | None = _setting(
        None,
        "most messages in flight at once (default 1000; Kafka's idempotent default: 10,000)",
        text=int,
        check=_positive_int,
    )
    timeout: float = _setting(
        30.0,
        "seconds a message may stay unacknowledged before it fails; also bounds connecting",
        text=float,
        check=_given_positive_number,
    )
    connections: int = _setting(
        1,
        "connections to the broker; a partition always uses the same one",
        text=int,
        check=_connections,
    )
    partitioner: str | partitioners.KeyPartitioner = _setting(
        "xxhash",
        "key partitioner: xxhash, murmur2 (Java's), memphis, crc32 or a function",
        text=str,
    )
    keyless: str | partitioners.KeylessPartitioner | None = _setting(
        None,
        "how keyless messages spread: sticky or round_robin (default: the backend's)",
        text=str,
    )
    on_error: Callable[[Failure], object] | None = _setting(
        None, "called with each Failure as it happens", text=None, check=_callback
    )
    on_delivery: DeliveryCallback | None = _setting(
        None,
        "called once per message with (Delivery or Failure, context)",
        text=None,
        check=_callback,
    )
    on_outcome: Callable[[Outcome], object] | None = _setting(
        None,
        "called with an Outcome per group of messages that settle together",
        text=None,
        check=_callback,
    )
    on_stats: Callable[[Stats], object] | None = _setting(
        None,
        "called with a Stats snapshot every stats_interval seconds",
        text=None,
        check=_callback,
    )
    stats_interval: float = _setting(
        5.0, "seconds between on_stats calls", text=float, check=_given_positive_number, cli=False
    )
    value_serializer: str | Serializer | None = _setting(
        None, "turns each value into bytes: json, str, bytes or a function", text=str, cli=False
    )
    key_serializer: str | Serializer | None = _setting(
        None, "turns each key into bytes: json, str, bytes or a function", text=str, cli=False
    )
    propagate_trace: bool = _setting(
        False,
        "inject the current OpenTelemetry context into each message's headers",
        text=bool,
        check=_flag,
    )
    max_in_flight_bytes: int | None = _setting(
        None,
        "most bytes (values, keys, headers) in flight at once; None: no bound",
        text=int,
        check=_positive_int,
    )
    resume_at: float = _setting(
        0.5,
        "the fraction of each bound a full window drains to before produces go on",
        text=float,
        check=_fraction,
    )
    max_rate: float | None = _setting(
        None, "most messages per second, over every connection; None: no limit", text=float
    )
    max_bytes_rate: float | None = _setting(
        None, "most bytes (value + key) per second; None: no limit", text=float
    )
    rate_burst: float | None = _setting(
        None,
        "messages an idle producer may send at once (default: 50 ms of max_rate)",
        text=float,
    )
    spool: str | None = _setting(
        None, "a file every failed message is appended to, for producerkit replay", text=str
    )

    def __attrs_post_init__(self) -> None:
        if self.rate_burst is not None and self.max_rate is None and self.max_bytes_rate is None:
            raise ConfigurationError("rate_burst needs max_rate or max_bytes_rate")


#: The settings whose default differs in the Spark sink (``producerkit.spark``: ``publish()``,
#: ``partition_writer()``, ``batch_publisher()``, ``format("producerkit")``), and why; every other
#: setting keeps its default above there too. Each is applied where the setting is not given.
#:
#: - ``max_in_flight_messages``: a Spark task hands its producer a whole Arrow batch in one hop
#:   (10,000 rows, Spark's ``spark.sql.execution.arrow.maxRecordsPerBatch``) as one
#:   ``produce_batch``: a window that holds a batch admits it without stopping midway, and no
#:   one waits on a row's ack (a task waits once, at its flush), so the deeper window costs no
#:   latency anyone sees.
SPARK_DEFAULTS: Final[Mapping[str, Any]] = MappingProxyType({"max_in_flight_messages": 10_000})


def configurable() -> Iterator[attrs.Attribute[Any]]:
    """The settings that may come from text (environment, TOML, Spark options, CLI flags)."""
    return (field for field in attrs.fields(ProducerOptions) if field.metadata["text"] is not None)


def did_you_mean(name: str, backend_options: Iterable[str] = ()) -> str:
    """The hint for a mistyped keyword or option ``name``: ``"did you mean 'X' (a Producer
    setting)? "``, the closest Producer settings first, then the closest of the backend's
    ``backend_options``; ``""`` when nothing is close. A typo lands among a backend's options
    (``Producer(**options)``), so both are searched: ``max_inflight`` names the window too."""
    settings = [field.name for field in attrs.fields(ProducerOptions)]
    options = [option for option in backend_options if option not in settings]
    close = difflib.get_close_matches(name, settings + options, n=3, cutoff=0.6)
    parts = []
    for names, what in (
        ([n for n in close if n in settings], ("a Producer setting", "Producer settings")),
        ([n for n in close if n not in settings], ("this backend's option", "its options")),
    ):
        if names:
            quoted = " or ".join(repr(n) for n in names)
            parts.append(f"{quoted} ({what[len(names) > 1]})")
    return f"did you mean {', or '.join(parts)}? " if parts else ""


#: One kind of name an entry point takes: (what one of them is, what they all are, the names),
#: e.g. ``("a Producer setting", "Producer settings", [...])``.
Accepted = tuple[str, str, Collection[str]]


def producer_accepts(scheme: str, backend_options: Iterable[str]) -> list[Accepted]:
    """What ``Producer(url, **keywords)`` takes for a ``scheme://`` URL: its settings (declared
    by :class:`ProducerOptions`) and the backend's options (declared by its spec)."""
    settings = [field.name for field in attrs.fields(ProducerOptions)]
    options = [name for name in backend_options if name not in settings]
    return [
        ("a Producer setting", "Producer settings", settings),
        ("this backend's option", f"{scheme}:// options", options),
    ]


def check_option_names(names: Iterable[str], scheme: str, accepted: Sequence[Accepted]) -> None:
    """Raise :func:`unknown_option`'s error for the first of ``names`` that none of
    ``accepted`` has."""
    known = {name.lower() for _, _, group in accepted for name in group}
    for name in names:
        if name.lower() not in known:
            raise unknown_option(name, scheme, accepted)


def backends_taking(name: str) -> list[str]:
    """The schemes whose backend declares the option ``name`` (as its spec says; a backend whose
    client library is not installed cannot say, and is left out)."""
    from producerkit._schemes import SCHEMES
    from producerkit.backends import spec_for
    from producerkit.errors import ProducerkitError

    found = []
    for scheme in sorted(SCHEMES):
        try:
            spec = spec_for(scheme)
        except ProducerkitError:
            continue
        if name.lower() in {option.lower() for option in spec.options}:
            found.append(scheme)
    return found


def unknown_option(name: str, scheme: str, accepted: Sequence[Accepted]) -> ConfigurationError:
    """The error for the option ``name``, which an entry point given a ``scheme://`` URL does
    not take; ``accepted``: what it takes, its own names first. It says, in order: the closest
    names it takes, each with what it is, the closest first ("did you mean"); the other
    backends whose option ``name`` is; every name it takes, by kind. Names compare without case
    (Spark lowercases ``.option()`` names)."""
    kinds = {candidate.lower(): one for one, _, group in accepted for candidate in group}
    spelled = {candidate.lower(): candidate for _, _, group in accepted for candidate in group}
    close = difflib.get_close_matches(name.lower(), list(spelled), n=3, cutoff=0.6)
    everies = {one: every for one, every, _ in accepted}
    closest: dict[str, list[str]] = {}  # kind -> its close names, the closest kind first
    for lowered in close:
        closest.setdefault(kinds[lowered], []).append(spelled[lowered])
    parts = [
        f"{' or '.join(map(repr, names))} ({one if len(names) == 1 else everies[one]})"
        for one, names in closest.items()
    ]
    hint = f"did you mean {', or '.join(parts)}? " if parts else ""
    owners = [owner for owner in backends_taking(name) if owner != scheme]
    if owners:
        schemes = " and ".join(f"{owner}://" for owner in owners)
        hint += f"it is an option of {schemes}, not of {scheme}://; "
    listing = "; ".join(
        f"{every}: {', '.join(sorted(group))}" for _, every, group in accepted if group
    )
    return ConfigurationError(
        f"unknown option {name!r} for {scheme}://; {hint}what it accepts: {listing}"
    )


def convert_text(name: str, text: str, source: str) -> Any:
    """The setting ``name`` from its text (``source`` names where it came from, for errors)."""
    kind = attrs.fields_dict(ProducerOptions)[name].metadata["text"]
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigurationError(f"{source}={text!r}: {name} must be true or false")
    try:
        return kind(text)
    except ValueError:
        expected = "an int" if kind is int else "a number" if kind is float else kind.__name__
        raise ConfigurationError(f"{source}={text!r}: {name} must be {expected}") from None
