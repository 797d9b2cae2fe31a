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
import math
import socket
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Final, Self

from producerkit._urls import parse_url
from producerkit.errors import ConfigurationError
from producerkit.testing._connection import _Connection
from producerkit.testing._fault_log import FaultLog, FaultWindow, _Timed
from producerkit.testing._kafka_rewrite import _Reader as _Reader  # re-exported for tests
from producerkit.testing._kafka_rewrite import (
    _rewrite_response as _rewrite_response,  # re-exported for tests and benches
)
from producerkit.testing._loop_thread import run_on_loop
from producerkit.testing._pipe import _Pace
from producerkit.testing._sockets import (
    _LINGER_ZERO,
    _listening_socket,
    _same_host,
    _stop_listening,
)

__all__ = ["FaultLog", "FaultProxy", "FaultWindow"]

#: The longest a fault control waits for the proxy thread to apply it.
_CONTROL_TIMEOUT: Final = 10.0


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

    def forward(self, host: str, port: int) -> str:
        """Listen for another broker too (``host:port``), behind the same faults and latency as
        the first: the ``host:port`` to give clients for it. For a cluster whose clients are
        given every member (a NATS cluster; Kafka's other brokers are found from Metadata)."""
        result: list[int] = []
        if self._loop is None:
            result.append(self._listen_for((host, port)))
        else:
            self._control(lambda: result.append(self._listen_for((host, port))))
        return f"{self.listen_host}:{result[0]}"

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
        run_on_loop(loop, action, _CONTROL_TIMEOUT)

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
