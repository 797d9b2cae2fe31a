"""Every error producerkit raises, in one tree.

::

    ProducerkitError                   base of everything below
    ├── ConfigurationError (ValueError)    bad URL, option or producer setting, at construction
    │   └── MissingDependencyError (ImportError)  a backend's extra is not installed
    │       └── IncompatibleClientError           its client library is a version not supported
    ├── MessageError (ValueError)          a bad value/key/headers/topic/partition, at produce()
    │   ├── MessageTooLarge                    larger than the backend accepts
    │   └── SerializationError                 a value_serializer/key_serializer raised
    ├── BrokerUnavailable (ConnectionError)    cannot connect, or the connection is gone
    │   ├── AuthenticationError                credentials refused
    │   └── TLSError                           handshake or certificate failure
    ├── AuthorizationError                 the broker refused this message (permissions)
    ├── DeliveryError                      the broker rejected this message for another reason;
    │   │                                      ``.code``: JetStream's error code, or None
    │   ├── ExpectationFailed                  the stream was not as the message's Expect said:
    │   │                                      wrong last sequence (10071, 10164), wrong last
    │   │                                      msg id (10070), another stream (10060)
    │   └── AtomicBatchError                   a JetStream atomic batch ended without a commit
    ├── ProduceTimeout (TimeoutError)      not acked within ``timeout``; or flush/close deadline
    ├── ProducerClosed                     produce() after close(), or closed with it in flight
    │   └── ProducerForked                     used in a process forked from the one it started in
    ├── Purged                             failed on purpose by ``purge()``
    ├── LoopThreadError (RuntimeError)     a blocking SyncProducer call made on its own loop thread
    └── ProduceError                       aggregate: ``.failures`` holds every failed message

Errors about one call are raised at that call, and the producer stays usable. Errors about one
message after it was handed off are recorded in a :class:`~producerkit.Failure` (with the message),
passed to ``on_error`` and raised together by ``flush()`` as a :class:`ProduceError`.
Client library exceptions never escape: backends translate them at their edge and chain the
original as ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from producerkit._types import Failure

__all__ = [
    "AtomicBatchError",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerUnavailable",
    "ConfigurationError",
    "DeliveryError",
    "ExpectationFailed",
    "IncompatibleClientError",
    "LoopThreadError",
    "MessageError",
    "MessageTooLarge",
    "MissingDependencyError",
    "ProduceError",
    "ProduceTimeout",
    "ProducerClosed",
    "ProducerForked",
    "ProducerkitError",
    "Purged",
    "SerializationError",
    "TLSError",
]


class ProducerkitError(Exception):
    """Base class of every producerkit error."""


class ConfigurationError(ProducerkitError, ValueError):
    """A URL, option or producer setting is invalid."""


class MissingDependencyError(ConfigurationError, ImportError):
    """A backend needs an optional dependency that is not installed."""


class IncompatibleClientError(MissingDependencyError):
    """The installed client library (aiokafka, nats-py) is a version producerkit does not support.

    Raised by ``start()`` before anything connects. :attr:`package`, :attr:`version` (None if its
    version cannot be read) and :attr:`supported` (a pip requirement range) say which.
    """

    def __init__(self, package: str, version: str | None, supported: str) -> None:
        self.package = package
        self.version = version
        self.supported = supported
        installed = f"{package} {version}" if version else f"{package} (version unknown)"
        super().__init__(
            f"{installed} is installed, but producerkit supports {package}{supported}: "
            f'run  pip install "{package}{supported}"'
        )


class MessageError(ProducerkitError, ValueError):
    """A message given to ``produce()`` is invalid; nothing was sent."""


class MessageTooLarge(MessageError):
    """The message is larger than the backend accepts."""


class SerializationError(MessageError):
    """A ``value_serializer`` or ``key_serializer`` raised; the original is the ``__cause__``."""


class BrokerUnavailable(ProducerkitError, ConnectionError):
    """The broker cannot be reached, or the connection to it was lost."""


class AuthenticationError(BrokerUnavailable):
    """The broker refused the credentials."""


class TLSError(BrokerUnavailable):
    """The TLS handshake failed (certificate not trusted, TLS required or refused)."""


class AuthorizationError(ProducerkitError):
    """The broker refused this message: the user may not publish to its topic."""


class DeliveryError(ProducerkitError):
    """The broker rejected this message (no stream for the subject, invalid record, ...).

    :attr:`code` is the error code the broker gave with the refusal, where it gives one
    (JetStream's API error code, as in nats-server's ``errors.json``), else None.
    """

    def __init__(self, *args: object, code: int | None = None) -> None:
        super().__init__(*args)
        self.code = code


class AtomicBatchError(DeliveryError):
    """An atomic batch (``Producer.atomic_batch``: a JetStream atomic batch, or a Kafka
    transaction) ended without a commit: nothing of it was stored (nothing a ``read_committed``
    Kafka consumer sees), and each of its messages failed with this error.

    ``kind`` says why, to branch on: ``"aborted"`` (the block inside ``async with`` raised),
    ``"message_failed"`` (a message of it failed, or passed its deadline, before the commit),
    ``"refused"`` (the broker refused it: ``code``), ``"fenced"`` (Kafka: a newer producer took
    the transactional id; this producer's atomic batches end so from then on), ``"timed_out"``
    (Kafka: the coordinator aborted the transaction for outliving ``transaction_timeout_ms``,
    and refused its commit: ``code``; the producer's next batch begins anew),
    ``"coordinator_unavailable"`` (Kafka: no transaction coordinator answered within the
    timeout), ``"unsupported"`` (the broker or stream does not take atomic batches), and
    ``"commit_unanswered"`` (the commit's answer was lost: the batch may have been stored).

    On JetStream, ``code`` is the server's error code where the server refused it: 10174 the
    stream does not allow atomic batches (create it with ``allow_atomic=True``), 10176 the batch is
    incomplete (a message lost, or the server abandoned the batch after 10 s without a message),
    10177 a header a batch cannot carry, 10199 more messages than the server takes in one batch
    (1,000 by default), 10071 or 10164 an expectation that did not hold at the commit. It is None
    where the producer refused the batch before it reached the server (the same reasons, said
    before sending), where the block inside ``async with`` raised, where a message passed its
    deadline before the commit, or where the commit's answer was lost: then, and only then, the
    batch may have been stored all the same (:attr:`possibly_stored`, as each message's
    ``Failure.possibly_stored``).
    """

    def __init__(
        self,
        *args: object,
        code: int | None = None,
        possibly_stored: bool = False,
        kind: str | None = None,
    ) -> None:
        super().__init__(*args, code=code)
        self.possibly_stored = possibly_stored
        self.kind = kind


class ExpectationFailed(DeliveryError):
    """JetStream refused the message because the stream was not as the message expected (a
    ``producerkit.Expect``, or raw ``Nats-Expected-*`` headers): another message was stored
    since (wrong last sequence or subject sequence, codes 10071 and 10164; wrong last msg id,
    10070), or the subject belongs to another stream (10060).

    Nothing was stored. Resending the same message cannot succeed, and resending it without its
    expectations would ignore the conflict, so :meth:`~producerkit.Failure.retry_kwargs` refuses
    to do either unasked: read the stream again and decide.
    """


class ProduceTimeout(ProducerkitError, TimeoutError):
    """A message was not acknowledged in time, or flush()/close() reached its deadline."""


class ProducerClosed(ProducerkitError):
    """The producer is closed, or was closed before this message was acknowledged."""


class ProducerForked(ProducerClosed):
    """The producer was started in another process, this one's parent (``os.fork()``:
    gunicorn ``--preload``, multiprocessing's fork start method, Celery's prefork pool). Its
    connections and its loop thread belong to the parent: create a new producer in this process.
    Every call raises this at once, and nothing is written to the parent's connections."""


class Purged(ProducerkitError):
    """The message was failed on purpose by :meth:`Producer.purge`: before it was sent, or
    (``in_flight=True``) while it waited for its ack, in which case it may still be stored."""


class LoopThreadError(ProducerkitError, RuntimeError):
    """A blocking :class:`~producerkit.SyncProducer` call was made on the thread that runs its
    own event loop (from a callback, say): it could only deadlock, so it is refused at once."""


class ProduceError(ProducerkitError):
    """Some messages failed; :attr:`failures` holds each with its exception, ready to retry.

    A producer keeps the first 10,000 Failures between two ``flush()`` calls; the rest are
    counted (``unkept``: how many of each error type), so an outage cannot grow its memory
    without bound. ``count`` is how many failed in all. Every failure is told to
    ``on_error`` / ``on_delivery`` and written to the ``spool`` as it happens, kept or not."""

    def __init__(
        self,
        failures: Sequence[Failure],
        message: str | None = None,
        *,
        unkept: Mapping[str, int] | None = None,
    ) -> None:
        self.failures: list[Failure] = list(failures)
        self.unkept: dict[str, int] = dict(unkept or {})
        self.count = len(self.failures) + sum(self.unkept.values())
        if message is None:
            message = _summarize(self.failures, self.unkept)
        super().__init__(message)


def _summarize(failures: Sequence[Failure], unkept: Mapping[str, int]) -> str:
    counts: dict[str, int] = dict(unkept)
    for failure in failures:
        name = type(failure.exception).__name__
        counts[name] = counts.get(name, 0) + 1
    parts = ", ".join(f"{count} {name}" for name, count in sorted(counts.items()))
    first = f"; first: {failures[0].exception}" if failures else ""
    kept = f"; the first {len(failures)} are in .failures" if unkept else ""
    return f"{sum(counts.values())} message(s) failed ({parts}){first}{kept}"
