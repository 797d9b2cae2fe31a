"""The core's hot path in Python: the readable implementation of what ``_speedups.c`` does in C.

Each name here has a C twin of the same name and signature in ``producerkit._speedups``;
``producerkit._core`` chooses one implementation for the whole core, once, at import. Read this
module to know what the C one does:

- :class:`WindowCore`: the ledger of records in flight; :meth:`WindowCore.full` is the one
  check of the in-flight bound, :meth:`WindowCore.admit` puts a message in flight.
- :class:`Router`: a message's partition and connection.
- :class:`Admission`: ``produce()``'s plain nonblocking message (:meth:`Admission.admit`) and
  ``produce_batch``'s plain chunk (:meth:`Admission.admit_chunk`): checked, routed, admitted and
  handed to its connection; every other message is :data:`DECLINED`, for the checked path
  (``MessageRules.message``, then ``Submitter.submit``).
- :func:`pop_run`, :func:`tell_run`, :func:`new_delivery`: settling an acked run of records.
- :class:`ProducerCore` and :func:`ProduceDoor`: where ``produce()`` reaches its admission.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Final, TypeVar, cast

from producerkit._message import message_size
from producerkit._record import Message, Record, Slot, new_message, new_record
from producerkit._types import Delivery

#: What :meth:`Admission.admit` and :meth:`Admission.admit_chunk` return for what they leave to
#: the checked path, having done nothing: the built-in ``NotImplemented``, shared by both
#: implementations.
DECLINED: Final = NotImplemented

_NO_COUNT: Final = object()  # a topic whose partition count is not known yet


class WindowCore:
    """The window's ledger: ``pending`` (seq -> record, in admission order), the bound, the
    peak, and the messages other threads handed over (``handed``; ``taken``: those admitted)."""

    __slots__ = (
        "_seqs",
        "_watch",
        "handed",
        "limit",
        "peak_in_flight",
        "pending",
        "taken",
        "timeout",
        "untrack",
        "watching",
    )

    def __init__(
        self,
        limit: int,
        timeout: float,
        watch: Callable[[Record], object],
        untrack: bool = False,
    ) -> None:
        self.limit = limit
        self.timeout = timeout
        self.untrack = untrack  # the C twin stops the GC tracking records (see _record)
        self.pending: dict[int, Record] = {}
        self.peak_in_flight = 0
        self.handed = 0
        self.taken = 0
        self._watch = watch  # called with the first record into an empty window unless watching
        #: The window's deadline timer is armed (the window sets and clears it): while it is,
        #: a record into an empty window needs no watch() call.
        self.watching = False
        self._seqs = itertools.count(1)

    def full(self) -> bool:
        """Whether the window holds ``limit`` messages: those admitted and not settled, and
        those handed over by other threads and not yet admitted. The in-flight bound: every
        admission asks it."""
        return len(self.pending) + self.handed - self.taken >= self.limit

    def admit(
        self,
        message: Message,
        partition: int | None,
        connection: int,
        slot: Slot,
        context: Any = None,
        reserved: bool = False,
    ) -> Record | None:
        """Put ``message`` in flight as a record routed to ``partition`` on ``connection``
        (carrying ``slot`` and ``context``): in ``pending``, counted in the peak, its deadline
        watched if the window was empty. From here on it must end acked or failed. None (and
        nothing done) if the window is :meth:`full`. ``reserved``: a message handed over by
        another thread, whose room its reservation holds: no room is asked, and it is counted
        ``taken`` once it is in ``pending`` (in flight may look one higher between the two,
        never one lower: no reservation can take its room)."""
        if not reserved and self.full():
            return None
        pending = self.pending
        in_flight = len(pending)
        seq = next(self._seqs)
        record = new_record(
            seq, message, partition, time.monotonic() + self.timeout, connection, slot, context
        )
        pending[seq] = record
        if reserved:
            self.taken += 1
        if in_flight >= self.peak_in_flight:
            self.peak_in_flight = in_flight + 1
        if not in_flight and not self.watching:
            self._watch(record)
        return record


class Router:
    """Routes messages for one producer.

    ``partitioner(key, n)`` places keyed messages (``key_hash(key) % n`` when it is a plain
    modulo of a C hash, one Python call less); ``keyless_partition(topic, n)`` places the rest.
    A partition always uses connection ``partition % connections``; an unpartitioned keyed
    message (NATS) uses ``partitioner(key, connections)``, so one key keeps one connection and
    its order; the rest take the connections in turn. ``not_a_partition``: the error raised
    for a partitioner's result that is no int.
    """

    __slots__ = (
        "_connections",
        "_key_hash",
        "_keyless_partition",
        "_not_a_partition",
        "_partitioner",
        "_round_robin",
    )

    def __init__(
        self,
        partitioner: Callable[[bytes, int], int],
        key_hash: Callable[[bytes], int] | None,
        keyless_partition: Callable[[str, int], int],
        connections: int,
        not_a_partition: type[Exception],
        native_hash: int = 0,
    ) -> None:
        """``native_hash``: the address of ``key_hash`` in C, taken by the C twin (see
        ``_routing.native_hash``); unused here."""
        if connections < 1:
            raise ValueError("Router: connections must be at least 1")
        self._partitioner = partitioner
        self._key_hash = key_hash
        self._keyless_partition = keyless_partition
        self._connections = connections
        self._not_a_partition = not_a_partition
        self._round_robin = 0

    def route(
        self, topic: str, key: bytes | None, partition: int | None, num_partitions: int | None
    ) -> tuple[int | None, int]:
        """``(partition, connection)``: the given partition (checked by the caller) or the one
        chosen for the key or for a keyless message; None where the topic is unpartitioned."""
        if partition is None and num_partitions is not None:
            if key is None:
                partition = self._keyless_partition(topic, num_partitions)
            elif self._key_hash is not None:
                partition = self._key_hash(key) % num_partitions
            else:
                partition = self._partitioner(key, num_partitions)
        connections = self._connections
        if connections == 1:
            return partition, 0
        if partition is not None:
            return partition, self._connection_of(partition)
        if key is not None:
            return partition, self._connection_of(self._partitioner(key, connections))
        self._round_robin = (self._round_robin + 1) % connections
        return partition, self._round_robin

    def _connection_of(self, number: Any) -> int:
        if type(number) is not int:
            raise self._not_a_partition(
                f"the partitioner returned {number!r}, which is not a partition number (an int)"
            )
        return number % self._connections


#: A connection's ``send(record)``.
Send = Callable[[Record], "Awaitable[None] | None"]


def send(
    sends: Sequence[Send],
    send_failed: Callable[[Record, BaseException], object],
    hand_off: Callable[[Record, Awaitable[None]], Awaitable[None]],
    record: Record,
) -> Awaitable[None] | None:
    """Hand an admitted record to its connection, ``sends[record.connection]``: None, or what
    finishes the hand-off (``hand_off(record, what the send returned)``). A send that raises
    fails the record (``send_failed``)."""
    try:
        handed_off = sends[record.connection](record)
    except Exception as exc:
        send_failed(record, exc)
        return None
    if handed_off is None:
        return None
    return hand_off(record, handed_off)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Admission:
    """The hot path for plain messages: checked, routed, admitted and sent in one call.

    ``router``, ``window`` (a :class:`WindowCore`), ``sends`` (each connection's send),
    ``send_failed`` and ``hand_off`` (see :func:`send`) are the producer's; ``topics`` its
    topics' partition counts (None: unpartitioned; a topic not in it is not known yet);
    ``default_topic`` and ``max_payload`` as its ``MessageRules``; ``takes_context``: the producer
    has ``on_delivery``, so a message may carry a context; ``stamps``: fix each record's
    CreateTime (epoch ms) as it is admitted; ``value_serializer``, ``trace_headers``: applied
    as ``MessageRules`` applies them.
    """

    __slots__ = (
        "_default_topic",
        "_hand_off",
        "_max_payload",
        "_router",
        "_send_failed",
        "_sends",
        "_stamps",
        "_takes_context",
        "_topics",
        "_trace_headers",
        "_value_serializer",
        "_window",
    )

    def __init__(
        self,
        router: Router,
        window: WindowCore,
        sends: tuple[Send, ...],
        send_failed: Callable[[Record, BaseException], object],
        hand_off: Callable[[Record, Awaitable[None]], Awaitable[None]],
        topics: dict[str, int | None],
        default_topic: str | None,
        max_payload: int,
        *,
        takes_context: bool = False,
        stamps: bool = False,
        value_serializer: Callable[[Any], Any] | None = None,
        trace_headers: Callable[[], Any] | None = None,
    ) -> None:
        self._router = router
        self._window = window
        self._sends = sends
        self._send_failed = send_failed
        self._hand_off = hand_off
        self._topics = topics
        self._default_topic = default_topic
        self._max_payload = max_payload
        self._takes_context = takes_context
        self._stamps = stamps
        self._value_serializer = value_serializer
        self._trace_headers = trace_headers

    def admit(
        self,
        value: object,
        key: object,
        topic: object,
        partition: object,
        headers: object,
        msg_id: object,
        context: object,
        expect: object,
        timestamp: object,
        reserved: bool = False,
    ) -> Any:
        """One message, with ``produce()``'s arguments: None once it is handed to its
        connection, or an awaitable that finishes the hand-off; :data:`DECLINED`, nothing done,
        for every message but one with a bytes value (after the value serializer), a bytes or
        None key, no partition, headers, msg_id, expectation or timestamp, no context unless
        ``takes_context``, a topic whose partition count is known, a size within
        ``max_payload``, and room in the window (``reserved``: a handed-over message in its
        reserved room, see :meth:`WindowCore.admit`). A serializer or trace context that
        raises declines too (the checked path reports what it raises)."""
        if not self._takes(key, partition, headers, msg_id, context, expect, timestamp):
            return DECLINED
        known = self._known(topic)
        window = self._window
        if known is None or (not reserved and window.full()):
            return DECLINED
        topic, count = known
        key = cast("bytes | None", key)  # _takes checked it
        value = self._serialized(value)
        if type(value) is not bytes:
            return DECLINED
        trace = self._trace()
        if trace is DECLINED:
            return DECLINED
        if message_size(value, key, trace) > self._max_payload:
            return DECLINED
        stamp = _now_ms() if self._stamps else None
        routed, connection = self._router.route(topic, key, None, count)
        message = new_message(value, key, topic, None, trace, None, stamp)
        record = window.admit(message, routed, connection, None, context, reserved)
        if record is None:
            return DECLINED
        return send(self._sends, self._send_failed, self._hand_off, record)

    def _takes(
        self,
        key: object,
        partition: object,
        headers: object,
        msg_id: object,
        context: object,
        expect: object,
        timestamp: object,
    ) -> bool:
        """Whether a call's arguments but its value and topic are a plain message's."""
        return (
            partition is None
            and headers is None
            and msg_id is None
            and expect is None
            and timestamp is None
            and (context is None or self._takes_context)
            and (key is None or type(key) is bytes)
        )

    def _known(self, topic: object) -> tuple[str, int | None] | None:
        """The topic (the default one for None) and its partition count, where it is a str
        whose count is known; else None."""
        if topic is None:
            topic = self._default_topic
        if type(topic) is not str:
            return None
        count = self._topics.get(topic, _NO_COUNT)
        return None if count is _NO_COUNT else (topic, count)  # type: ignore[return-value]

    def _serialized(self, value: object) -> object:
        """The value through the value serializer, where there is one (None stays None);
        DECLINED where it raises."""
        if self._value_serializer is None or value is None:
            return value
        try:
            return self._value_serializer(value)
        except Exception:
            return DECLINED

    def _trace(self) -> Any:
        """The trace context's header pairs (a tuple of (str, bytes)), or None; DECLINED where
        it raises or gives anything else."""
        if self._trace_headers is None:
            return None
        try:
            trace = self._trace_headers()
        except Exception:
            return DECLINED
        if trace is None:
            return None
        if type(trace) is not tuple or not all(
            type(pair) is tuple
            and len(pair) == 2
            and type(pair[0]) is str
            and type(pair[1]) is bytes
            for pair in trace
        ):
            return DECLINED
        return trace

    def _plain(self, value: object, key: object, tombstones: bool) -> bool:
        """Whether a chunk's item is a plain message: a bytes or (a tombstone, where
        ``tombstones``) None value, a bytes or None key, within ``max_payload``."""
        if key is not None and type(key) is not bytes:
            return False
        if value is None:
            if not tombstones or key is None:
                return False
        elif type(value) is not bytes:
            return False
        return message_size(value, key, None) <= self._max_payload

    def _known_chunk(
        self,
        values: list[Any],
        keys: list[Any] | None,
        topic: object,
        start: int,
        stop: int,
        tombstones: bool,
    ) -> tuple[str, int | None] | None:
        """:meth:`_known` for a chunk whose lists and bounds agree; None also where a first
        call (``start`` 0) finds a message that is not plain."""
        size = len(values)
        if keys is not None and len(keys) != size:
            return None
        if not 0 <= start <= stop <= size:
            return None
        known = self._known(topic)
        if known is None or start != 0:
            return known
        for index in range(size):
            if not self._plain(values[index], None if keys is None else keys[index], tombstones):
                return None
        return known

    def admit_chunk(
        self,
        values: list[Any],
        keys: list[Any] | None,
        topic: object,
        start: int,
        stop: int,
        tombstones: bool,
    ) -> Any:
        """``produce_batch``'s messages ``values[start:stop]`` (keys from ``keys``), admitted in
        order until the window is full, none of them sent: ``(end, records by connection)``;
        ``(end, records by connection, DECLINED)`` where it met a message that is not plain
        (the lists changed since the first call); ``(end, records by connection, error)`` where
        routing the ``end``-th raised (the records before it are in flight: send them).
        :data:`DECLINED`, nothing done, where the chunk is not plain (every message is checked
        by the first call, ``start`` 0) or its topic's count is not known."""
        known = self._known_chunk(values, keys, topic, start, stop, tombstones)
        if known is None:
            return DECLINED
        topic, count = known
        plain = self._plain
        checked = start == 0
        window, route = self._window, self._router.route
        by_connection: list[list[Record]] = [[] for _ in self._sends]
        stamp = _now_ms() if self._stamps else None
        declined = False
        index = start
        try:
            while index < stop:
                if index >= len(values) or (keys is not None and index >= len(keys)):
                    declined = True  # a partitioner in Python may have shrunk the lists
                    break
                key = None if keys is None else keys[index]
                if window.full():
                    break  # the caller waits for room and goes on from here
                value = values[index]
                if not checked and not plain(value, key, tombstones):
                    declined = True
                    break
                routed, connection = route(topic, key, None, count)
                message = new_message(value, key, topic, None, None, None, stamp)
                record = window.admit(message, routed, connection, None, None)
                assert record is not None  # the window had room
                by_connection[connection].append(record)
                index += 1
        except Exception as exc:
            if index > start:
                return index, by_connection, exc
            raise
        if declined:
            return DECLINED if index == start else (index, by_connection, DECLINED)
        return index, by_connection


def pop_run(pending: dict[int, Record], records: list[Record]) -> tuple[int, list[int] | None]:
    """Remove each record from ``pending`` and count those that were there; the positions, in
    ``records``, of removed records with a slot (None if none)."""
    pop = pending.pop
    count = 0
    waiting: list[int] | None = None
    for position, record in enumerate(records):
        if pop(record.seq, None) is not None:
            count += 1
            if record.slot is not None:
                if waiting is None:
                    waiting = []
                waiting.append(position)
    return count, waiting


def tell_run(
    pending: dict[int, Record],
    records: list[Record],
    first_offset: int | None,
    stored_at: int | None,
    make_delivery: Callable[..., Delivery],
    on_delivery: Callable[[Delivery, Any], object],
    report: Callable[[Exception], object],
    answer: Callable[[Any, Delivery], object],
) -> int:
    """:func:`pop_run`'s settling, telling ``on_delivery`` of each record still pending (its
    Delivery at ``first_offset`` + its position, the broker's ``stored_at`` or its own
    timestamp; what the callback raises goes to ``report``) and ``answer(slot, delivery)``
    where it has a slot. Returns how many records were still pending."""
    pop = pending.pop
    count = 0
    offset = first_offset
    for record in records:
        if pop(record.seq, None) is not None:
            count += 1
            stamp = stored_at if stored_at is not None else record.timestamp
            delivery = make_delivery(
                record.topic, record.partition, offset, False,
                None if stamp is None else stamp / 1000,
            )  # fmt: skip
            try:
                on_delivery(delivery, record.context)
            except Exception as exc:
                report(exc)
            if record.slot is not None:
                answer(record.slot, delivery)
        if offset is not None:
            offset += 1
    return count


def answer_slot(slot: Any, result: Delivery) -> None:
    """Give a waiting caller's slot its result, unless it has one already (it was cancelled)."""
    if not slot.done():
        slot.set_result(result)


#: ``new_delivery(topic, partition, offset, duplicate, timestamp)``: a Delivery.
new_delivery: Callable[..., Delivery] = Delivery


class ProducerCore:
    """The base of ``Producer``: where ``produce()`` finds its producer's :class:`Admission`
    while it runs (None otherwise). The C twin keeps it in a field of the object, which its
    ``ProduceDoor`` reads without a lookup by name."""

    __slots__ = ("_admission",)

    def __init__(self) -> None:
        self._admission: Any = None


#: An iterator with nothing left: what awaiting a finished :class:`Done` iterates.
_FINISHED: Final[Iterator[None]] = iter(())


class Done:
    """An awaitable that has already finished: awaiting it returns None, or raises the exception
    it holds (once). A coroutine to asyncio and anyio (``send``, ``throw``, ``close``,
    ``__await__``), so a task can be made of it. What :func:`ProduceDoor` returns for a message
    it took."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    def __await__(self) -> Iterator[None]:
        error, self.error = self.error, None
        if error is not None:
            raise error
        return _FINISHED

    def send(self, value: object) -> None:
        error, self.error = self.error, None
        if error is not None:
            raise error
        raise StopIteration

    def throw(self, error: BaseException | type[BaseException], *rest: object) -> None:
        self.error = None
        raise error

    def close(self) -> None:
        pass


#: The shared :class:`Done` that returns None.
DONE: Final = Done()

_Produce = TypeVar("_Produce", bound=Callable[..., Any])


def ProduceDoor(produce: _Produce) -> _Produce:
    """``Producer.produce`` as the class holds it: a call with one positional value,
    ``produce``'s keywords and ``nonblocking`` true, on a producer whose ``_admission`` is an
    :class:`Admission`, goes to :meth:`Admission.admit`: a message taken returns an awaitable
    already finished (:class:`Done`, raising what ``admit`` raised, if it raised) or the
    hand-off to await. Every other call, and every message :data:`DECLINED`, is ``produce``
    with the same arguments: the method itself. The C twin does the same without a Python
    frame, for the C Admission; it calls this door for any other."""

    def door(
        producer: Any,
        *args: Any,
        key: Any = None,
        topic: Any = None,
        partition: Any = None,
        headers: Any = None,
        msg_id: Any = None,
        context: Any = None,
        expect: Any = None,
        timestamp: Any = None,
        nonblocking: Any = False,
        **rest: Any,
    ) -> Any:
        admission = producer._admission
        if type(admission) is Admission and nonblocking and len(args) == 1 and not rest:
            try:
                outcome = admission.admit(
                    args[0], key, topic, partition, headers, msg_id, context, expect, timestamp
                )
            except Exception as exc:
                return Done(exc)
            if outcome is None:
                return DONE
            if outcome is not DECLINED:
                return outcome  # the hand-off, to await as produce() awaits it
        return produce(
            producer, *args,
            key=key, topic=topic, partition=partition, headers=headers, msg_id=msg_id,
            context=context, expect=expect, timestamp=timestamp, nonblocking=nonblocking, **rest,
        )  # fmt: skip

    return cast(_Produce, door)
