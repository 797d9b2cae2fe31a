"""Producer URLs: parsing one into a backend name, servers and options, and coercing options.

``kafka://h1:9092,h2:9092?linger_ms=5`` -> backend "kafka", servers [("h1", 9092), ("h2", 9092)],
options {"linger_ms": "5"}. Query options are strings here; each backend converts the ones it knows
(see :func:`coerce_option`) and rejects the ones it does not.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote

import attrs

from producerkit import _schemes
from producerkit._security import parse_bool, redact
from producerkit.errors import ConfigurationError

SCHEMES = tuple(sorted(_schemes.SCHEMES))
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$", re.DOTALL)
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)$")


@attrs.frozen(slots=True)
class ParsedURL:
    scheme: str
    servers: tuple[tuple[str, int], ...]
    name: str
    # Query options may hold a password or token: the repr shows them as ***.
    options: Mapping[str, str] = attrs.field(repr=lambda options: repr(redact(options)))
    username: str | None = attrs.field(default=None, repr=False)
    password: str | None = attrs.field(default=None, repr=False)

    def server_strings(self) -> list[str]:
        return [f"{host}:{port}" for host, port in self.servers]


def parse_url(url: object) -> ParsedURL:
    if not isinstance(url, str):
        raise ConfigurationError(f"the producer URL must be a str, got {type(url).__name__}")
    match = _URL.match(url.strip())
    if match is None:
        raise ConfigurationError(
            f"malformed producer URL {_redact(url)!r}: expected SCHEME://HOST:PORT, SCHEME one of "
            f"{', '.join(SCHEMES)}"
        )
    scheme = match["scheme"].lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"unknown URL scheme {scheme!r} in {_redact(url)!r}: use one of {', '.join(SCHEMES)}"
        )
    rest = match["rest"]
    rest, _, query = rest.partition("?")
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise ConfigurationError(f"the producer URL {_redact(url)!r} must not have a #fragment")
    options = _parse_query(query, url)
    username = password = None
    if "@" in rest:
        userinfo, _, rest = rest.rpartition("@")
        user, _, pw = userinfo.partition(":")
        username, password = unquote(user) or None, unquote(pw) if pw else None
    if scheme in ("memory", "null"):
        name = rest.strip("/")
        if scheme == "memory" and not name:
            # An unnamed memory store belongs to one producer (and its connections) only.
            name = f"anonymous-{uuid.uuid4().hex}"
        return ParsedURL(scheme, (), name, options, username, password)
    hostpart, _, path = rest.partition("/")
    if path.strip("/"):
        raise ConfigurationError(
            f"the producer URL {_redact(url)!r} has a path {path!r}: pass the topic as topic="
        )
    servers = tuple(_parse_server(part, scheme, url) for part in hostpart.split(","))
    return ParsedURL(scheme, servers, "", options, username, password)


def _parse_query(query: str, url: str) -> dict[str, str]:
    if not query:
        return {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError as exc:
        raise ConfigurationError(f"malformed query string in {_redact(url)!r}") from exc
    options: dict[str, str] = {}
    for key, value in pairs:
        if key in options:
            raise ConfigurationError(f"option {key!r} given twice in {_redact(url)!r}")
        options[key] = value
    return options


def _parse_server(part: str, scheme: str, url: str) -> tuple[str, int]:
    part = part.strip()
    if not part:
        raise ConfigurationError(f"the producer URL {_redact(url)!r} names no host")
    if part.startswith("["):
        host, sep, port_text = part.rpartition("]:")
        host = host + "]" if sep else part
        port_text = port_text if sep else ""
    else:
        host, sep, port_text = part.partition(":")
    if not _HOST.match(host):
        raise ConfigurationError(f"invalid host {host!r} in {_redact(url)!r}")
    if not sep:
        port = _schemes.SCHEMES[scheme].default_port
        assert port is not None  # only schemes that name servers get here
        return host, port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigurationError(
            f"invalid port {port_text!r} in {_redact(url)!r}: expected a number from 1 to 65535"
        )
    return host, int(port_text)


def _redact(url: str) -> str:
    """The URL with any password or token (userinfo or query) replaced by ***."""
    return redact(url)


def coerce_option(name: str, value: Any, kind: type) -> Any:
    """Convert an option (possibly a string from the URL query) to the type a backend declares."""
    convert = _CONVERTERS.get(kind)
    if convert is None:
        return value
    converted = convert(value)
    if converted is None:
        expected = "non-negative int" if kind is int else kind.__name__
        raise ConfigurationError(f"option {name}={value!r} must be a {expected}")
    return converted


def _to_int(value: object) -> int | None:
    # Every int option is a size, a count or milliseconds: negative ones are mistakes.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and re.fullmatch(r"\+?\d+", value.strip()):
        return int(value)
    return None


def _to_float(value: object) -> float | None:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _to_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


# What coerce_option converts, by declared type: None from a converter means "not a valid one".
_CONVERTERS: dict[type, Callable[[object], object | None]] = {
    bool: parse_bool,
    int: _to_int,
    float: _to_float,
    str: _to_str,
}
