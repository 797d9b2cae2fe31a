"""nats-py's exceptions -> producerkit's: the NATS backends' one error edge.

:func:`translate` is the only place a nats-py (or socket, or TLS) exception becomes a producerkit
error: by its class through :data:`TABLE` (the first entry it is an instance of wins), except
for the server's ``-ERR`` lines, which nats-py raises as a plain ``nats.errors.Error`` carrying
only the server's text (no code), read by :data:`SERVER_ERRORS`, and JetStream's refusals, which
carry an API error code: :func:`jetstream_refusal` makes their error, here for nats-py's
``APIError`` and in ``pubacks`` for a PubAck's. The original is kept as the new error's
``__cause__``.
"""

from __future__ import annotations

import asyncio
import ssl

import nats.errors
import nats.js.errors

from producerkit import _security
from producerkit.errors import (
    AuthenticationError,
    AuthorizationError,
    BrokerUnavailable,
    DeliveryError,
    ExpectationFailed,
    MessageTooLarge,
    ProducerkitError,
    ProduceTimeout,
    TLSError,
)


class AnswerLost(BrokerUnavailable):
    """A request written on a connection that was lost before its answer came: it may or may
    not have reached its server."""


#: (exception classes, producerkit error), in order of precedence.
TABLE: tuple[tuple[tuple[type[BaseException], ...], type[ProducerkitError]], ...] = (
    ((nats.errors.AuthorizationError,), AuthenticationError),
    (
        (
            ssl.SSLError,
            nats.errors.SecureConnRequiredError,
            nats.errors.SecureConnWantedError,
            nats.errors.SecureConnFailedError,
        ),
        TLSError,
    ),
    ((nats.errors.MaxPayloadError,), MessageTooLarge),
    ((nats.errors.TimeoutError, asyncio.TimeoutError), ProduceTimeout),
    (
        (
            nats.errors.NoServersError,
            nats.errors.ConnectionClosedError,
            nats.errors.ConnectionDrainingError,
            nats.errors.OutboundBufferLimitError,
            nats.errors.StaleConnectionError,
            nats.errors.UnexpectedEOF,
            ConnectionError,
            OSError,
        ),
        BrokerUnavailable,
    ),
)

#: JetStream's API error codes for a stream that was not as a publish's ``Nats-Expected-*``
#: headers said (nats-server's errors.json): the expected stream does not match (10060), wrong
#: last msg id (10070), wrong last sequence, with the stream's (10071) or without (10164).
EXPECTATION_CODES: frozenset[int] = frozenset({10060, 10070, 10071, 10164})
#: JetStream's "duplicate message id is in process" (409): on a replicated stream, a message with
#: this ``Nats-Msg-Id`` is being stored (its leader proposed it, its replicas have not yet
#: agreed); this copy was not stored, the first one may be.
DUPLICATE_IN_PROCESS = 10158

#: (words in a server -ERR line, producerkit error), in order of precedence.
SERVER_ERRORS: tuple[tuple[tuple[str, ...], type[ProducerkitError]], ...] = (
    (("authorization violation", "authentication"), AuthenticationError),
    (("permissions violation",), AuthorizationError),
    (("ssl context", "secure connection", "tls"), TLSError),
)

#: What uvloop (and asyncio) say when something writes on a transport that was closed.
_CLOSED_TRANSPORT = "the handler is closed"

_UNTRUSTED = (
    ": the broker's certificate is not trusted (tls_ca_file names the CA that signed it; "
    "without TLS options the system CAs are used)"
)


def translate(exc: BaseException) -> ProducerkitError:
    """The producerkit error for ``exc`` (itself if it already is one), with ``exc`` as its
    ``__cause__``; anything not named here is a DeliveryError. Secrets are redacted."""
    if isinstance(exc, ProducerkitError):
        return exc
    text = _security.redact(f"{type(exc).__name__}: {exc}")
    error = _from_server_text(exc, text) or _from_class(exc, text)
    error.__cause__ = exc
    return error


def _from_server_text(exc: BaseException, text: str) -> ProducerkitError | None:
    if type(exc) is not nats.errors.Error:
        return None
    lowered = str(exc).lower()
    for words, kind in SERVER_ERRORS:
        if any(word in lowered for word in words):
            if kind is AuthenticationError:
                return kind(f"the server refused the credentials: {text}")
            return kind(text)
    return None


def jetstream_refusal(text: str, code: int | None) -> DeliveryError:
    """The error for a JetStream refusal with API error ``code`` (None if it has none):
    ExpectationFailed for a failed expectation, else DeliveryError, each with its ``code``."""
    if code in EXPECTATION_CODES:
        return ExpectationFailed(text, code=code)
    return DeliveryError(text, code=code)


def _from_class(exc: BaseException, text: str) -> ProducerkitError:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TLSError(text + _UNTRUSTED)
    if isinstance(exc, RuntimeError) and _CLOSED_TRANSPORT in str(exc):
        return BrokerUnavailable(text)  # a write on a transport the broker closed (uvloop)
    if isinstance(exc, nats.js.errors.APIError):
        code = exc.err_code
        return jetstream_refusal(text, code if type(code) is int else None)
    for classes, kind in TABLE:
        if isinstance(exc, classes):
            return kind(text)
    return DeliveryError(text)


def is_refusal(exc: BaseException) -> bool:
    """Credentials or TLS refused: retrying the same server cannot help."""
    return isinstance(translate(exc), AuthenticationError | TLSError)
