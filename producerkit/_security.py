"""TLS and credentials, written once for every backend, and :func:`redact` for everything printed.

Options (keywords or URL query parameters, the same names on kafka://, nats:// and jetstream://):

==================  =====================================================================
``tls_ca_file``     PEM file of the CA(s) that signed the broker's certificate
``tls_cert_file``   PEM client certificate (mutual TLS); may also hold the key
``tls_key_file``    PEM private key of the client certificate
``tls_verify``      verify the broker's certificate and host name (default true)
``username``        user (Kafka SASL, NATS user/password)
``password``        its password
``token``           NATS token
``creds_file``      NATS ``.creds`` file (user JWT + nkey seed)
``sasl_mechanism``  Kafka: ``PLAIN`` (default), ``SCRAM-SHA-256``, ``SCRAM-SHA-512`` or
                    ``OAUTHBEARER``
``sasl_oauth_token_provider``  Kafka OAUTHBEARER: a callable returning the access token (plain
                    or async), or an ``aiokafka.abc.AbstractTokenProvider``; implies
                    ``sasl_mechanism="OAUTHBEARER"``; a keyword only (not a URL parameter)
==================  =====================================================================

TLS is on when any ``tls_*`` option is given. ``username``/``password`` may also come from the
URL (``jetstream://alice:pw@host:4222``) or from ``PRODUCERKIT_USERNAME``/``PRODUCERKIT_PASSWORD``;
an explicit option wins over the URL, which wins over the environment.

Secrets never reach a repr: once checked, ``password`` and ``token`` are :class:`Secret` objects
that print as ``***`` and are revealed only when handed to the client library. Everything that
prints user-supplied text (URLs, option mappings, error messages) goes through :func:`redact`.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar, overload

from producerkit.errors import ConfigurationError

__all__ = [
    "ENV_PASSWORD",
    "ENV_USERNAME",
    "OPTIONS",
    "SASL_MECHANISMS",
    "Secret",
    "check_options",
    "describe",
    "merge_credentials",
    "redact",
    "redact_url",
    "reveal",
    "ssl_context",
]

ENV_USERNAME: Final = "PRODUCERKIT_USERNAME"
ENV_PASSWORD: Final = "PRODUCERKIT_PASSWORD"

#: The security options and their types, merged into each broker backend's ``OPTIONS``.
OPTIONS: Final[Mapping[str, type]] = {
    "creds_file": str,
    "password": str,
    "sasl_mechanism": str,
    "sasl_oauth_token_provider": object,
    "tls_ca_file": str,
    "tls_cert_file": str,
    "tls_key_file": str,
    "tls_verify": bool,
    "token": str,
    "username": str,
}
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")

_SECRETS: Final = frozenset({"password", "token"})
_FILES: Final = ("tls_ca_file", "tls_cert_file", "tls_key_file", "creds_file")
_ONLY: Final[Mapping[str, tuple[str, str]]] = {
    "token": ("nats", "Kafka authenticates with username/password and sasl_mechanism"),
    "creds_file": ("nats", "Kafka authenticates with username/password and sasl_mechanism"),
    "sasl_mechanism": ("kafka", "NATS takes username/password, token or creds_file"),
    "sasl_oauth_token_provider": ("kafka", "NATS takes username/password, token or creds_file"),
}

REDACTED: Final = "***"


class Secret:
    """A password or token: prints as ``***`` everywhere; :meth:`reveal` gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return REDACTED

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:
        # Options travel to Spark executors pickled; the value must survive, the repr must not.
        return (Secret, (self._value,))


def reveal(value: object) -> str:
    """The text of a secret option (a :class:`Secret` or a plain string)."""
    return value.reveal() if isinstance(value, Secret) else str(value)


# ---------------------------------------------------------------------- options


def merge_credentials(
    url_username: str | None,
    url_password: str | None,
    options: Mapping[str, Any],
    accepted: Mapping[str, type],
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``options`` with ``username``/``password`` filled from the URL's userinfo, then from the
    environment. Nothing is added for backends without credentials (memory://, null://), and
    the environment is not consulted when a token or creds file is given."""
    merged = dict(options)
    if "username" not in accepted:
        return merged
    for name, value in (("username", url_username), ("password", url_password)):
        if value is not None:
            merged.setdefault(name, value)
    if "token" in merged or "creds_file" in merged:
        return merged
    env = os.environ if environ is None else environ
    for name, variable in (("username", ENV_USERNAME), ("password", ENV_PASSWORD)):
        value = env.get(variable)
        if value:
            merged.setdefault(name, value)
    return merged


def check_options(
    backend: str, options: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``options`` into (the others, the checked security options) for ``backend``
    (``"kafka"`` or ``"nats"``). Error messages name options, never their secret values."""
    rest: dict[str, Any] = {}
    checked: dict[str, Any] = {}
    for name, value in options.items():
        if name in OPTIONS:
            checked[name] = _checked_value(backend, name, value)
        else:
            rest[name] = value
    _check_files(checked)
    _check_credentials(checked)
    return rest, checked


def _checked_value(backend: str, name: str, value: Any) -> Any:
    only = _ONLY.get(name)
    if only is not None and only[0] != backend:
        raise ConfigurationError(f"option {name!r} is not used by {backend}: {only[1]}")
    if name in _SECRETS:
        if isinstance(value, Secret):
            value = value.reveal()
        if not isinstance(value, str) or not value:
            raise ConfigurationError(f"option {name!r} must be a non-empty str")
        return Secret(value)
    if name == "tls_verify":
        return _bool(value)
    if name == "sasl_oauth_token_provider":
        if not callable(value) and not callable(getattr(value, "token", None)):
            # A URL query cannot carry one: say so without echoing what was given.
            raise ConfigurationError(
                "option 'sasl_oauth_token_provider' must be a callable returning the access "
                "token, or an aiokafka.abc.AbstractTokenProvider (pass it as a keyword)"
            )
        return value
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ConfigurationError(f"option {name!r} must be a non-empty str")
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _check_files(checked: dict[str, Any]) -> None:
    for name in _FILES:
        if name in checked and not Path(checked[name]).expanduser().is_file():
            raise ConfigurationError(f"{name}: no such file {checked[name]!r}")
    if "tls_key_file" in checked and "tls_cert_file" not in checked:
        raise ConfigurationError("tls_key_file needs tls_cert_file (the client certificate)")


def _check_credentials(checked: dict[str, Any]) -> None:
    """Credentials that go together are all there; the SASL mechanism is named in upper case."""
    if "password" in checked and "username" not in checked:
        raise ConfigurationError(
            "a password needs a username: pass username=, put user:password@ in the URL or set "
            f"{ENV_USERNAME}"
        )
    if "username" in checked and "password" not in checked:
        raise ConfigurationError(
            f"username {checked['username']!r} has no password: pass password=, put "
            f"user:password@ in the URL or set {ENV_PASSWORD}"
        )
    if "token" in checked and "username" in checked:
        raise ConfigurationError("give either token or username/password, not both")
    mechanism = checked.get("sasl_mechanism")
    if mechanism is None and "sasl_oauth_token_provider" in checked:
        mechanism = "OAUTHBEARER"
    if mechanism is not None:
        mechanism = checked["sasl_mechanism"] = mechanism.upper()
        if mechanism not in SASL_MECHANISMS:
            raise ConfigurationError(
                f"sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)}, got {mechanism!r}"
            )
        oauth = mechanism == "OAUTHBEARER"
        if oauth and "sasl_oauth_token_provider" not in checked:
            raise ConfigurationError(
                "sasl_mechanism OAUTHBEARER needs sasl_oauth_token_provider (a callable "
                "returning the access token)"
            )
        if oauth and "username" in checked:
            raise ConfigurationError(
                "OAUTHBEARER authenticates with the token provider: give no username/password"
            )
        if not oauth and "sasl_oauth_token_provider" in checked:
            raise ConfigurationError(
                f"sasl_oauth_token_provider is for OAUTHBEARER, not sasl_mechanism {mechanism!r}"
            )
        if not oauth and "username" not in checked:
            raise ConfigurationError("sasl_mechanism needs username and password")


def parse_bool(value: object) -> bool | None:
    """A bool, or its spelling in a URL query or environment variable; None if it is neither."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
        return False
    return None


def _bool(value: object) -> bool:
    flag = parse_bool(value)
    if flag is not None:
        return flag
    # The value is not echoed: a secret pasted into the wrong option must not be printed.
    raise ConfigurationError("option tls_verify must be a bool (true/false)")


def tls_enabled(options: Mapping[str, Any]) -> bool:
    return any(name.startswith("tls_") for name in options)


def ssl_context(options: Mapping[str, Any]) -> ssl.SSLContext | None:
    """The client SSLContext the ``tls_*`` options describe, or None when TLS is off.

    Without ``tls_ca_file`` the system's CAs are trusted. ``tls_verify=False`` still encrypts
    but accepts any certificate: for development only.
    """
    if not tls_enabled(options):
        return None
    ca_file = options.get("tls_ca_file")
    try:
        context = ssl.create_default_context(
            cafile=os.path.expanduser(ca_file) if ca_file else None
        )
        if not options.get("tls_verify", True):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        cert_file = options.get("tls_cert_file")
        if cert_file:
            key_file = options.get("tls_key_file")
            context.load_cert_chain(
                os.path.expanduser(cert_file), os.path.expanduser(key_file) if key_file else None
            )
    except (ssl.SSLError, OSError, ValueError) as exc:
        # The ssl module's messages name files and OpenSSL reasons, never key material.
        raise ConfigurationError(f"cannot load the TLS files: {exc}") from exc
    return context


def describe(options: Mapping[str, Any]) -> str:
    """A short, secret-free summary for reprs: ``"tls user='alice'"``, ``"token"``, or ``""``."""
    parts = []
    if tls_enabled(options):
        parts.append("tls" if options.get("tls_verify", True) else "tls(unverified)")
    if "username" in options:
        parts.append(f"user={options['username']!r}")
    if "sasl_oauth_token_provider" in options:
        parts.append("oauthbearer")
    if "token" in options:
        parts.append("token")
    if "creds_file" in options:
        parts.append("creds")
    return " ".join(parts)


# ---------------------------------------------------------------------- redaction

#: Option or field names whose values are secrets, wherever they appear.
_SECRET_NAME = re.compile(
    r"(?i)(password|passwd|secret|token|api_?key|private_?key|credentials|^pass$|^pw$)"
)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*):[^/@\s]*@")
_NATS_TOKEN_USERINFO = re.compile(r"(?P<scheme>\b(?:nats|jetstream|tls)://)[^/@:\s]+@")
_NAMED = re.compile(
    r"""(?ix)
    (?P<name>["']?\b[\w.-]*(?:password|passwd|secret|token|api_?key|private_?key)["']?
      \s*[=:]\s*)
    (?P<value>"[^"]*"|'[^']*'|[^\s&,;)}\]]+)
    """
)
_PEM = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S)
_NKEY_SEED = re.compile(r"\bS[A-Z][A-Z2-7]{56}\b")
_JWT = re.compile(r"\beyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]*")

T = TypeVar("T")


def redact_url(url: str) -> str:
    """The URL with its password (and a NATS token in the userinfo) shown as ``***``."""
    url = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", url)
    return _NATS_TOKEN_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", url)


def _redact_text(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    text = redact_url(text)
    text = _PEM.sub(REDACTED, text)
    text = _NKEY_SEED.sub(REDACTED, text)
    text = _JWT.sub(REDACTED, text)

    def named(match: re.Match[str]) -> str:
        value = match["value"]
        quote = value[0] if value[:1] in ("'", '"') else ""
        return f"{match['name']}{quote}{REDACTED}{quote}"

    return _NAMED.sub(named, text)


@overload
def redact(value: str, secrets: Iterable[str | Secret] = ()) -> str: ...
@overload
def redact(value: Mapping[str, Any], secrets: Iterable[str | Secret] = ()) -> dict[str, Any]: ...
@overload
def redact(value: T, secrets: Iterable[str | Secret] = ()) -> T | str: ...
def redact(value: Any, secrets: Iterable[str | Secret] = ()) -> Any:
    """``value`` with every secret shown as ``***``.

    - a ``str``: URL passwords, ``password=...``/``"token": "..."`` pairs, PEM private keys,
      NATS nkey seeds and JWTs, and each of ``secrets`` (exact values) are replaced;
    - a mapping: values under secret-looking names (``password``, ``token``,
      ``sasl_plain_password``, ``*secret*``, ...) become ``***``, other values are redacted
      recursively;
    - a list or tuple: each item; a :class:`Secret`: ``***``; anything else: unchanged.
    """
    known = [reveal(secret) for secret in secrets]
    return _redact(value, known)


def _redact(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, Secret):
        return REDACTED
    if isinstance(value, str):
        return _redact_text(value, secrets)
    if isinstance(value, Mapping):
        return {
            key: REDACTED
            if isinstance(key, str) and _SECRET_NAME.search(key) and value[key] is not None
            else _redact(value[key], secrets)
            for key in value
        }
    if type(value) in (list, tuple):
        return type(value)(_redact(item, secrets) for item in value)
    return value
