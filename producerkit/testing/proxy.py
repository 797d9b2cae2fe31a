"""A user-space TCP delay proxy: a WAN between a client and one broker, on loopback.

This kernel has no netem, so the link delay is emulated here. Each chunk read from one side is
delivered to the other side at its arrival time plus half the round trip; chunks of a connection
keep their order, and nothing costs per byte (a chunk is one timer entry, however large), so the
proxy adds latency without throttling bandwidth. It runs in its own thread with its own event loop,
so it does not load the event loop of the producer being measured::

    with DelayProxy.for_url(broker.url, rtt_ms=10) as proxy:
        async with pk.Producer(proxy.url, topic="t") as producer: ...
        proxy.set_rtt(0)      # change the delay while running
        proxy.pause()         # a stalled broker: hold everything, close nothing
        proxy.resume()

Kafka clients connect to the broker addresses a Metadata response names, not to the bootstrap
address, so for ``kafka://`` the proxy reads the protocol's framing: it remembers each request's
API key and version by correlation id and rewrites the broker host/port in Metadata (API 3, v0-v12,
flexible versions included) and FindCoordinator (API 10, v0-v4) responses to point at itself,
opening one listener per broker of the cluster.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Final

from producerkit._urls import parse_url
from producerkit.errors import ConfigurationError

__all__ = ["DelayProxy"]

#: Pause reading a side once this many bytes wait to be written to the other.
_HIGH_WATER: Final = 4 * 1024 * 1024
_METADATA: Final = 3
_FIND_COORDINATOR: Final = 10


class DelayProxy:
    """Forwards TCP to one broker, adding ``rtt_ms / 2`` each way. See the module docstring."""

    def __init__(
        self, scheme: str, host: str, port: int, rtt_ms: float, *, listen_host: str = "127.0.0.1"
    ) -> None:
        if scheme not in ("kafka", "nats", "jetstream"):
            raise ConfigurationError(f"DelayProxy proxies kafka, nats or jetstream, not {scheme!r}")
        self.scheme = scheme
        self.target = (host, port)
        self.listen_host = listen_host
        self._half_delay = 0.0
        self.set_rtt(rtt_ms)
        self._paused = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self._sockets: dict[tuple[str, int], socket.socket] = {}
        self._pipes: set[_Pipe] = set()
        self._transports: set[asyncio.Transport] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._listen_port = self._listen_for(self.target)

    @classmethod
    def for_url(cls, url: str, rtt_ms: float) -> DelayProxy:
        """A proxy for the one broker of a ``kafka://``, ``nats://`` or ``jetstream://`` URL."""
        parsed = parse_url(url)
        if len(parsed.servers) != 1:
            raise ConfigurationError(
                f"DelayProxy.for_url needs a URL with one broker, got {len(parsed.servers)}"
            )
        host, port = parsed.servers[0]
        return cls(parsed.scheme, host, port, rtt_ms)

    # ------------------------------------------------------------------ control (any thread)

    @property
    def url(self) -> str:
        """The URL to give clients: same scheme, pointing at the proxy."""
        return f"{self.scheme}://{self.listen_host}:{self._listen_port}"

    @property
    def rtt_ms(self) -> float:
        return self._half_delay * 2000.0

    def set_rtt(self, rtt_ms: float) -> None:
        """Change the added round trip; applies to chunks arriving from now on (0 allowed)."""
        if not rtt_ms >= 0:
            raise ConfigurationError(f"rtt_ms must be >= 0, got {rtt_ms!r}")
        self._half_delay = rtt_ms / 2000.0  # a float store: atomic, read by the proxy thread

    def pause(self) -> None:
        """Stop forwarding (in both directions) without closing any socket."""
        self._paused = True

    def resume(self) -> None:
        """Forward again, starting with everything held while paused."""
        self._paused = False
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(self._kick_all)

    def start(self) -> DelayProxy:
        """Start the proxy thread; returns once it accepts connections."""
        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                for address, sock in list(self._sockets.items()):
                    loop.run_until_complete(self._serve(address, sock))
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._shutdown())
                loop.close()

        self._thread = threading.Thread(target=run, name="producerkit-delay-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self) -> None:
        """Close every listener and connection and end the thread."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            for sock in self._sockets.values():
                sock.close()
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._thread = None
        self._loop = None

    def __enter__(self) -> DelayProxy:
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
        return f"<DelayProxy {self.url} -> {host}:{port} rtt={self.rtt_ms:g}ms>"

    # ------------------------------------------------------------------ listeners (proxy thread)

    def _listen_for(self, target: tuple[str, int]) -> int:
        """A listening socket for ``target`` (bound now, so its port is known at once). Called
        from the caller's thread for the bootstrap broker and from the proxy thread while
        rewriting Metadata for the others; the kernel queues connections until it is served."""
        sock = self._sockets.get(target)
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.listen_host, 0))
            sock.listen(128)
            sock.setblocking(False)
            self._sockets[target] = sock
            loop = self._loop
            if loop is not None:
                task = loop.create_task(self._serve(target, sock))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        port: int = sock.getsockname()[1]
        return port

    def _advertised(self, host: str, port: int) -> tuple[str, int]:
        if port == self.target[1] and _same_host(host, self.target[0]):
            return self.listen_host, self._listen_port
        return self.listen_host, self._listen_for((host, port))

    async def _serve(self, target: tuple[str, int], sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _ClientSide(self, target), sock=sock)
        self._servers.append(server)

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        for transport in list(self._transports):
            transport.abort()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        for sock in self._sockets.values():
            sock.close()
        self._pipes.clear()

    def _kick_all(self) -> None:
        for pipe in list(self._pipes):
            pipe.deliver()


def _same_host(a: str, b: str) -> bool:
    loopback = ("127.0.0.1", "localhost", "::1")
    return a == b or (a in loopback and b in loopback)


class _Pipe:
    """One direction of one connection: chunks waiting for their delivery time, in order."""

    __slots__ = (
        "closing",
        "dest",
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
        proxy: DelayProxy,
        loop: asyncio.AbstractEventLoop,
        framer: Callable[[bytes], list[bytes]] | None,
    ) -> None:
        self.proxy = proxy
        self.loop = loop
        self.framer = framer
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.queued = 0
        self.handle: asyncio.TimerHandle | None = None
        self.dest: asyncio.Transport | None = None
        self.source: asyncio.Transport | None = None
        self.closing = False
        self.throttled = False

    def push(self, data: bytes) -> None:
        due = self.loop.time() + self.proxy._half_delay
        chunks = [data] if self.framer is None else self.framer(data)
        for chunk in chunks:
            self.queue.append((due, chunk))
            self.queued += len(chunk)
        if self.queued > _HIGH_WATER and self.source is not None and not self.throttled:
            self.throttled = True  # the far side is slow (or paused): push back on the sender
            self.source.pause_reading()
        if self.handle is None:
            self.deliver()

    def finish(self) -> None:
        """The source closed: close the destination once everything queued is delivered."""
        self.closing = True
        if self.handle is None:
            self.deliver()

    def deliver(self) -> None:
        self.handle = None
        if self.proxy._paused or self.dest is None:
            return
        if self.dest.is_closing():
            self.queue.clear()
            self.queued = 0
            self.proxy._pipes.discard(self)
            return
        now = self.loop.time()
        queue = self.queue
        while queue and queue[0][0] <= now:
            _, chunk = queue.popleft()
            self.queued -= len(chunk)
            self.dest.write(chunk)
        if queue:
            self.handle = self.loop.call_at(queue[0][0], self.deliver)
        elif self.closing:
            self.dest.close()
            self.proxy._pipes.discard(self)
        if self.throttled and self.queued <= _HIGH_WATER // 2 and self.source is not None:
            self.throttled = False
            self.source.resume_reading()


class _ClientSide(asyncio.Protocol):
    """The client's connection to the proxy; opens the broker connection behind it."""

    def __init__(self, proxy: DelayProxy, target: tuple[str, int]) -> None:
        self.proxy = proxy
        self.target = target

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        loop = asyncio.get_running_loop()
        self.transport = transport
        self.proxy._transports.add(transport)
        requests: Callable[[bytes], list[bytes]] | None = None
        responses: Callable[[bytes], list[bytes]] | None = None
        if self.proxy.scheme == "kafka":
            versions: dict[int, tuple[int, int]] = {}
            requests = _KafkaFramer(lambda frame: _note_request(frame, versions))
            responses = _KafkaFramer(
                lambda frame: _rewrite_response(frame, versions, self.proxy._advertised)
            )
        self.upstream = _Pipe(self.proxy, loop, requests)
        self.downstream = _Pipe(self.proxy, loop, responses)
        self.upstream.source = transport
        self.downstream.dest = transport
        self.proxy._pipes.update((self.upstream, self.downstream))
        _set_nodelay(transport)
        self.connecting = loop.create_task(self._connect(loop))

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            transport, _ = await loop.create_connection(
                lambda: _BrokerSide(self.downstream), *self.target
            )
        except OSError:
            self.transport.close()
            return
        assert isinstance(transport, asyncio.Transport)
        self.proxy._transports.add(transport)
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
        self.proxy._transports.discard(self.transport)
        self.upstream.finish()


class _BrokerSide(asyncio.Protocol):
    def __init__(self, downstream: _Pipe) -> None:
        self.downstream = downstream

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.downstream.push(data)

    def eof_received(self) -> bool:
        self.downstream.finish()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.downstream.proxy._transports.discard(self.transport)
        self.downstream.finish()


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
