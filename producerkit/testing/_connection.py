"""A client's connection through the fault proxy: the client side the proxy accepted, the broker
connection it opens for it, and a ``_Pipe`` each way between them (for Kafka, through the
framers that rewrite broker addresses)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from producerkit.testing._kafka_rewrite import _KafkaFramer, _note_request, _rewrite_response
from producerkit.testing._pipe import _Pipe
from producerkit.testing._sockets import _LINGER_ZERO, _set_nodelay

if TYPE_CHECKING:
    from producerkit.testing.proxy import FaultProxy


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
