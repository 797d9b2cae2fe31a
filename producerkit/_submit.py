"""The way into flight: the core's ``Admission`` for plain messages, :meth:`Submitter.submit`
for the rest.

A plain message (see ``_core_py.Admission.admit``) or chunk goes in through the producer's
Admission (its core's: C or Python, ``producerkit._core``), which :meth:`Submitter.admission`
makes. Every other message, from ``produce()``, from another thread (``_handoff``) or from a
facade, is a validated :class:`~producerkit._record.Message` submitted here: its topic's partition
count (learned once, ``_topics``), its partition and connection (the core's Router), its turn
under the rate limit (``_rate``), room and admission in the window (``_window``), then its
connection's ``send()``. Until admission a message is nobody's and a failure raises to the
caller; from admission on its outcome is the window's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from producerkit._batch import Columns, message_at, transformed
from producerkit._core import DECLINED
from producerkit._core_py import Send, send
from producerkit._message import MessageRules, check_partition
from producerkit._rate import RateLimit
from producerkit._record import Message, Record, Slot
from producerkit._topics import UNKNOWN, Topics
from producerkit._window import InFlightWindow
from producerkit.backends.base import Connection
from producerkit.errors import ProducerClosed, ProducerkitError

if TYPE_CHECKING:
    from producerkit._core import Core

__all__ = ["ADMITTED_AT_ONCE", "DECLINED", "Submitter"]

#: The most messages of a plain chunk admitted and handed to their connections at once: their
#: records (and sequence numbers) are still in the CPU's cache when they are handed over, and
#: on a backend that acks at once, when they are settled.
ADMITTED_AT_ONCE = 1024


class Submitter:
    """Routes, rate-limits, admits and sends the messages of one producer."""

    __slots__ = (
        "__weakref__",
        "_core",
        "_handed_admission",
        "_rate",
        "_router",
        "_topics",
        "_translate_error",
        "_window",
        "closing",
        "connections",
        "open",
        "sends",
    )

    def __init__(
        self,
        core: Core,
        window: InFlightWindow,
        router: Any,
        topics: Topics,
        rate: RateLimit | None,
        translate_error: Callable[[BaseException], ProducerkitError],
    ) -> None:
        self._core = core
        self._window = window
        self._router = router
        self._topics = topics
        self._rate = rate
        self._translate_error = translate_error
        #: Each connection and its send, by index (set when the producer starts).
        self.connections: Sequence[Connection] = ()
        self.sends: Sequence[Send] = ()
        #: New messages are taken (the producer runs); ``closing``: messages handed over before
        #: the producer began to close are still admitted.
        self.open = False
        self.closing = False
        self._handed_admission: Any = None  # the Admission for handed-over messages

    def admission(self, rules: MessageRules, *, takes_all: bool) -> Any:
        """The producer's Admission (its core's): :meth:`submit` with the checks of ``rules``
        for a plain message or chunk, in one call. None where messages need what it does not
        do (``takes_all`` false: a rate limit or a byte bound; or a key serializer). Its decline
        rule is in ``_core_py.Admission.admit``. Call once the connections are known."""
        self._handed_admission = None
        if not takes_all or rules.key_serializer is not None:
            return None
        admission = self._core.Admission(
            self._router,
            self._window.core,
            tuple(self.sends),
            self.send_failed,
            self.hand_off,
            self._topics.counts,
            rules.default_topic,
            rules.max_payload,
            takes_context=rules.takes_context,
            stamps=rules.takes_context and rules.stores_timestamps,
            value_serializer=rules.value_serializer,
            trace_headers=rules.trace_headers,
        )
        # A handed-over message was checked (and transformed) as a Message already: the
        # Admission takes it only where it would not transform it again.
        self._handed_admission = None if rules.transforms else admission
        return admission

    def submit(
        self, message: Message, slot: Slot, context: Any = None, reserved: bool = False
    ) -> Awaitable[None] | None:
        """Route, wait for the rate limit and for room, admit, send. Returns None when the
        message is handed off, else an awaitable that hands it off (it had to wait). Raises (or
        the awaitable raises) only before admission. ``slot``: a blocking caller's future (or
        None); ``context``: what ``on_delivery`` is told with the outcome; ``reserved``: handed
        over by another thread, with its room held (see ``InFlightWindow.reserve``)."""
        topic = message.topic
        count = self._topics.counts.get(topic, UNKNOWN)
        if count == UNKNOWN:
            return self._submit_later(message, slot, context, reserved, None)
        route = self._route(message, count)
        if self._rate is not None and not self._rate.try_acquire(payload_size(message)):
            return self._submit_later(message, slot, context, reserved, route, True)
        record = self._window.admit(message, route[0], route[1], slot, context, reserved)
        if record is None:
            return self._submit_later(message, slot, context, reserved, route)
        return self.send(record)

    def _route(self, message: Message, count: int | None) -> tuple[int | None, int]:
        """``(partition, connection)`` for ``message`` to a topic of ``count`` partitions: its
        own partition, checked (MessageError), or the router's choice."""
        if message.partition is not None:
            check_partition(message.partition, count, message.topic)
        return self._router.route(message.topic, message.key, message.partition, count)  # type: ignore[no-any-return]

    def submit_handed(
        self, message: Message, slot: Slot, context: Any = None
    ) -> Awaitable[None] | None:
        """:meth:`submit` for a message handed over by another thread (its room reserved):
        a plain nonblocking one through the Admission, as ``produce()`` takes it, where it
        takes it; any other through :meth:`submit`."""
        admission = self._handed_admission
        if admission is not None and slot is None:
            outcome = admission.admit(
                message.value, message.key, message.topic, message.partition, message.headers,
                message.msg_id, context, None, message.timestamp, True,
            )  # fmt: skip
            if outcome is not DECLINED:
                return outcome  # type: ignore[no-any-return]
        return self.submit(message, slot, context, True)

    async def _submit_later(
        self,
        message: Message,
        slot: Slot,
        context: Any,
        reserved: bool,
        route: tuple[int | None, int] | None,
        wait_for_rate: bool = False,
    ) -> None:
        """The rest of :meth:`submit` for a message that must wait: for its topic's partition
        count, its turn under the rate limit, or room in the window. A handed-over message
        (``reserved``) that cannot be admitted fails here, counted, and nothing is raised."""
        try:
            record = await self.admitted(message, slot, context, reserved, route, wait_for_rate)
        except BaseException as exc:
            if not reserved:
                raise
            self._window.fail_unadmitted(message, slot, context, _closed_if_cancelled(exc))
            if not isinstance(exc, Exception):
                raise
            return
        handed_off = self.send(record)
        if handed_off is not None:
            await handed_off

    async def admitted(
        self,
        message: Message,
        slot: Slot,
        context: Any = None,
        reserved: bool = False,
        route: tuple[int | None, int] | None = None,
        wait_for_rate: bool = False,
        *,
        connection: int | None = None,
    ) -> Record:
        """``message`` routed (unless ``route`` is given; on ``connection`` where given), past
        the rate limit and admitted, once it may be: its record, not yet sent. Raises only
        before admission."""
        window, rate = self._window, self._rate
        if route is None:
            route = self._route(message, await self._topics.learn(message.topic))
            wait_for_rate = rate is not None and not rate.try_acquire(payload_size(message))
        if connection is not None:
            route = (route[0], connection)
        if wait_for_rate:
            assert rate is not None
            await rate.wait_for_turn(payload_size(message))
            self._check_open(reserved)
        while (
            record := window.admit(message, route[0], route[1], slot, context, reserved)
        ) is None:
            await window.wait_for_room(payload_size(message))
            self._check_open(reserved)
        return record

    async def submit_batch(
        self,
        columns: Columns,
        topic: str | None,
        rules: MessageRules,
        admission: Any,
    ) -> None:
        """Every message of ``columns``, in order, as :meth:`submit` would each. A plain chunk
        (values and keys only) goes through the Admission ``ADMITTED_AT_ONCE`` messages (or
        the window's room) at a time, each part's records handed to their connections at once;
        the rest, every message checked before any is admitted, through :meth:`submit`.
        Serializers and the trace context are applied to whole columns first."""
        columns = transformed(rules, columns, topic)
        start = 0
        if admission is not None and columns.plain and columns.size:
            start = await self._submit_plain(columns, topic, rules, admission)
        messages = [message_at(rules, columns, topic, i) for i in range(start, columns.size)]
        for index, message in enumerate(messages, start):
            context = None if columns.contexts is None else columns.contexts[index]
            waiting = self.submit(message, None, context)
            if waiting is not None:
                await waiting

    async def _submit_plain(
        self, columns: Columns, topic: str | None, rules: MessageRules, admission: Any
    ) -> int:
        """:meth:`submit_batch` for a plain chunk, through the Admission: where it stopped (the
        size, or the first message it leaves to the checked path). Raises what admitting
        raised, once the records admitted before it are handed over."""
        name = rules.default_topic if topic is None else topic
        if type(name) is str:
            await self._topics.learn(name)

        async def send(by_connection: list[list[Record]]) -> None:
            for index, records in enumerate(by_connection):
                if records:
                    for handed_off in self.send_many(index, records):
                        await handed_off

        return await self.admit_plain(admission, columns, name, rules.takes_tombstones, send)

    async def admit_plain(
        self,
        admission: Any,
        columns: Columns,
        topic: str | None,
        tombstones: bool,
        send: Callable[[list[list[Record]]], Awaitable[None]],
        *,
        closing_stops: bool = True,
    ) -> int:
        """A plain chunk through ``admission.admit_chunk``, ``ADMITTED_AT_ONCE`` messages (or
        the window's room) at a time, each part's records (by connection) given to ``send``
        before the next part is admitted; where the window is full, it waits for room (and,
        with ``closing_stops``, gives up once the producer closes). Where it stopped: the size,
        or the first message it leaves to the checked path. Raises what admitting raised,
        once the records admitted before it were sent."""
        start = 0
        while start < columns.size:
            stop = min(start + ADMITTED_AT_ONCE, columns.size)
            outcome = admission.admit_chunk(
                columns.values, columns.keys, topic, start, stop, tombstones
            )
            if outcome is DECLINED:
                break
            end, by_connection, *stopped = outcome
            await send(by_connection)
            start = end
            if stopped:
                if stopped[0] is DECLINED:  # the lists changed: the rest on the checked path
                    break
                raise stopped[0]
            if end < stop:  # the window is full: wait for it to drain
                await self._window.wait_for_room()
                if closing_stops:
                    self._check_open(False)
        return start

    def send_many(self, index: int, records: list[Record]) -> list[Awaitable[None]]:
        """Hand admitted records to connection ``index`` at once (see Connection.send_many);
        the hand-offs to await."""
        handed = self.connections[index].send_many(records, self.send_failed)
        return [self.hand_off(record, handed_off) for record, handed_off in handed]

    def _check_open(self, reserved: bool) -> None:
        """After a wait: a produce gives up once the producer closes; a message handed over
        before (``reserved``) is still admitted while it closes."""
        if not self.open and not (reserved and self.closing):
            raise ProducerClosed("the producer was closed while this produce waited")

    def send(self, record: Record) -> Awaitable[None] | None:
        """Hand an admitted record to its connection: None, or an awaitable that finishes the
        hand-off. If the connection raises, the record fails."""
        return send(self.sends, self.send_failed, self.hand_off, record)

    def send_failed(self, record: Record, exc: BaseException) -> None:
        """What a connection raised as it was handed a record, translated at the backend's
        edge: the record is not lost, it fails, never written."""
        self._window.failed(record, self._translate_error(exc), possibly_stored=False)

    async def hand_off(self, record: Record, handed_off: Awaitable[None]) -> None:
        """Await what a connection's send returned; if it raises, the record fails. A caller
        cancelled meanwhile leaves the record in flight: its outcome still arrives (or its
        deadline fails it)."""
        try:
            await handed_off
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.send_failed(record, exc)


def payload_size(message: Message) -> int:
    """The bytes of a message's value and key, as the rate limit counts them."""
    value, key = message.value, message.key
    size = 0 if value is None else len(value)
    return size if key is None else size + len(key)


def _closed_if_cancelled(exc: BaseException) -> BaseException:
    if isinstance(exc, Exception):
        return exc
    return ProducerClosed("the producer stopped before this message was admitted")
