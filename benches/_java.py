"""The Java producer (``org.apache.kafka:kafka-clients``) as a peer of the Kafka benches:
``benches/java/ProducerRunner.java``, compiled at bench time and run in a JVM of its own.

The runner is compiled by ``javac`` against the jars an Apache Kafka node runs from
(:func:`producerkit.testing.apache_kafka.resolve_jars`: Maven fetches them once into
``~/.cache/producerkit/apache-kafka-<version>/``; kafka-clients, its codecs and slf4j-simple
are among them), and its classes are kept beside them in a directory named after the source's
hash: an edited runner is compiled again, an unchanged one once.

:func:`java_producer` runs it: the JVM starts, sends passes of as many messages as the timed
pass to warm up, until its JIT has settled (or ``warm_up_seconds`` ran out), then the timed
pass, and reports that pass's wall and CPU seconds (its whole process, every thread: the sending
one, the I/O thread, GC, JIT) itself, and how much of that CPU its JIT compiler threads took
(``jit_cpu`` beside the figures in ``Clock.last``: on a busy machine C2 may still be compiling
after a minute). The broker's CPU is read here, between the runner's mark that the timed pass
starts and its report. Neither the JVM's start nor the warm-up counts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from _peers import Clock

#: The kafka-clients release the runner is built with: the Apache Kafka the benches run.
KAFKA_CLIENTS_VERSION = "4.4.0"
SOURCE = Path(__file__).with_name("java") / "ProducerRunner.java"
_MAIN_CLASS = SOURCE.stem
#: The line the runner prints as its timed pass starts.
_TIMED = b"timed\n"
_INSTALL_JDK = "a JDK 17+ (apt-get install openjdk-17-jdk-headless maven)"
#: Set in every run, on either broker. kafka-clients 4.4 sends ApiVersions v5 naming the cluster
#: and node it expects (KIP-1242: a misrouted connection detected) on each connection after
#: the first; Tansu 0.6.0 fails to decode that request and drops the connection, and the
#: producer retries forever. The check is one request per connection: nothing per message.
_CONNECTION_SETTINGS = {"metadata.cluster.check.enable": "false"}


def missing() -> str | None:
    """Why the Java producer cannot run here (no JDK, no Maven to fetch the jars the first
    time, Maven failing), or None: it is built, ready to run."""
    from producerkit.errors import MissingDependencyError

    try:
        runner_command()
    except MissingDependencyError as exc:
        return str(exc).splitlines()[0]
    return None


def runner_command() -> list[str]:
    """``java -cp ... ProducerRunner``, the runner compiled first if it is not yet.

    Raises :class:`~producerkit.errors.MissingDependencyError` without ``java``, ``javac`` or
    (before the jars are cached) ``mvn``, or when Maven fails; :class:`RuntimeError` with
    javac's output when the source does not compile."""
    from producerkit.errors import MissingDependencyError
    from producerkit.testing.apache_kafka import java_binary, resolve_jars

    java = java_binary()
    javac = shutil.which("javac")
    if javac is None:
        raise MissingDependencyError(f"no javac on the PATH: the Java peer needs {_INSTALL_JDK}")
    jars = resolve_jars(KAFKA_CLIENTS_VERSION)
    source_hash = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    classes = jars.parent / f"producer-runner-{source_hash}"
    if not (classes / f"{_MAIN_CLASS}.class").exists():
        _compile(javac, f"{jars}/*", classes)
    classpath = f"{jars}/*{os.pathsep}{classes}"
    # slf4j-simple logs at INFO by default: the producer's whole configuration, every start.
    return [java, "-cp", classpath, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", _MAIN_CLASS]


def _compile(javac: str, classpath: str, classes: Path) -> None:
    """Compile the runner into ``classes``, through a directory of its own renamed into place
    (a process compiling at the same time finds either nothing or the whole)."""
    building = Path(tempfile.mkdtemp(prefix="building-", dir=classes.parent))
    try:
        done = subprocess.run(
            [javac, "-d", str(building), "-cp", classpath, str(SOURCE)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise RuntimeError(f"javac failed on {SOURCE}:\n{done.stdout}{done.stderr}")
        try:
            building.rename(classes)
        except OSError:
            if not classes.is_dir():  # not another process's copy already in place
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)


async def java_producer(
    servers: str,
    topic: str,
    count: int,
    settings: Mapping[str, Any] | None = None,
    warm_up_seconds: float = 60.0,
    timeout: float = 600.0,
) -> int:
    """Run the Java producer once: ``count`` keyed 512-byte messages to ``topic`` at
    ``servers`` (``host:port``) with ``settings`` (the producer's own names,
    ``{"linger.ms": 5}``) over its defaults; its rate, every message acked. Before them, passes
    of ``count`` to warm up, until the JIT settled (its compilers almost idle in two passes in a
    row) or ``warm_up_seconds`` passed (the runner's header says how).

    The figures of the timed pass are left in :attr:`Clock.last <_peers.Clock.last>` as every
    runner's are: the JVM's wall and process CPU seconds, and the broker's CPU
    (``Clock.broker_pid``) read here between the runner's mark and its report. A runner that
    fails, or a message that is not acked, raises :class:`RuntimeError`; one still running
    after ``timeout`` seconds is killed (:class:`TimeoutError`)."""
    command = [*runner_command(), servers, topic, str(count), str(warm_up_seconds)]
    options = {**_CONNECTION_SETTINGS, **(settings or {})}
    command += [f"{name}={value}" for name, value in options.items()]
    process = await asyncio.create_subprocess_exec(
        *command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
    )
    try:
        clock, report = await asyncio.wait_for(_read_report(process), timeout)
        returncode = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if returncode or clock is None or report is None:
        raise RuntimeError(f"the Java producer exited with code {returncode} (its stderr above)")
    timed = report["timed"]
    if timed["acked"] != count or timed["failed"]:
        raise RuntimeError(f"the Java producer's timed pass: {timed} of {count} messages")
    rate = clock.stop(count, measured=(timed["seconds"], timed["cpu"]))
    # Whether the warm-up settled: the CPU of the JIT's threads (a part of client_cpu) in the
    # timed pass, and how many passes came before it.
    Clock.last.update(jit_cpu=timed["jit_cpu"], warm_up_passes=report["warm_up_passes"])
    return rate


async def _read_report(process: asyncio.subprocess.Process) -> tuple[Clock | None, Any]:
    """The clock started at the runner's mark, and its report (None for what it did not
    print)."""
    assert process.stdout is not None
    clock, report = None, None
    async for line in process.stdout:
        if line == _TIMED:
            clock = Clock()
        else:
            report = json.loads(line)
    return clock, report
