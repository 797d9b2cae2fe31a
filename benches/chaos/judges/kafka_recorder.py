"""The recorders in front of librdkafka's mock cluster, and :class:`RecordingKafkaCluster`,
the mock cluster reached through them (this project's tests' ``kafka_cluster``).

A :class:`Recorder` is one loopback listener per mock broker, advertised in the broker's place
(:meth:`~producerkit.testing.kafka_cluster.KafkaCluster.advertise`), each connection forwarded
to its broker byte for byte, in one thread with its own event loop.

Every byte is written on as soon as it arrives; on the way, each direction is split into
Kafka frames by their size prefix, and only the frames of the requests the transaction view
needs (transactional Produce, EndTxn, InitProducerId: :mod:`chaos.judges.kafka_wire`) and their
responses, matched by correlation id, are copied and read into a
:class:`~chaos.judges.kafka_transactions.TransactionLog`. Every other frame is skipped over by
its size, never copied.

With a :class:`~chaos.judges.kafka_idempotence.BatchLog` (``record_batches=True``) it also
reads every Produce request without a transactional id, and its answer, for the idempotent
producers' batches.

A client that closes its connection half-closes the broker's: answers already on their way
still pass the recorder (a Produce the broker stored counts even when its client is gone).
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

from chaos.judges import kafka_wire as wire
from chaos.judges.kafka_idempotence import BatchLog
from chaos.judges.kafka_transactions import TransactionLog, _Event, _ProduceEvent
from producerkit.errors import ConfigurationError
from producerkit.testing._loop_thread import run_on_loop
from producerkit.testing._sockets import _listening_socket, _set_nodelay, _stop_listening
from producerkit.testing.kafka_cluster import KafkaCluster, KafkaRecord

_CONTROL_TIMEOUT: Final = 10.0
_SIZE: Final = struct.Struct(">i")
_REQUEST_HEAD: Final = 12  # size, api_key, api_version, correlation_id
_RESPONSE_HEAD: Final = 8  # size, correlation_id
_UNREADABLE: Final = (ValueError, struct.error, IndexError, UnicodeDecodeError)


class _Frames:
    """Splits one direction of a connection into Kafka frames: ``want`` sees each frame's first
    ``head`` bytes and says whether to copy the whole frame and hand it to ``handle``."""

    __slots__ = ("buffer", "collect", "handle", "head", "skip", "want")

    def __init__(
        self, head: int, want: Callable[[bytearray], bool], handle: Callable[[bytes], None]
    ) -> None:
        self.head = head
        self.want = want
        self.handle = handle
        self.buffer = bytearray()
        self.skip = 0  # bytes of the current frame still to pass over
        self.collect = 0  # the size of the frame being copied (prefix included); 0: none

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        pos, size = 0, len(data)
        buffer = self.buffer
        while pos < size:
            if self.skip:
                step = min(self.skip, size - pos)
                self.skip -= step
                pos += step
                continue
            if self.collect:
                step = min(self.collect - len(buffer), size - pos)
                buffer += view[pos : pos + step]
                pos += step
                if len(buffer) == self.collect:
                    self._complete()
                continue
            step = min(self.head - len(buffer), size - pos)
            buffer += view[pos : pos + step]
            pos += step
            if len(buffer) < self.head:
                return
            total = 4 + _SIZE.unpack_from(buffer)[0]
            if total < self.head:  # not Kafka framing: stop reading this stream
                self.skip = 1 << 62
                buffer.clear()
            elif self.want(buffer):
                self.collect = total
                if total == self.head:
                    self._complete()
            else:
                self.skip = total - self.head
                buffer.clear()

    def _complete(self) -> None:
        frame = bytes(self.buffer)
        self.buffer.clear()
        self.collect = 0
        self.handle(frame)


class _Tap:
    """Reads one connection's transactional requests and their responses into the log (and,
    given a batch log, the idempotent Produce requests and their answers into that)."""

    __slots__ = ("batches", "log", "pending", "produced", "requests", "responses")

    def __init__(self, log: TransactionLog, batches: BatchLog | None = None) -> None:
        self.log = log
        self.batches = batches
        #: correlation id -> (api key, version, the events the answer fills in)
        self.pending: dict[int, tuple[int, int, list[_Event]]] = {}
        #: With a batch log: correlation id -> (version, the batches' (topic, partition) and
        #: indexes in the log) of idempotent Produce requests.
        self.produced: dict[int, tuple[int, list[tuple[tuple[str, int], int]]]] = {}
        self.requests = _Frames(_REQUEST_HEAD, self._want_request, self._request)
        self.responses = _Frames(_RESPONSE_HEAD, self._want_response, self._response)

    def _want_request(self, head: bytearray) -> bool:
        api_key, api_version, _ = wire.request_header(head)
        return wire.wanted(api_key, api_version)

    def _request(self, frame: bytes) -> None:
        api_key, version, correlation_id = wire.request_header(frame)
        log = self.log
        try:
            events: list[_Event]
            if api_key == wire.PRODUCE:
                if self.batches is not None and self._idempotent(correlation_id, version, frame):
                    return
                produce = wire.produce_request(frame, version)
                if produce is None:
                    return
                events = log._produce(*produce)
            elif api_key == wire.END_TXN:
                events = [log._end(*wire.end_txn_request(frame, version))]
            else:
                init = wire.init_producer_id_request(frame, version)
                if init is None:
                    return
                events = [log._init(*init)]
        except _UNREADABLE:
            log._unreadable(api_key, version)
            return
        if events:
            self.pending[correlation_id] = (api_key, version, events)

    def _idempotent(self, correlation_id: int, version: int, frame: bytes) -> bool:
        """Record a Produce request without a transactional id in the batch log (its batches
        with a producer id); False for a transactional one, left to the transaction log."""
        batches = self.batches
        assert batches is not None
        try:
            transactional_id, headers = wire.produce_batches(frame, version)
        except _UNREADABLE:
            batches._unreadable(wire.PRODUCE, version)
            return False
        if transactional_id is not None:
            return False
        stamped = [batch for batch in headers if batch.producer_id >= 0]
        if stamped:
            indexes = batches._produce(stamped)
            where = [(batch.topic, batch.partition) for batch in stamped]
            self.produced[correlation_id] = (version, list(zip(where, indexes, strict=True)))
        return True

    def _want_response(self, head: bytearray) -> bool:
        if self.produced and _SIZE.unpack_from(head, 4)[0] in self.produced:
            return True
        return bool(self.pending) and _SIZE.unpack_from(head, 4)[0] in self.pending

    def _batch_response(self, correlation_id: int, frame: bytes) -> bool:
        """Read an answer the batch log waits for (False: not one of those)."""
        batches = self.batches
        assert batches is not None
        produced = self.produced.pop(correlation_id, None)
        if produced is None:
            return False
        version, indexes = produced
        try:
            results = wire.produce_response(frame, version)
        except _UNREADABLE:
            batches._unreadable(wire.PRODUCE, version)
            batches._answer((index, None) for _, index in indexes)
            return True
        batches._answer((index, results.get(where)) for where, index in indexes)
        return True

    def _response(self, frame: bytes) -> None:
        (correlation_id,) = _SIZE.unpack_from(frame, 4)
        if self.batches is not None and self._batch_response(correlation_id, frame):
            return
        api_key, version, events = self.pending.pop(correlation_id)
        log = self.log
        answers: list[tuple[_Event, tuple[int, ...] | None]]
        try:
            if api_key == wire.PRODUCE:
                results = wire.produce_response(frame, version)
                answers = [
                    (event, results.get((event.batch.topic, event.batch.partition)))
                    for event in events
                    if isinstance(event, _ProduceEvent)
                ]
            elif api_key == wire.END_TXN:
                answers = [(events[0], (wire.end_txn_response(frame, version),))]
            else:
                answers = [(events[0], wire.init_producer_id_response(frame, version))]
        except _UNREADABLE:
            log._unreadable(api_key, version)
            answers = [(event, None) for event in events]
        log._answer(answers)

    def close(self) -> None:
        """The connection is gone: what is still unanswered never will be."""
        pending = [event for _, _, events in self.pending.values() for event in events]
        self.pending.clear()
        if pending:
            self.log._answer([(event, None) for event in pending])
        if self.batches is not None and self.produced:
            unanswered = [
                (index, None) for _, batches in self.produced.values() for _, index in batches
            ]
            self.produced.clear()
            self.batches._answer(unanswered)


class _ClientSide(asyncio.Protocol):
    """A client's connection to a recorder listener, and the broker connection made for it."""

    def __init__(self, recorder: Recorder, broker: int) -> None:
        self.recorder = recorder
        self.target = recorder.targets[broker]
        self.tap = _Tap(recorder.log, recorder.batches)
        self.client: asyncio.Transport | None = None
        self.broker: asyncio.Transport | None = None
        self.early: list[bytes] = []  # bytes that came before the broker connection was made
        self.client_done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.client = transport
        _set_nodelay(transport)
        self.recorder._connections.add(self)
        self.recorder._spawn(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_connection(lambda: _BrokerSide(self), *self.target)
        except OSError:
            self.tap.close()
            self._drop()
            return
        assert isinstance(transport, asyncio.Transport)
        self.broker = transport
        _set_nodelay(transport)
        for chunk in self.early:
            transport.write(chunk)
        self.early.clear()
        if self.client_done:
            self._half_close_broker()

    def data_received(self, data: bytes) -> None:
        self.tap.requests.feed(data)
        if self.broker is not None:
            self.broker.write(data)
        else:
            self.early.append(data)

    def eof_received(self) -> bool:
        self.client_done = True
        if self.broker is not None:
            self._half_close_broker()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.client = None
        self.client_done = True
        if self.broker is not None:
            self._half_close_broker()

    def _half_close_broker(self) -> None:
        broker = self.broker
        if broker is not None and not broker.is_closing() and broker.can_write_eof():
            broker.write_eof()  # its answers still come through the tap

    def pause_writing(self) -> None:
        if self.broker is not None:
            self.broker.pause_reading()

    def resume_writing(self) -> None:
        if self.broker is not None:
            self.broker.resume_reading()

    def _drop(self) -> None:
        self.recorder._connections.discard(self)
        if self.client is not None:
            self.client.close()

    def abort(self) -> None:
        for transport in (self.client, self.broker):
            if transport is not None:
                transport.abort()


class _BrokerSide(asyncio.Protocol):
    def __init__(self, connection: _ClientSide) -> None:
        self.connection = connection

    def data_received(self, data: bytes) -> None:
        connection = self.connection
        connection.tap.responses.feed(data)
        client = connection.client
        if client is not None and not client.is_closing():
            client.write(data)

    def eof_received(self) -> bool:
        return False  # close: the client's side closes once what it has queued is written

    def connection_lost(self, exc: Exception | None) -> None:
        connection = self.connection
        connection.tap.close()
        connection._drop()

    def pause_writing(self) -> None:
        if self.connection.client is not None:
            self.connection.client.pause_reading()

    def resume_writing(self) -> None:
        if self.connection.client is not None:
            self.connection.client.resume_reading()


class Recorder:
    """Listeners for ``targets`` (the mock brokers' own addresses, broker id order) on free
    loopback ports, forwarding to them and recording into ``log`` (and ``batches``)."""

    def __init__(
        self,
        targets: Sequence[tuple[str, int]],
        log: TransactionLog,
        host: str = "127.0.0.1",
        batches: BatchLog | None = None,
    ) -> None:
        self.targets = list(targets)
        self.log = log
        self.batches = batches
        self.host = host
        self._listeners = [_listening_socket(host) for _ in self.targets]
        self._down: set[int] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[_ClientSide] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    def port(self, index: int) -> int:
        """The port of the listener for ``targets[index]``."""
        port: int = self._listeners[index].getsockname()[1]
        return port

    def start(self) -> Recorder:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            for index in range(len(self._listeners)):
                self._watch(index)
            ready.set()
            try:
                loop.run_forever()
            finally:
                self._shutdown(loop)
                loop.close()

        self._thread = threading.Thread(target=run, name="kafka-cluster-recorder", daemon=True)
        self._thread.start()
        ready.wait()
        return self

    def stop(self) -> None:
        thread, loop = self._thread, self._loop
        self._thread = self._loop = None
        if thread is None or loop is None:
            for sock in self._listeners:
                sock.close()
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    def set_down(self, index: int) -> None:
        """Refuse new connections for ``targets[index]``, on the same port, until
        :meth:`set_up` (the broker, down, closes the open ones: so do their clients' sides)."""
        self._control(lambda: self._set_down(index))

    def set_up(self, index: int) -> None:
        self._control(lambda: self._set_up(index))

    @property
    def any_down(self) -> bool:
        """Whether a listener refuses connections (:meth:`set_down`) now."""
        return bool(self._down)

    # ------------------------------------------------------------------ the recorder's thread

    def _control(self, action: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None:
            return
        run_on_loop(loop, action, _CONTROL_TIMEOUT)

    def _set_down(self, index: int) -> None:
        assert self._loop is not None
        if index in self._down:
            return
        self._down.add(index)
        sock = self._listeners[index]
        self._loop.remove_reader(sock.fileno())
        _stop_listening(sock)
        # The open connections close as their broker closes its side: answers it sent before
        # going down still pass the tap.

    def _set_up(self, index: int) -> None:
        if index not in self._down:
            return
        self._down.discard(index)
        self._listeners[index].listen(128)
        self._watch(index)

    def _watch(self, index: int) -> None:
        assert self._loop is not None
        sock = self._listeners[index]
        self._loop.add_reader(sock.fileno(), self._accept, index)

    def _accept(self, index: int) -> None:
        assert self._loop is not None
        sock = self._listeners[index]
        for _ in range(64):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            conn.setblocking(False)
            self._spawn(self._loop.connect_accepted_socket(lambda: _ClientSide(self, index), conn))

    def _spawn(self, coroutine: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a connection that failed to open is not an error

    def _shutdown(self, loop: asyncio.AbstractEventLoop) -> None:
        for index, sock in enumerate(self._listeners):
            if index not in self._down:
                loop.remove_reader(sock.fileno())
            sock.close()
        for connection in list(self._connections):
            connection.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            loop.run_until_complete(asyncio.wait(list(self._tasks)))
        loop.run_until_complete(asyncio.sleep(0))


class RecordingKafkaCluster(KafkaCluster):
    """:class:`~producerkit.testing.kafka_cluster.KafkaCluster` reached through a
    :class:`Recorder` in front of each broker (advertised in its place: every connection a
    client makes, to each broker Metadata or FindCoordinator names, passes one), which records
    the transactional requests and their answers (:attr:`transactions`), and with
    ``record_batches`` every idempotent producer's Produce batch and its answer
    (:attr:`batches`: it copies and reads every Produce request, and keeps some 40 bytes a
    batch for the cluster's life).

    :meth:`read` with ``isolation_level="read_committed"`` serves what Apache Kafka would serve
    a ``read_committed`` consumer, worked out from the recorded traffic
    (:mod:`chaos.judges.kafka_transactions`), since the mock serves everything to every
    consumer. Measured on a 2-core machine, the recorders add about 80 us to a round trip (a
    blocking produce: 230 us against 150 us) and a sixth to a large nonblocking run.
    """

    def __init__(self, brokers: int = 3, *, record_batches: bool = False) -> None:
        super().__init__(brokers)
        #: The transactional requests the recorders saw, and their answers.
        self.transactions = TransactionLog()
        self._batches = BatchLog() if record_batches else None
        self._recorder: Recorder | None = None
        try:
            targets = []
            for address in self.mock_addresses:
                host, _, port = address.rpartition(":")
                targets.append((host, int(port)))
            self._recorder = recorder = Recorder(
                targets, self.transactions, batches=self._batches
            ).start()
            for index, broker in enumerate(self.broker_ids):
                self.advertise(broker, recorder.host, recorder.port(index))
        except BaseException:
            self.close()
            raise

    @property
    def batches(self) -> BatchLog:
        """Every idempotent producer's Produce batch, with its answer. A
        :class:`~producerkit.errors.ConfigurationError` on a cluster made without
        ``record_batches=True``."""
        if self._batches is None:
            raise ConfigurationError(
                "this cluster does not record batches (make it with record_batches=True)"
            )
        return self._batches

    def broker_down(self, broker: int) -> None:
        super().broker_down(broker)
        if self._recorder is not None:
            self._recorder.set_down(broker - 1)

    def broker_up(self, broker: int) -> None:
        super().broker_up(broker)
        if self._recorder is not None:
            self._recorder.set_up(broker - 1)

    def reset(self) -> None:
        super().reset()
        recorder = self._recorder
        if recorder is not None and recorder.any_down:
            for index in range(len(self.broker_ids)):
                recorder.set_up(index)

    def read(
        self,
        topic: str,
        timeout: float = 10.0,
        *,
        isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted",
    ) -> list[KafkaRecord]:
        """:meth:`KafkaCluster.read <producerkit.testing.kafka_cluster.KafkaCluster.read>`, the
        log as the mock stores it (``read_uncommitted``), or what Apache Kafka would serve a
        ``read_committed`` consumer: non-transactional records and those of committed
        transactions, none of an aborted, fenced or still open transaction; and, as Kafka's last
        stable offset does, nothing of a partition from the first offset of its first open
        transaction on (those are served once that transaction ends). A
        :class:`~chaos.judges.kafka_transactions.TransactionViewError` when the recorded
        traffic cannot tell."""
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ConfigurationError(
                "isolation_level is 'read_uncommitted' or 'read_committed', "
                f"not {isolation_level!r}"
            )
        deadline = time.monotonic() + timeout
        records = super().read(topic, timeout)
        if isolation_level == "read_uncommitted":
            return records
        # Answers to requests made before the read may still be on their way through the
        # recorder: let them pass (a moment at most), then ask the view.
        self.transactions.settle(max(0.0, min(deadline - time.monotonic(), 2.0)))
        view = self.transactions.view(topic)
        return [record for record in records if view.serves(record.partition, record.offset)]

    def close(self) -> None:
        """Stop the recorders, then the cluster (see ``KafkaCluster.close``)."""
        recorder, self._recorder = self._recorder, None
        if recorder is not None:
            recorder.stop()
        super().close()
