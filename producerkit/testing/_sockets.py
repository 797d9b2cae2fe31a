"""The socket work of the fault proxy: its listening sockets (bound to a port they keep while
``refuse`` shuts them down), resets (``SO_LINGER`` 0), ``TCP_NODELAY``, and which addresses name
the same host."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Final

#: ``SO_LINGER`` on, 0 seconds: closing the socket resets the connection (RST).
_LINGER_ZERO: Final = struct.pack("ii", 1, 0)


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


def _set_nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
