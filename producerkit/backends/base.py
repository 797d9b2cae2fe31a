"""The seam between the producer and a broker: a static :class:`BackendSpec` and a
:class:`Connection`.

A backend is chosen by URL scheme (``producerkit.backends.spec_for``). Its **spec** holds what the
producer needs before anything connects: the options it accepts and how they are checked, how a
topic and headers are checked, how keyless messages spread by default, whether records stay with
a connection after ``send()`` returns, and how its client library's exceptions become
producerkit's (the backend's one error edge).

A **connection** is one link to the broker, built with all its state in ``__init__``. The
producer owns everything else, written once: the in-flight window, deadlines, stats, routing,
pooling and failure accounting. A connection moves records, and for each record it was handed
reports exactly one outcome to the :class:`Reports` it was built with: ``acked(record, offset)``
(offset may be None), ``acked_run(records, first_offset)`` for a batch stored at consecutive
offsets, ``acked_each(records, offsets)`` for records acked together at any offsets, or
``failed(record, exc)`` with a producerkit error. Late or duplicate reports are
ignored, so a connection need not track deadlines. A record is a
:class:`~producerkit._record.Record` named tuple: ``record.topic``, ``record.value``...
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from producerkit._options import did_you_mean
from producerkit._record import Record
from producerkit._types import Headers
from producerkit._urls import ParsedURL, coerce_option
from producerkit.errors import AtomicBatchError, ConfigurationError, DeliveryError, ProducerkitError

if TYPE_CHECKING:
    from producerkit._batch import Columns
    from producerkit._record import Message


class Reports(Protocol):
    """Where a connection reports what became of the records it was handed (the producer's
    window and router behind it; nothing of it is public)."""

    def acked(self, record: Record, offset: int | None, duplicate: bool = False) -> None:
        """The record is stored at ``offset``; ``duplicate``: the broker recognised its
        ``msg_id`` and kept the original, stored at ``offset``."""

    def acked_run(
        self, records: list[Record], first_offset: int | None, stored_at: int | None = None
    ) -> None:
        """``acked`` for records stored at consecutive offsets (one batch), counted at once;
        ``stored_at``: the broker's LogAppendTime for the batch (epoch ms), where it has one."""

    def acked_each(self, records: list[Record], offsets: list[int | None]) -> None:
        """``acked`` for records that settled together (one read of acks), each at its own
        offset; an ``on_outcome`` hook sees them as one Outcome."""

    def failed(self, record: Record, exc: BaseException, possibly_stored: bool = True) -> None:
        """The record failed with ``exc`` (a producerkit error). ``possibly_stored``: False only
        where the broker cannot have stored it (never written, or refused by the broker); a
        connection never writes a record after it is reported failed."""

    @property
    def pending(self) -> Mapping[int, Record]:
        """The records in flight, by ``seq``: a record no longer here was settled (by its
        deadline, say) and must not be written any more."""
        ...

    @property
    def failed_count(self) -> int:
        """Records failed so far: while it has not changed, no record left ``pending`` but by
        an ack."""
        ...

    def topic_changed(self, topic: str) -> None:
        """The partition count of ``topic`` may have changed: ask ``prepare_topic`` again."""

    def batch_sent(self, topic: str, partition: int) -> None:
        """A batch for this partition left: sticky keyless partitioning may move on (KIP-480)."""


class Connection(abc.ABC):
    """One connection to a broker (or to memory, or to nowhere)."""

    #: Largest message (value + key + headers) this connection accepts; final after connect().
    max_message_size: int = 1024 * 1024
    #: ``"fast"`` or ``"public"``: how ``connect()`` chose to use the client library, and why
    #: (see ``producerkit.backends._clients``); None for backends without one.
    client_path: str | None = None
    client_path_reason: str = ""
    #: Whether the broker stores each message once, however often it is sent (Kafka's
    #: idempotent producer), once connected, and why (``idempotence_reason``); None for backends
    #: without the notion.
    idempotent: bool | None = None
    idempotence_reason: str = ""
    #: What ``connect()`` is waiting for (``"a producer id (InitProducerId)"``), named in the
    #: BrokerUnavailable of a connect that did not finish in time; "" where nothing in particular.
    awaiting: str = ""
    #: How this connection writes each topic it prepared, where its backend has more than one
    #: way (JetStream: ``"fast ingest"`` or ``"per message: <why>"``), for logs and
    #: ``producerkit bench``; empty where there is one way only (each connection's own dict).
    topic_modes: dict[str, str]

    def __init__(
        self,
        url: ParsedURL,
        options: Mapping[str, Any],
        reports: Reports,
        *,
        timeout: float,
        index: int = 0,
    ) -> None:
        self.url = url
        self.options = dict(options)
        self.reports = reports
        self.timeout = timeout
        self.index = index
        self.topic_modes = {}
        self.setup()

    def setup(self) -> None:
        """Build the connection's own state from ``url``, ``options`` and ``timeout`` (called by
        ``__init__``; nothing connects yet, and ``close()`` must work from here on)."""

    @abc.abstractmethod
    async def connect(self) -> None:
        """Open the connection; raise BrokerUnavailable (or a subclass) if it cannot be opened."""

    async def prepare_topic(self, topic: str) -> int | None:
        """Called once per topic before its first message: the partition count, or None."""
        return None

    @abc.abstractmethod
    def send(self, record: Record) -> Awaitable[None] | None:
        """Hand a record off. Return None, or an awaitable when the caller must wait for buffer
        space (not for the ack). Report the outcome later through ``reports``. What it raises is
        translated by the spec's ``translate_error`` and fails this record."""

    def unwritten(self, records: list[Record]) -> set[int]:
        """The ``seq`` of each of ``records`` this connection still holds without having
        written it anywhere (asked when records fail by their deadline, at close, or by
        ``purge()``: they fail as not stored). A connection that holds records back must drop
        each that failed (no longer in ``reports.pending``) before it writes. Default: nothing
        is held back."""
        return set()

    def send_many(
        self, records: list[Record], failed: Callable[[Record, Exception], object]
    ) -> list[tuple[Record, Awaitable[None]]]:
        """Hand off ``records``, in order, as ``send()`` would each (the default does just
        that). A record whose hand-off raises is passed to ``failed(record, exc)`` and the
        others go on. Returns the ``(record, awaitable)`` pairs whose hand-off the caller must
        await (what their ``send()`` returned)."""
        waiting: list[tuple[Record, Awaitable[None]]] = []
        for record in records:
            try:
                handed_off = self.send(record)
            except Exception as exc:
                failed(record, exc)
                continue
            if handed_off is not None:
                waiting.append((record, handed_off))
        return waiting

    def flush(self) -> None:
        """Start sending now what waits (for a linger, the end of the loop turn, a burst's
        confirmation), without waiting for it: the producer's ``flush()`` wants it, or its
        window is full, so no more messages come until acks free room. Acks still arrive
        through ``reports``, and may arrive during this call (Kafka's ``acks=0``). Default:
        nothing waits."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection, even if connect() failed or never ran. Records not yet reported
        are failed by the producer above."""

    def __repr__(self) -> str:
        where = ",".join(self.url.server_strings()) or self.url.name
        return f"<{type(self).__name__} {self.url.scheme}://{where}>"


class AtomicSide(Protocol):
    """What a backend's :class:`AtomicWriter` gets of the batch it writes: the core's side,
    where every message is admitted into the producer's window (validated, routed, rate
    limited, counted in flight with its deadline) and whose outcome the batch settles."""

    @property
    def records(self) -> list[Record]:
        """The batch's admitted records so far, in order."""
        ...

    async def admit(self, message: Message, connection: int) -> Record:
        """``message`` admitted for the producer's connection ``connection`` (an index) and
        added to :attr:`records`: the writer writes it; the batch tells its outcome."""
        ...

    def plain_topic(self, columns: Columns, topic: str | None) -> str | None:
        """The topic a chunk of plain columns (values and keys only) can be admitted into at
        once with :meth:`admit_plain`, or None where it takes the per-message path."""
        ...

    async def admit_plain(
        self,
        columns: Columns,
        topic: str,
        write: Callable[[list[Record]], Awaitable[None]],
    ) -> int:
        """Admit a plain chunk's messages for connection 0, a slice at a time, each slice
        added to :attr:`records` and handed to ``write``; where it stopped (the size, or the
        first message it leaves to the per-message path)."""
        ...


class AtomicWriter(abc.ABC):
    """One atomic batch's writes on a backend: how it opens, writes its messages, commits and
    aborts. The batch around it (``producerkit._atomic.AtomicBatch``) holds the lifecycle:
    it calls :meth:`open` once, :meth:`add` (and :meth:`add_columns`) while its block runs,
    then :meth:`settled` and :meth:`commit`, or :meth:`abort`, and :meth:`close` always
    after a successful :meth:`open`. An :class:`~producerkit.AtomicBatchError` raised by
    ``add`` fails the batch; the batch fails its records, never the writer."""

    #: The batch's id (JetStream's batch id, Kafka's transactional id).
    id: str
    #: What errors call the batch (``"atomic batch 3f2a..."``, ``"transaction 'orders'"``).
    name: str

    def check(self, count: int, expect: object) -> None:
        """Before message ``count + 1`` is made: raise AtomicBatchError (``"refused"``) where
        the batch cannot take it (it is full, an expectation it cannot carry); that leaves the
        batch as it was. Default: any message."""

    @abc.abstractmethod
    async def open(self) -> None:
        """Open the batch (wait for room among the producer's open batches, begin it)."""

    @abc.abstractmethod
    async def add(self, messages: list[Message]) -> None:
        """Admit (through the side) and write ``messages``, in order."""

    async def add_columns(self, columns: Columns, topic: str | None) -> int:
        """Admit and write a chunk of columns at once where the backend can: how many of its
        messages it took (the rest go to :meth:`add`). Default: none."""
        return 0

    async def written(self) -> None:
        """Wait until the messages added so far are written (a ``flush()`` inside the block).
        Default: they are written as they are added."""

    async def settled(self) -> AtomicBatchError | None:
        """Before the commit: wait until every message was answered; the first failure among
        them, or None. Default: none to wait for."""
        return None

    @abc.abstractmethod
    async def commit(self, prepare: bool) -> object:
        """Commit the batch and ack its records; with ``prepare``, leave it open for another
        process to end and return its handle (else None). Raises AtomicBatchError, with
        ``possibly_stored`` set where the commit may have been taken."""

    async def abort(self, error: AtomicBatchError) -> AtomicBatchError:
        """End a batch that will not commit (whatever the broker holds of it is dropped); the
        error its messages fail with (``error``, or a better explanation). Default: nothing
        was stored before a commit."""
        return error

    async def close(self) -> None:
        """Give back what :meth:`open` took. Default: nothing."""


class Prepared(Protocol):
    """The handle of a prepared atomic batch: a tuple of plain values (picklable, and a JSON
    list as it is) that another process ends through :class:`PreparedBatches`."""

    @property
    def name(self) -> str:
        """The name the batch was prepared as (a writer's own, as in ``{job}-{partition}``)."""
        ...

    @property
    def messages(self) -> int:
        """How many messages the batch holds."""
        ...

    def __iter__(self) -> Iterator[Any]: ...


class PreparedBatches(abc.ABC):
    """The second phase of a two-phase commit on a backend whose atomic batches can be left
    open (``atomic_batch(prepare=True)``): what a coordinator (a Spark job's driver) uses to
    have writers prepare under names of its choosing and to end what they prepared, without a
    producer of its own. ``options`` are a producer's backend options (security, ...); each
    step raises AtomicBatchError (with its ``kind``) or ConfigurationError."""

    #: The producer option that names its prepared batches (refused where a coordinator names
    #: them), and the one that says how long one may stay open.
    name_option: str
    timeout_option: str

    @abc.abstractmethod
    def refusal(self, options: Mapping[str, Any]) -> str | None:
        """Why a producer with these options cannot prepare batches, or None."""

    @abc.abstractmethod
    def options(
        self, timeout: float, name: str | None = None, fresh: bool = False
    ) -> dict[str, Any]:
        """The producer options under which a prepared batch may stay open ``timeout`` seconds
        and, with ``name``, is prepared as ``name`` (``fresh``: only if no producer took the
        name before: a late writer fails instead of ending a newer one's batch); the ends'
        options take them too."""

    @abc.abstractmethod
    def timeout(self, options: Mapping[str, Any]) -> float | None:
        """How long ``options`` let a prepared batch stay open, in seconds (None: not said)."""

    @abc.abstractmethod
    def handle(self, values: Sequence[Any]) -> Prepared:
        """The handle whose values (``list(handle)``) these are."""

    @abc.abstractmethod
    async def end(
        self,
        url: str,
        prepared: Prepared,
        *,
        commit: bool,
        timeout: float,
        options: Mapping[str, Any],
    ) -> None:
        """Commit (or abort) ``prepared``."""

    @abc.abstractmethod
    async def abort_open(
        self, url: str, names: Sequence[str], *, timeout: float, options: Mapping[str, Any]
    ) -> None:
        """Abort whatever each of ``names`` has open (a committed batch stays committed), and
        fence any writer still preparing under one."""


class AtomicWrites(abc.ABC):
    """A backend's atomic batches for one producer (its state across batches)."""

    #: Why ``atomic_batch(prepare=True)`` is refused here (None: :meth:`AtomicWriter.commit`
    #: takes ``prepare``).
    prepare_refusal: str | None = "this backend has no transactions to leave open"
    #: How prepared batches are ended elsewhere, where ``prepare_refusal`` is None.
    prepared: PreparedBatches | None = None

    def __init__(self, parts: AtomicParts) -> None:
        self.parts = parts

    @abc.abstractmethod
    def writer(self, side: AtomicSide) -> AtomicWriter:
        """The writer of one new batch."""

    async def close(self) -> None:
        """The producer closes: close what the batches opened. Default: nothing."""


@attrs.frozen(slots=True)
class AtomicParts:
    """What a producer gives its backend's :class:`AtomicWrites`."""

    url: ParsedURL
    #: The producer's checked options.
    options: Mapping[str, Any]
    timeout: float
    #: The producer's own reports (its window behind them).
    reports: Reports
    #: The producer's connections, once it started.
    connections: Callable[[], list[Connection]]
    #: ``(topic) -> its partitions``, learned as ``Producer.partitions_for`` does.
    partitions_for: Callable[[str], Awaitable[frozenset[int] | None]]


def coerce_options(declared: Mapping[str, type], options: Mapping[str, Any]) -> dict[str, Any]:
    """Convert options to their declared types; an unknown name is a ConfigurationError."""
    checked: dict[str, Any] = {}
    for name, value in options.items():
        kind = declared.get(name)
        if kind is None:
            known = ", ".join(sorted(declared)) or "none"
            hint = did_you_mean(name, declared)
            raise ConfigurationError(
                f"unknown option {name!r} for this backend; {hint}options it accepts: {known}"
            )
        checked[name] = coerce_option(name, value, kind)
    if checked.get("partitions", 1) < 1:
        raise ConfigurationError(f"partitions must be at least 1, got {checked['partitions']}")
    return checked


def _no_default_window(_: Mapping[str, Any]) -> int | None:
    return None


def _accept(_: Any) -> None:
    """A check that lets everything through."""


def any_error(exc: BaseException) -> ProducerkitError:
    """The error edge of a backend without a client library: anything is a DeliveryError."""
    if isinstance(exc, ProducerkitError):
        return exc
    error = DeliveryError(f"{type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


@attrs.frozen(slots=True)
class BackendSpec:
    """What the producer knows of a backend before connecting (one per URL scheme)."""

    #: The connection class: one instance per ``connections=N``.
    connection: type[Connection]
    #: Options accepted as keywords or URL query parameters, with their types.
    options: Mapping[str, type]
    #: ``(options) -> checked options``: types converted, values validated, at construction.
    check_options: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    #: Raises MessageError if a topic is not valid here (called once per topic).
    check_topic: Callable[[str], None] = _accept
    #: Raises MessageError if this backend cannot carry these headers.
    check_headers: Callable[[Headers], None] = _accept
    #: ``(client exception) -> producerkit error``, keeping the original as ``__cause__``.
    translate_error: Callable[[BaseException], ProducerkitError] = any_error
    #: How keyless messages spread when the user does not say: sticky suits batching backends.
    default_keyless: str = "round_robin"
    #: Whether records stay with a connection after send() returns (batches, acks to come).
    holds_records: bool = True
    #: Whether ``produce(expect=...)`` (JetStream's expected stream/sequence/msg id) applies.
    takes_expectations: bool = False
    #: ``(checked options) -> the window's default size`` for these options (None: the
    #: producer's own default); what a preset brings to the window.
    default_window: Callable[[Mapping[str, Any]], int | None] = _no_default_window
    #: Whether a record is stored with the time it is given (Kafka's CreateTime).
    stores_timestamps: bool = False
    #: Why ``produce(timestamp=...)`` is refused here (None: it is taken).
    timestamp_refusal: str | None = None
    #: Why a tombstone (a None value) is refused here (None: it is stored).
    tombstone_refusal: str | None = None
    #: Whether a Delivery carries where the message was stored (``Delivery.offset``).
    acks_with_offset: bool = True
    #: Whether every topic has partitions, without options (NATS has them with ``partitions=N``).
    partitioned: bool = True
    #: Whether a header may have a None value (a null header value).
    takes_null_header_values: bool = True
    #: Whether what is acked can be read back (a log, a stream or a store; not core NATS).
    stores_records: bool = True
    #: The one optional capability beside the connection: an AtomicWrites made of AtomicParts,
    #: made once per producer at its first ``Producer.atomic_batch()``; None: no atomic batches.
    atomic_writes: type[AtomicWrites] | None = None
    #: Why ``Producer.atomic_batch`` is refused here, where ``atomic_writes`` is None.
    atomic_batch_refusal: str = "this backend has no atomic batches"
    #: ``(url, topic, options) -> seconds`` within which the broker drops a message whose
    #: ``msg_id`` it stored for ``topic`` (None: no stream to ask, and none would be created);
    #: None where the backend drops no message by its id.
    duplicate_window: Callable[[str, str, Mapping[str, Any]], Awaitable[float | None]] | None = None

    @property
    def takes_tombstones(self) -> bool:
        return self.tombstone_refusal is None

    @property
    def takes_timestamps(self) -> bool:
        return self.timestamp_refusal is None

    @property
    def prepared(self) -> PreparedBatches | None:
        """How a batch left open here (``atomic_batch(prepare=True)``) is ended elsewhere;
        None where none can be left open (``prepare_refusal`` says why)."""
        return None if self.atomic_writes is None else self.atomic_writes.prepared

    @property
    def prepare_refusal(self) -> str | None:
        """Why no atomic batch can be left open here (None: one can)."""
        if self.atomic_writes is None:
            return self.atomic_batch_refusal
        return self.atomic_writes.prepare_refusal

    def checked_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        if self.check_options is not None:
            return self.check_options(options)
        return coerce_options(self.options, options)
