"""A user-space TCP proxy between a client and one broker, on loopback: it adds latency and
injects network faults.

This kernel has no netem, so the link is emulated here. Each chunk read from one side is
delivered to the other side at its arrival time plus half the round trip; chunks of a connection
keep their order, and nothing costs per byte (a chunk is one timer entry, however large), so the
proxy adds latency without throttling bandwidth unless asked to. It runs in its own thread with
its own event loop, so it does not load the event loop of the producer being measured::

    with FaultProxy.for_url(broker.url, rtt_ms=10) as proxy:
        async with pk.Producer(proxy.url, topic="t") as producer: ...
        proxy.set_rtt(0)            # change the added round trip while running
        proxy.stall(2.0)            # hold every byte both ways for 2 s, then deliver them all
        proxy.blackhole(2.0)        # discard every byte both ways for 2 s
        proxy.refuse(2.0)           # reset every connection and refuse new ones for 2 s
        proxy.slow(5.0, 100_000)    # at most 100,000 bytes/s each way for 5 s
        proxy.reset()               # reset every connection now
        proxy.clear()               # end every fault now, added latency included

The fault controls are safe to call from any thread (the proxy's own included). Each takes one
hop to the proxy thread, returns once the fault is in force, and a timer ends the fault
``seconds`` later:

- ``stall``: bytes are read and held, nothing is closed (reading a connection pauses once 4 MiB
  wait in one direction); when it ends, everything held is delivered, in order.
- ``blackhole``: every byte arriving from either side is discarded, never delivered; nothing is
  closed while it lasts. A TCP stream cannot carry on past missing bytes, so when it ends each
  connection that lost bytes is reset (its client sees a dead connection and opens another, as
  after a real outage long enough to give up on); a connection that lost none carries on.
- ``refuse``: every connection is reset and the listeners stop listening, so a new connection
  is refused (``ECONNREFUSED``) until it ends, on the same ports. Where a listening socket cannot
  be shut down (not Linux), a new connection is accepted and reset at once instead.
- ``slow``: each direction (toward the broker, toward the client) carries at most
  ``bytes_per_second`` over all connections together, in slices of 10 ms of that bandwidth.
- ``reset``: every open connection is reset now (RST, ``SO_LINGER`` 0); new ones are accepted.
- added latency: ``set_rtt(ms)``, for chunks arriving from then on, until changed.

How they combine: ``stall``, ``blackhole`` and ``refuse`` are states of the link, one at a time:
starting one (the same one again included) first ends the one in force as its timer would (a
stall's held bytes are delivered, a blackhole's connections that lost bytes are reset, refused
listeners listen again), then starts its own timer. ``slow`` stacks on them (held bytes are
delivered at its pace); a new ``slow`` replaces the previous one. Latency stacks on every fault.
``reset`` leaves the faults in force. ``pause()`` is a stall until ``resume()``; ``clear()`` ends
every fault and sets the added latency to 0.

What happened is observable: :attr:`FaultProxy.log` records every fault, latency included, as a
:class:`FaultWindow` with ``time.monotonic()`` stamps, ``proxy.log.active()`` names the faults in
force, and ``proxy.connections`` counts the open client connections.

Kafka clients connect to the broker addresses a Metadata response names, not to the bootstrap
address, so for ``kafka://`` the proxy reads the protocol's framing: it remembers each request's
API key and version by correlation id and rewrites the broker host/port in Metadata (API 3, v0-v12,
flexible versions included) and FindCoordinator (API 10, v0-v4) responses to point at itself,
opening one listener per broker of the cluster. Every connection then passes through the proxy.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import math
import socket
import struct
import threading
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Final, Self

import attrs

from producerkit._urls import parse_url
from producerkit.errors import ConfigurationError

__all__ = ["FaultLog", "FaultProxy", "FaultWindow"]

#: Pause reading a side once this many bytes wait to be written to the other.
_HIGH_WATER: Final = 4 * 1024 * 1024
#: A slow link sends slices of this many seconds of its bandwidth.
_PACE_QUANTUM: Final = 0.01
#: The longest a fault control waits for the proxy thread to apply it.
_CONTROL_TIMEOUT: Final = 10.0
_LINGER_ZERO: Final = struct.pack("ii", 1, 0)
_METADATA: Final = 3
_FIND_COORDINATOR: Final = 10

Chunk = bytes | memoryview


@attrs.frozen(slots=True)
class FaultWindow:
    """One fault: its ``mode`` (``stall``, ``blackhole``, ``refuse``, ``slow``, ``reset``,
    ``latency``, or a broker's ``kill``), when it started and ended (``time.monotonic()``;
    ``ended`` is None while it lasts and equals ``started`` for an instant one, ``reset``), and
    ``detail``, the arguments it was given."""

    mode: str
    started: float
    ended: float | None
    detail: str = ""


class FaultLog:
    """Every fault of a proxy in the order they started; safe to read and write from any
    thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: list[FaultWindow] = []
        self._open: dict[int, str] = {}

    def open(self, mode: str, detail: str = "") -> int:
        """Record a fault starting now; returns the number to give :meth:`close`."""
        with self._lock:
            self._windows.append(FaultWindow(mode, time.monotonic(), None, detail))
            number = len(self._windows) - 1
            self._open[number] = mode
            return number

    def close(self, number: int) -> None:
        """Record that the fault :meth:`open` numbered ``number`` ended now (once: a fault
        already ended keeps its end)."""
        with self._lock:
            if self._open.pop(number, None) is not None:
                ended = time.monotonic()
                self._windows[number] = attrs.evolve(self._windows[number], ended=ended)

    def instant(self, mode: str, detail: str = "") -> None:
        """Record a fault that starts and ends now."""
        with self._lock:
            now = time.monotonic()
            self._windows.append(FaultWindow(mode, now, now, detail))

    def windows(self) -> list[FaultWindow]:
        """A copy of every window so far, the ones still open included (``ended`` None)."""
        with self._lock:
            return list(self._windows)

    def active(self) -> tuple[str, ...]:
        """The modes of the faults in force now, in the order they started."""
        with self._lock:
            return tuple(self._open.values())


class FaultProxy:
    """Forwards TCP to one broker, adding ``rtt_ms / 2`` each way and the faults it is asked
    for. See the module docstring."""

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int,
        rtt_ms: float = 0.0,
        *,
        listen_host: str = "127.0.0.1",
    ) -> None:
        if scheme not in ("kafka", "nats", "jetstream"):
            raise ConfigurationError(f"FaultProxy proxies kafka, nats or jetstream, not {scheme!r}")
        self.scheme = scheme
        self.target = (host, port)
        self.listen_host = listen_host
        #: Every fault so far, with its time window.
        self.log = FaultLog()
        self._rtt_lock = threading.Lock()
        self._half_delay = 0.0
        self._latency_window: int | None = None
        self.set_rtt(rtt_ms)
        # The proxy thread's state: written and read only there.
        self._stalled = False
        self._blackholed = False
        self._refusing = False
        self._link: _Timed | None = None  # the stall, blackhole or refuse in force
        self._slow: _Timed | None = None
        self._paces: tuple[_Pace, _Pace] | None = None  # (toward the broker, the client)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listeners: dict[tuple[str, int], socket.socket] = {}
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._listen_port = self._listen_for(self.target)

    @classmethod
    def for_url(cls, url: str, rtt_ms: float = 0.0) -> FaultProxy:
        """A proxy for the one broker of a ``kafka://``, ``nats://`` or ``jetstream://`` URL."""
        parsed = parse_url(url)
        if len(parsed.servers) != 1:
            raise ConfigurationError(
                f"FaultProxy.for_url needs a URL with one broker, got {len(parsed.servers)}"
            )
        host, port = parsed.servers[0]
        return cls(parsed.scheme, host, port, rtt_ms)

    # ------------------------------------------------------------------ state (any thread)

    @property
    def url(self) -> str:
        """The URL to give clients: same scheme, pointing at the proxy."""
        return f"{self.scheme}://{self.host_port}"

    @property
    def host_port(self) -> str:
        """``host:port`` of the proxy's listener for the broker it was made for."""
        return f"{self.listen_host}:{self._listen_port}"

    @property
    def rtt_ms(self) -> float:
        return self._half_delay * 2000.0

    @property
    def connections(self) -> int:
        """Client connections open through the proxy now."""
        return len(self._connections)

    # ------------------------------------------------------------------ faults (any thread)

    def set_rtt(self, rtt_ms: float) -> None:
        """Change the added round trip; applies to chunks arriving from now on (0 allowed)."""
        if not 0 <= rtt_ms < math.inf:
            raise ConfigurationError(f"rtt_ms must be >= 0, got {rtt_ms!r}")
        with self._rtt_lock:
            self._half_delay = rtt_ms / 2000.0  # a float store: atomic, read by the proxy thread
            if self._latency_window is not None:
                self.log.close(self._latency_window)
                self._latency_window = None
            if rtt_ms > 0:
                self._latency_window = self.log.open("latency", f"rtt_ms={rtt_ms:g}")

    def stall(self, seconds: float) -> None:
        """Hold every byte both ways for ``seconds``, closing nothing; then deliver them."""
        duration = _duration(seconds)
        self._control(lambda: self._begin_link("stall", duration))

    def blackhole(self, seconds: float) -> None:
        """Discard every byte both ways for ``seconds``; then reset the connections that lost
        bytes."""
        duration = _duration(seconds)
        self._control(lambda: self._begin_link("blackhole", duration))

    def refuse(self, seconds: float) -> None:
        """Reset every connection now and refuse new ones for ``seconds``."""
        duration = _duration(seconds)
        self._control(lambda: self._begin_link("refuse", duration))

    def slow(self, seconds: float, bytes_per_second: float) -> None:
        """Carry at most ``bytes_per_second`` each way, over all connections, for ``seconds``."""
        duration = _duration(seconds)
        if not 0 < bytes_per_second < math.inf:
            raise ConfigurationError(
                f"bytes_per_second must be a positive number, got {bytes_per_second!r}"
            )
        self._control(lambda: self._begin_slow(duration, float(bytes_per_second)))

    def reset(self) -> None:
        """Reset every open connection now (RST); new connections are accepted."""
        self._control(self._reset)

    def pause(self) -> None:
        """Stall until :meth:`resume` (or another link fault, or :meth:`clear`)."""
        self._control(lambda: self._begin_link("stall", None))

    def resume(self) -> None:
        """End the stall in force, if any, delivering everything it held."""
        self._control(lambda: self._end_link("stall"))

    def clear(self) -> None:
        """End every fault now and set the added latency to 0."""
        self._control(self._end_all)
        self.set_rtt(0)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Start the proxy thread; returns once it accepts connections."""
        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                for sock in list(self._listeners.values()):
                    self._watch(sock)
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                self._shutdown()
                loop.close()

        self._thread = threading.Thread(target=run, name="producerkit-fault-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            self._loop = None
            raise failure[0]
        return self

    def stop(self) -> None:
        """Close every listener and connection and end the thread."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            for sock in self._listeners.values():
                sock.close()
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._thread = None
        self._loop = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        host, port = self.target
        faults = ",".join(self.log.active()) or "none"
        return f"<{type(self).__name__} {self.url} -> {host}:{port} faults={faults}>"

    # ------------------------------------------------------------------ faults (proxy thread)

    def _control(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the proxy thread and wait until it has."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("start() the proxy before injecting faults")
        if threading.current_thread() is self._thread:
            action()
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            try:
                action()
            except BaseException as exc:
                done.set_exception(exc)
            else:
                done.set_result(None)

        loop.call_soon_threadsafe(run)
        done.result(_CONTROL_TIMEOUT)

    def _timed(
        self, mode: str, seconds: float | None, end: Callable[[], None], detail: str
    ) -> _Timed:
        assert self._loop is not None
        timer = None if seconds is None else self._loop.call_later(seconds, end)
        return _Timed(mode, self.log.open(mode, detail), timer)

    def _begin_link(self, mode: str, seconds: float | None) -> None:
        self._end_link()
        if mode == "stall":
            self._stalled = True
        elif mode == "blackhole":
            self._blackholed = True
        else:
            self._stop_listening()
            self._abort_all()
        detail = "until resume()" if seconds is None else f"seconds={seconds:g}"
        self._link = self._timed(mode, seconds, self._end_link, detail)

    def _end_link(self, mode: str | None = None) -> None:
        """End the stall, blackhole or refuse in force (only if it is ``mode``, when given)."""
        link = self._link
        if link is None or (mode is not None and link.mode != mode):
            return
        self._link = None
        link.end(self.log)
        if link.mode == "stall":
            self._stalled = False
            self._kick_all()
        elif link.mode == "blackhole":
            self._blackholed = False
            for connection in list(self._connections):
                if connection.lost_bytes:
                    connection.abort()
        else:
            self._listen_again()

    def _begin_slow(self, seconds: float, bytes_per_second: float) -> None:
        self._end_slow()
        self._paces = (_Pace(bytes_per_second), _Pace(bytes_per_second))
        detail = f"seconds={seconds:g} bytes_per_second={bytes_per_second:g}"
        self._slow = self._timed("slow", seconds, self._end_slow, detail)

    def _end_slow(self) -> None:
        slow = self._slow
        if slow is None:
            return
        self._slow = None
        slow.end(self.log)
        self._paces = None
        self._kick_all()

    def _reset(self) -> None:
        self.log.instant("reset", f"connections={len(self._connections)}")
        self._abort_all()

    def _end_all(self) -> None:
        self._end_link()
        self._end_slow()

    def _abort_all(self) -> None:
        for connection in list(self._connections):
            connection.abort()

    def _kick_all(self) -> None:
        for connection in list(self._connections):
            connection.upstream.kick()
            connection.downstream.kick()

    # ------------------------------------------------------------------ listeners (proxy thread)

    def _listen_for(self, target: tuple[str, int]) -> int:
        """The port of the listener for ``target``, opened now if there is none (so its port is
        known at once). Called from the caller's thread for the bootstrap broker and from the
        proxy thread while rewriting Metadata for the others; the kernel queues connections
        until the proxy thread watches the listener."""
        sock = self._listeners.get(target)
        if sock is None:
            sock = _listening_socket(self.listen_host)
            self._listeners[target] = sock
            if self._loop is not None:
                self._watch(sock)
        port: int = sock.getsockname()[1]
        return port

    def _advertised(self, host: str, port: int) -> tuple[str, int]:
        if port == self.target[1] and _same_host(host, self.target[0]):
            return self.listen_host, self._listen_port
        return self.listen_host, self._listen_for((host, port))

    def _watch(self, sock: socket.socket) -> None:
        """Accept on ``sock`` from now on, or refuse on it while ``refuse`` lasts."""
        assert self._loop is not None
        target = next(key for key, value in self._listeners.items() if value is sock)
        if self._refusing and _stop_listening(sock):
            return
        self._loop.add_reader(sock.fileno(), self._accept, sock, target)

    def _accept(self, sock: socket.socket, target: tuple[str, int]) -> None:
        assert self._loop is not None
        for _ in range(64):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # the listener was shut down under us, or out of descriptors: next time
            if self._refusing:  # a listener that could not stop listening
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
                conn.close()
                continue
            conn.setblocking(False)
            self._spawn(self._loop.connect_accepted_socket(lambda: _Connection(self, target), conn))

    def _stop_listening(self) -> None:
        assert self._loop is not None
        self._refusing = True
        for sock in self._listeners.values():
            if _stop_listening(sock):
                self._loop.remove_reader(sock.fileno())

    def _listen_again(self) -> None:
        self._refusing = False
        for sock in self._listeners.values():
            sock.listen(128)
            self._watch(sock)

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a connection that failed to open is not an error

    def _shutdown(self) -> None:
        assert self._loop is not None
        for link in (self._link, self._slow):
            if link is not None:
                link.end(self.log)
        self._link = self._slow = None
        for sock in self._listeners.values():
            self._loop.remove_reader(sock.fileno())
            sock.close()
        for connection in list(self._connections):
            connection.abort(reset=False)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            self._loop.run_until_complete(asyncio.wait(list(self._tasks)))
        self._loop.run_until_complete(asyncio.sleep(0))  # let the aborts close their sockets


def _duration(seconds: float) -> float:
    if not 0 < seconds < math.inf:
        raise ConfigurationError(f"a fault lasts a positive number of seconds, got {seconds!r}")
    return float(seconds)


def _same_host(a: str, b: str) -> bool:
    loopback = ("127.0.0.1", "localhost", "::1")
    return a == b or (a in loopback and b in loopback)


def _listening_socket(host: str) -> socket.socket:
    """A listening socket on a free port of ``host``, bound to that port by number: on Linux a
    socket bound so keeps its port while shut down (``refuse``), and listens on it again."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Connections the broker closed leave TIME_WAIT sockets on this port; without it, listening
        # again after ``refuse`` fails with EADDRINUSE and the proxy refuses for good.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:  # taken between the probe and now: another
            sock.close()
            continue
        sock.listen(128)
        sock.setblocking(False)
        return sock
    raise OSError(f"no free port to listen on at {host}")


def _stop_listening(sock: socket.socket) -> bool:
    """Stop ``sock`` listening, its port kept: True on Linux, False where it cannot be."""
    try:
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        return False
    return True


class _Timed:
    """A fault in force: its log window and the timer that ends it (None: until ended)."""

    __slots__ = ("mode", "timer", "window")

    def __init__(self, mode: str, window: int, timer: asyncio.TimerHandle | None) -> None:
        self.mode = mode
        self.window = window
        self.timer = timer

    def end(self, log: FaultLog) -> None:
        if self.timer is not None:
            self.timer.cancel()
        log.close(self.window)


class _Pace:
    """One direction of a slow link: when its next byte may go."""

    __slots__ = ("next_free", "rate", "slice")

    def __init__(self, bytes_per_second: float) -> None:
        self.rate = bytes_per_second
        self.slice = max(1, int(bytes_per_second * _PACE_QUANTUM))
        self.next_free = 0.0

    def cut(self, chunk: Chunk, now: float) -> Chunk:
        """The piece of ``chunk`` the link carries now, its time booked."""
        piece = chunk[: self.slice]
        self.next_free = max(self.next_free, now) + len(piece) / self.rate
        return piece


class _Pipe:
    """One direction of one connection: chunks waiting for their delivery time, in order."""

    __slots__ = (
        "closing",
        "connection",
        "dest",
        "direction",
        "framer",
        "handle",
        "loop",
        "proxy",
        "queue",
        "queued",
        "source",
        "throttled",
    )

    def __init__(
        self,
        connection: _Connection,
        direction: int,
        loop: asyncio.AbstractEventLoop,
        framer: Callable[[bytes], list[bytes]] | None,
    ) -> None:
        self.connection = connection
        self.proxy = connection.proxy
        self.direction = direction  # 0: toward the broker, 1: toward the client
        self.loop = loop
        self.framer = framer
        self.queue: collections.deque[tuple[float, Chunk]] = collections.deque()
        self.queued = 0
        self.handle: asyncio.TimerHandle | None = None
        self.dest: asyncio.Transport | None = None
        self.source: asyncio.Transport | None = None
        self.closing = False
        self.throttled = False

    def push(self, data: bytes) -> None:
        if self.proxy._blackholed:
            self.connection.lost_bytes = True
            return
        due = self.loop.time() + self.proxy._half_delay
        chunks = [data] if self.framer is None else self.framer(data)
        for chunk in chunks:
            self.queue.append((due, chunk))
            self.queued += len(chunk)
        if self.queued > _HIGH_WATER and self.source is not None and not self.throttled:
            self.throttled = True  # the far side is slow (or stalled): push back on the sender
            self.source.pause_reading()
        if self.handle is None:
            self.deliver()

    def finish(self) -> None:
        """The source closed: close the destination once everything queued is delivered."""
        self.closing = True
        if self.handle is None:
            self.deliver()

    def kick(self) -> None:
        """Deliver now what is due: a fault that held chunks back ended."""
        if self.handle is not None:
            self.handle.cancel()
        self.deliver()

    def drop(self) -> None:
        """Forget every chunk queued."""
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.queue.clear()
        self.queued = 0

    def deliver(self) -> None:
        """Write every chunk that is due (on a slow link, as its bandwidth allows), then set a
        timer for the next."""
        self.handle = None
        proxy = self.proxy
        dest = self.dest
        if proxy._stalled or dest is None:
            return
        if dest.is_closing():
            self.drop()
            return
        now = self.loop.time()
        queue = self.queue
        pace = None if proxy._paces is None else proxy._paces[self.direction]
        wake = None
        while queue:
            due, chunk = queue[0]
            if due > now:
                wake = due
                break
            if pace is None:
                queue.popleft()
            else:
                if pace.next_free > now:
                    wake = pace.next_free
                    break
                piece = pace.cut(chunk, now)
                if len(piece) < len(chunk):
                    queue[0] = (due, memoryview(chunk)[len(piece) :])
                else:
                    queue.popleft()
                chunk = piece
            self.queued -= len(chunk)
            dest.write(chunk)
        if wake is not None:
            self.handle = self.loop.call_at(wake, self.deliver)
        elif self.closing:
            dest.close()
        if self.throttled and self.queued <= _HIGH_WATER // 2 and self.source is not None:
            self.throttled = False
            self.source.resume_reading()


class _Connection(asyncio.Protocol):
    """A client's connection to the proxy and the broker connection opened for it. It counts in
    ``proxy.connections`` until both sides are closed, or it is aborted."""

    def __init__(self, proxy: FaultProxy, target: tuple[str, int]) -> None:
        self.proxy = proxy
        self.target = target
        self.client: asyncio.Transport | None = None
        self.broker: asyncio.Transport | None = None
        self.connecting: asyncio.Task[None] | None = None
        self.open_sides = 0
        #: Bytes were discarded in a blackhole: the streams have a gap, the connection is dead.
        self.lost_bytes = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        loop = asyncio.get_running_loop()
        self.client = transport
        self.open_sides = 1
        requests: Callable[[bytes], list[bytes]] | None = None
        responses: Callable[[bytes], list[bytes]] | None = None
        if self.proxy.scheme == "kafka":
            versions: dict[int, tuple[int, int]] = {}
            requests = _KafkaFramer(lambda frame: _note_request(frame, versions))
            responses = _KafkaFramer(
                lambda frame: _rewrite_response(frame, versions, self.proxy._advertised)
            )
        self.upstream = _Pipe(self, 0, loop, requests)
        self.downstream = _Pipe(self, 1, loop, responses)
        self.upstream.source = transport
        self.downstream.dest = transport
        self.proxy._connections.add(self)
        _set_nodelay(transport)
        self.connecting = loop.create_task(self._connect(loop))

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            transport, _ = await loop.create_connection(lambda: _BrokerSide(self), *self.target)
        except OSError:
            if self.client is not None:
                self.client.close()
            return
        finally:
            self.connecting = None
        assert isinstance(transport, asyncio.Transport)
        if self not in self.proxy._connections:  # aborted while connecting
            transport.abort()
            return
        self.broker = transport
        self.open_sides += 1
        _set_nodelay(transport)
        self.downstream.source = transport
        self.upstream.dest = transport
        if self.upstream.handle is None:
            self.upstream.deliver()

    def data_received(self, data: bytes) -> None:
        self.upstream.push(data)

    def eof_received(self) -> bool:
        self.upstream.finish()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.upstream.finish()
        self.side_closed()

    def side_closed(self) -> None:
        self.open_sides -= 1
        if self.open_sides <= 0:
            self.proxy._connections.discard(self)

    def abort(self, reset: bool = True) -> None:
        """Close both sides now, dropping what is queued; with ``reset``, as an RST."""
        self.proxy._connections.discard(self)
        if self.connecting is not None:
            self.connecting.cancel()
        self.upstream.drop()
        self.downstream.drop()
        for transport in (self.client, self.broker):
            if transport is not None and not transport.is_closing():
                sock = transport.get_extra_info("socket")
                if reset and sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
                transport.abort()


class _BrokerSide(asyncio.Protocol):
    def __init__(self, connection: _Connection) -> None:
        self.connection = connection
        self.downstream = connection.downstream

    def data_received(self, data: bytes) -> None:
        self.downstream.push(data)

    def eof_received(self) -> bool:
        self.downstream.finish()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.downstream.finish()
        self.connection.side_closed()


def _set_nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# ---------------------------------------------------------------------- Kafka protocol


class _KafkaFramer:
    """Splits a Kafka byte stream into size-prefixed frames and passes each through ``handle``."""

    __slots__ = ("buffer", "handle")

    def __init__(self, handle: Callable[[bytes], bytes]) -> None:
        self.buffer = bytearray()
        self.handle = handle

    def __call__(self, data: bytes) -> list[bytes]:
        buffer = self.buffer
        buffer += data
        frames: list[bytes] = []
        start = 0
        while len(buffer) - start >= 4:
            (size,) = struct.unpack_from(">i", buffer, start)
            end = start + 4 + size
            if len(buffer) < end:
                break
            frames.append(self.handle(bytes(buffer[start:end])))
            start = end
        del buffer[:start]
        # Forward complete frames as one chunk: same bytes, one timer entry.
        return [b"".join(frames)] if frames else []


def _note_request(frame: bytes, versions: dict[int, tuple[int, int]]) -> bytes:
    if len(frame) >= 12:
        api_key, api_version, correlation_id = struct.unpack_from(">hhi", frame, 4)
        if api_key in (_METADATA, _FIND_COORDINATOR):
            versions[correlation_id] = (api_key, api_version)
    return frame


def _rewrite_response(
    frame: bytes,
    versions: dict[int, tuple[int, int]],
    advertised: Callable[[str, int], tuple[str, int]],
) -> bytes:
    if len(frame) < 8 or not versions:
        return frame
    (correlation_id,) = struct.unpack_from(">i", frame, 4)
    request = versions.pop(correlation_id, None)
    if request is None:
        return frame
    api_key, version = request
    try:
        if api_key == _METADATA:
            body = _rewrite_metadata(frame[8:], version, advertised)
        else:
            body = _rewrite_find_coordinator(frame[8:], version, advertised)
    except (struct.error, IndexError, UnicodeDecodeError, ValueError):
        return frame  # a version this parser does not know: pass it through unchanged
    payload = frame[4:8] + body
    return struct.pack(">i", len(payload)) + payload


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise ValueError("truncated")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def int16(self) -> int:
        value: int = struct.unpack(">h", self.take(2))[0]
        return value

    def int32(self) -> int:
        value: int = struct.unpack(">i", self.take(4))[0]
        return value

    def uvarint(self) -> int:
        result = shift = 0
        while True:
            byte = self.take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    def string(self, compact: bool) -> str | None:
        length = self.uvarint() - 1 if compact else self.int16()
        if length < 0:
            return None
        return self.take(length).decode("utf-8")

    def tagged_fields(self) -> bytes:
        """The raw bytes of a tagged-field section, to copy through unchanged."""
        start = self.pos
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())
        return self.data[start : self.pos]

    def rest(self) -> bytes:
        return self.data[self.pos :]


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _string(text: str | None, compact: bool) -> bytes:
    if text is None:
        return _uvarint(0) if compact else struct.pack(">h", -1)
    raw = text.encode("utf-8")
    return (_uvarint(len(raw) + 1) if compact else struct.pack(">h", len(raw))) + raw


def _rewrite_metadata(
    body: bytes, version: int, advertised: Callable[[str, int], tuple[str, int]]
) -> bytes:
    flexible = version >= 9
    reader = _Reader(body)
    out = bytearray()
    if flexible:
        out += reader.tagged_fields()  # response header v1
    if version >= 3:
        out += reader.take(4)  # throttle_time_ms
    count = reader.uvarint() - 1 if flexible else reader.int32()
    out += _uvarint(count + 1) if flexible else struct.pack(">i", count)
    for _ in range(max(count, 0)):
        node_id = reader.take(4)
        host = reader.string(flexible)
        port = reader.int32()
        new_host, new_port = advertised(host or "", port)
        out += node_id + _string(new_host, flexible) + struct.pack(">i", new_port)
        if version >= 1:
            out += _string(reader.string(flexible), flexible)  # rack
        if flexible:
            out += reader.tagged_fields()
    return bytes(out) + reader.rest()


def _rewrite_find_coordinator(
    body: bytes, version: int, advertised: Callable[[str, int], tuple[str, int]]
) -> bytes:
    flexible = version >= 3
    reader = _Reader(body)
    out = bytearray()
    if flexible:
        out += reader.tagged_fields()

    def node() -> None:
        out.extend(reader.take(4))  # node_id
        host = reader.string(flexible)
        port = reader.int32()
        new_host, new_port = advertised(host or "", port)
        out.extend(_string(new_host, flexible) + struct.pack(">i", new_port))

    if version >= 1:
        out += reader.take(4)  # throttle_time_ms
    if version >= 4:
        count = reader.uvarint() - 1
        out += _uvarint(count + 1)
        for _ in range(max(count, 0)):
            out += _string(reader.string(True), True)  # key
            node()
            out += reader.take(2)  # error_code
            out += _string(reader.string(True), True)  # error_message
            out += reader.tagged_fields()
        return bytes(out) + reader.rest()
    out += reader.take(2)  # error_code
    if version >= 1:
        out += _string(reader.string(flexible), flexible)  # error_message
    node()
    return bytes(out) + reader.rest()
