"""Every bench in benches/ runs here with a tiny workload, so that a broken import, a renamed
option or a removed helper fails the suite, not the next measurement (issue 40: three benches
had failed at import unseen).

Each run is the bench as its docstring gives it, ``python benches/NAME.py ...`` (a bench that is
a package, ``python benches/NAME ...``: its ``__main__.py``), in a fresh
interpreter whose working directory is the test's temp dir (for what it writes), with a few
hundred or thousand messages, against the session brokers (``--kafka-url``/``--nats-url``, see
``benches/_brokers.py``) or ``null://``; the runs on Apache Kafka (``--kafka-broker apache``) on
the session's node (the plugin's ``apache_kafka``, asked for only by those runs), its JVM's pid
given, so that its CPU is read as a node the bench started. ``chaos`` starts its own Tansu
(or, for ``kafka-cluster``, its own mock cluster, in-process): its faults run through a proxy
in front of a broker it owns (and may kill). The pytest-benchmark files run under pytest
with ``--benchmark-disable`` (each case once). A bench that needs what this install lacks (a
peer client, pyspark, Java) is skipped, naming it.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from producerkit.testing.brokers import create_kafka_topic
from producerkit.testing.pytest_plugin import SessionBroker

REPO = Path(__file__).resolve().parents[1]
BENCHES = REPO / "benches"

#: Every bench's tiny runs: the arguments after ``python benches/NAME`` (or after ``python``
#: for the pytest-benchmark files), ``{kafka}``, ``{nats}``, ``{tmp}`` and ``{repo}`` filled in.
#: A bench added to benches/ without an entry here fails test_every_bench_has_a_tiny_run.
BROKERS = ["--kafka-url", "{kafka}", "--nats-url", "{nats}"]
KAFKA = ["--kafka-url", "{kafka}"]
#: The session's Apache Kafka node as the bench's broker: its CPU measured, a short warm-up.
APACHE = ["--kafka-broker", "apache", "--kafka-url", "{apache}", "--kafka-pid", "{apache_pid}"]
APACHE += ["--warmup", "0.2"]
PYTEST = ["-m", "pytest", "--benchmark-disable", "-q", "-n", "0"]
PYTEST += ["-p", "no:cacheprovider", "-p", "no:randomly"]  # the file order, no cache
TINY: dict[str, dict[str, list[str]]] = {
    "allocations.py": {
        "": ["--messages", "2000", "--growth-messages", "2000", "--json", "{tmp}/a.json"],
    },
    "bench_partitioners.py": {
        "script": ["--keys", "2000", "--repeats", "1", "--json", "{tmp}/p.json"],
        "pytest": [*PYTEST, "{repo}/benches/bench_partitioners.py"],
    },
    "bench_spark.py": {
        "": [
            *["--rows", "200", "--repeat", "1", "--masters", "local[1]", "--partitions", "1"],
            *["--topic-partitions", "2", "--limit", "100", *KAFKA],
            *["--spark-conf", "spark.sql.shuffle.partitions=2"],
        ],
        # Spark's own Kafka sink (its jars from Maven the first time) beside producerkit's
        "sinks": [
            *["--compare", "sinks", "--rows", "2000", "--repeat", "1", "--partitions", "2"],
            *["--topic-partitions", "2", "--no-verify", *APACHE],
        ],
    },
    "chaos": {
        "kafka": [
            *["--minutes", "0.01", "--backend", "kafka", "--rate", "300", "--timeout", "1"],
            *["--keys", "20", "--partitions", "2", "--json", "{tmp}/c.json"],
            *["--plot", "{tmp}/c.png"],
        ],
        "kafka-cluster": [
            *["--minutes", "0.01", "--backend", "kafka-cluster", "--rate", "300"],
            *["--timeout", "1", "--keys", "20", "--partitions", "2", "--json", "{tmp}/c.json"],
            *["--plot", "{tmp}/c.png"],
        ],
    },
    "cpu_per_message.py": {
        "": ["--messages", "500", "--repeat", "1", "--no-java", *KAFKA],
        "apache": ["--messages", "500", "--repeat", "1", "--no-java", *APACHE],
    },
    "fused_path.py": {"": ["--messages", "500", "--rounds", "1", *KAFKA]},
    "latency_at_rates.py": {
        "": [
            *["--seconds", "0.2", "--warmup", "50", "--rtt-ms", "1"],
            *["--out-dir", "{tmp}", *BROKERS],
        ],
    },
    "observability.py": {
        "": [
            *["--messages", "500", "--kafka-messages", "500", "--jetstream-messages", "200"],
            *["--repeat", "1", "--calls", "200", *BROKERS],
        ],
    },
    "revisions.py": {
        "": [
            *["--before", "{repo}", "--after", "{repo}", "--rounds", "1"],
            *["--messages", "300", *BROKERS],
        ],
    },
    "rtt_sweep.py": {
        "": [
            *["--rtts", "0,2", "--limits", "10", "--resume-ats", "0.5", "--seconds", "0.02"],
            *["--kafka-settings", "none;preset=throughput", "--baseline-messages", "100"],
            *["--json", "{tmp}/r.json", "--markdown", "{tmp}/r.md", *BROKERS],
        ],
    },
    "scaling.py": {
        "": [
            *["--rtt-ms", "1", "--seconds", "0.05", "--keys", "16", "--producers", "2"],
            *["--json", "{tmp}/s.json", "--markdown", "{tmp}/s.md", *BROKERS],
        ],
    },
    "soak.py": {
        "": [
            *["--null", "3000", "--real", "1000", "--limit", "100"],
            *["--json", "{tmp}/soak.json", *BROKERS],
        ],
    },
    "sync_throughput.py": {"": ["--messages", "500", "--repeat", "1", *KAFKA]},
    "test_bench_hotpaths.py": {"": [*PYTEST, "{repo}/benches/test_bench_hotpaths.py"]},
    "throughput.py": {
        "null,kafka,jetstream": ["--messages", "300", "--repeat", "1", *BROKERS],
        "defaults,memory": [
            *["--only", "defaults", "--only", "memory", "--windows", "100"],
            *["--messages", "300", "--repeat", "1", *KAFKA],
        ],
        "production": ["--only", "production", "--messages", "300", "--repeat", "1", *BROKERS],
        "compression": [
            *["--only", "compression", "--distinct-values", "10"],
            *["--messages", "300", "--repeat", "1", *KAFKA],
        ],
        "batch": ["--only", "batch", "--messages", "300", "--repeat", "1", *KAFKA],
        # The Python 3.13 fast publishers run where PRODUCERKIT_PEERS_PYTHON names a 3.13 venv
        # with them; else the suite skips them (and any peer not installed), saying why.
        "peers": ["--only", "peers", "--messages", "300", "--repeat", "1", "--no-java", *BROKERS],
        # One JVM (started, warmed up, timed: 5-15 s), javac the first time.
        "peers-java": [
            *["--only", "peers", "--messages", "300", "--repeat", "1", *BROKERS],
            *["--peer", "kafka: Java producer, throughput settings"],
        ],
        "peers on apache": [
            *["--only", "peers", "--messages", "300", "--repeat", "1", "--nats-url", "{nats}"],
            *["--peer", "kafka: producerkit produce(), defaults"],
            *["--peer", "kafka: confluent-kafka produce()", *APACHE],
        ],
        "jetstream-cluster": [
            *["--only", "jetstream-cluster", "--messages", "300", "--repeat", "1"],
            *["--nats-url", "{nats}", "--json", "{tmp}/t.json"],
        ],
    },
}

#: What a bench needs beyond producerkit's own dependencies and the brokers' wheels (which the
#: session fixtures check): modules, and commands (``COMMANDS``). A key ``bench[run]`` is one
#: run's.
NEEDS: dict[str, tuple[str, ...]] = {
    "bench_partitioners.py": ("pytest_benchmark",),
    "bench_spark.py": ("pyspark", "pyarrow", "psutil", "confluent_kafka", "java"),
    "bench_spark.py[sinks]": ("pyspark", "pyarrow", "psutil", "confluent_kafka", "java", "mvn"),
    "chaos": ("numpy", "matplotlib", "psutil"),
    "cpu_per_message.py": ("confluent_kafka",),
    "cpu_per_message.py[apache]": ("confluent_kafka", "psutil", "java"),
    "latency_at_rates.py": ("matplotlib",),
    "observability.py": ("opentelemetry.sdk",),
    "sync_throughput.py": ("confluent_kafka",),
    "test_bench_hotpaths.py": ("pytest_benchmark",),
    "throughput.py": ("confluent_kafka",),
    "throughput.py[batch]": ("confluent_kafka", "pyarrow"),  # its Arrow chunks
    "throughput.py[peers on apache]": ("confluent_kafka", "psutil", "java"),
    "throughput.py[peers-java]": ("java", "javac", "mvn"),
    "throughput.py[jetstream-cluster]": ("psutil",),  # the one server's CPU
}

#: The needs of ``NEEDS`` that are commands on the PATH, not modules: the JVM, and the JDK's
#: compiler and Maven that build the Java producer's runner (benches/_java.py).
COMMANDS = ("java", "javac", "mvn")

#: Most seconds one tiny run may take (Spark's JVM start is most of bench_spark.py's ~20 s).
TIMEOUT = 180


def test_every_bench_has_a_tiny_run() -> None:
    """Each script in benches/ (its helper modules, ``_*.py``, apart) and each package with a
    ``__main__.py`` is run below."""
    scripts = {path.name for path in BENCHES.glob("*.py") if not path.name.startswith("_")}
    scripts |= {path.parent.name for path in BENCHES.glob("*/__main__.py")}
    assert scripts == set(TINY)


def _missing(needs: tuple[str, ...]) -> str | None:
    for need in needs:
        found = shutil.which(need) if need in COMMANDS else _importable(need)
        if not found:
            return need
    return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


@pytest.mark.parametrize(
    ("bench", "run"),
    [
        pytest.param(bench, run, id=f"{bench}[{run}]" if run else bench)
        for bench, runs in TINY.items()
        for run in runs
    ],
)
def test_bench_runs_with_a_tiny_workload(
    bench: str,
    run: str,
    kafka_broker: SessionBroker,
    nats_broker: SessionBroker,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    missing = _missing(NEEDS.get(f"{bench}[{run}]", NEEDS.get(bench, ())))
    if missing is not None:
        pytest.skip(f"benches/{bench} needs {missing}, which this environment lacks")
    fill = {
        "kafka": kafka_broker.url,
        "nats": f"nats://{nats_broker.host_port}",
        "tmp": str(tmp_path),
        "repo": str(REPO),
    }
    if "{apache}" in TINY[bench][run]:  # the session's node, started only for these runs
        apache = request.getfixturevalue("apache_kafka")
        fill.update(apache=apache.url, apache_pid=str(apache.nodes[0].process.pid))
    argv = [arg.format(**fill) for arg in TINY[bench][run]]
    if argv[:2] != ["-m", "pytest"]:
        argv.insert(0, str(BENCHES / bench))
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, (
        f"benches/{bench} {' '.join(argv)} exited {done.returncode}:\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )


#: The open-loop peers of ``producerkit bench --compare peers`` added with issue 41, and the URL
#: scheme of each.
NEW_PEERS = {
    "confluent-kafka-aio": "kafka",
    "kafka-python": "kafka",
    "nats-jetstream-extra": "jetstream",
    "natsio-jetstream-batch": "jetstream",
}


@pytest.mark.anyio
@pytest.mark.parametrize("peer", NEW_PEERS)
async def test_new_peer_runs_open_loop(
    peer: str, kafka_broker: SessionBroker, nats_broker: SessionBroker
) -> None:
    """Each new peer, 300 keyed 512-byte messages as fast as it goes, every one acked; a peer
    whose client is not installed here (the fast publishers need Python 3.13) is skipped."""
    from producerkit.bench.peers import missing_peers, run_peer

    url = kafka_broker.url if NEW_PEERS[peer] == "kafka" else f"jetstream://{nats_broker.host_port}"
    why = missing_peers(url).get(peer)
    if why is not None:
        pytest.skip(f"peer {peer}: {why}")
    topic = f"peer-{peer}-{time.monotonic_ns()}"
    if NEW_PEERS[peer] == "kafka":
        await create_kafka_topic(url, topic, 2)
    messages = [(b"user-%d" % i, b"x" * 512) for i in range(50)]
    timings = await run_peer(peer, url, topic, messages, rate=0, count=300, warmup=10)
    assert timings.sent == 300
    assert bytes(timings.status[:300]) == bytes([1]) * 300  # every message acked


def test_throughput_refuses_two_tables_in_one_run() -> None:
    """Each of ``--only batch``, ``peers``, ``defaults``/``memory``, ... runs a table of its
    own and returns: asked together with another, the run is refused, naming them, rather than
    running the first and leaving the rest out without a word."""
    for only in (["batch", "defaults"], ["null", "peers"]):
        done = subprocess.run(
            [sys.executable, str(REPO / "benches" / "throughput.py")]
            + [arg for name in only for arg in ("--only", name)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert all(name in done.stderr for name in only) and "runs alone" in done.stderr
