"""Jars from Maven Central, resolved once into producerkit's cache and reused after.

Whatever producerkit runs on the JVM for tests and benches (the Apache Kafka broker of
:mod:`producerkit.testing.apache_kafka`, Spark's own Kafka sink in benches/bench_spark.py) comes
as jars that ``mvn dependency:copy-dependencies`` resolves from a small generated pom into a
directory of :func:`cache_root`, once: a file lock keeps parallel processes from resolving at
the same time, and a marker file says the copy is complete. Without ``mvn``,
:class:`~producerkit.errors.MissingDependencyError` says what to install.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import attrs

from producerkit.errors import MissingDependencyError

__all__ = ["Artifact", "cache_root", "resolve_jars"]

#: What to install for the JVM side, said in every error about it.
INSTALL_JAVA: Final = (
    "This needs Java 17+ and, to fetch its jars once, Maven: "
    "apt-get install openjdk-17-jre-headless maven (or brew install openjdk maven)"
)
_COMPLETE: Final = ".complete"


@attrs.frozen
class Artifact:
    """One dependency of the generated pom: ``group:name:version``, without the transitive
    dependencies ``excluded`` names (each ``group:name``)."""

    group: str
    name: str
    version: str
    excluded: tuple[str, ...] = ()

    def pom_entry(self) -> str:
        """This dependency as the pom's ``<dependency>`` element."""
        exclusions = "".join(
            f"<exclusion><groupId>{group}</groupId><artifactId>{name}</artifactId></exclusion>"
            for group, name in (one.split(":", 1) for one in self.excluded)
        )
        return (
            f"<dependency><groupId>{self.group}</groupId><artifactId>{self.name}</artifactId>"
            f"<version>{self.version}</version>"
            + (f"<exclusions>{exclusions}</exclusions>" if exclusions else "")
            + "</dependency>"
        )


def cache_root() -> Path:
    """Where resolved jars are kept: ``$PRODUCERKIT_CACHE``, else
    ``$XDG_CACHE_HOME/producerkit``, else ``~/.cache/producerkit``."""
    explicit = os.environ.get("PRODUCERKIT_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "producerkit"
    return Path.home() / ".cache" / "producerkit"


def _pom(name: str, artifacts: Sequence[Artifact]) -> str:
    listed = "\n".join(f"    {artifact.pom_entry()}" for artifact in artifacts)
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>producerkit</groupId>
  <artifactId>{name}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{listed}
  </dependencies>
</project>
"""


def resolve_jars(
    name: str,
    artifacts: Sequence[Artifact],
    *,
    only: Sequence[str] = (),
) -> Path:
    """The directory ``<cache_root>/<name>/jars`` holding ``artifacts`` and every jar they
    depend on (with ``only``: just the jars of those artifact names, for a JVM that already has
    the rest on its class path), resolved by Maven the first time and reused after.

    Safe to call from parallel processes: one resolves under an exclusive file lock while the
    others wait for it, and the directory counts as complete only once its marker file is
    written, after the jar of every artifact is there. ``mvn`` missing, or Maven failing (no
    network, a version not served):
    :class:`~producerkit.errors.MissingDependencyError`, with the end of Maven's output."""
    home = cache_root() / name
    jars = home / "jars"
    if (home / _COMPLETE).exists():
        return jars
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (home / _COMPLETE).exists():
            return jars  # another process resolved them while this one waited
        mvn = shutil.which("mvn")
        if mvn is None:
            raise MissingDependencyError(
                f"no mvn on the PATH to fetch {name}'s jars. {INSTALL_JAVA}"
            )
        (home / "pom.xml").write_text(_pom(name, artifacts))
        shutil.rmtree(jars, ignore_errors=True)
        command = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(home / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={jars}",
        ]
        if only:
            command.append(f"-DincludeArtifactIds={','.join(only)}")
        result = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        missing = [
            artifact
            for artifact in artifacts
            if not any(jars.glob(f"{artifact.name}-{artifact.version}*.jar"))
        ]
        if result.returncode != 0 or missing:
            output = (result.stdout + result.stderr).strip().splitlines()
            raise MissingDependencyError(
                f"Maven could not fetch {name}'s jars (exit code {result.returncode}"
                + (f"; missing: {', '.join(one.name for one in missing)}" if missing else "")
                + "):\n"
                + "\n".join(output[-20:])
            )
        resolved = [f"{one.group}:{one.name}:{one.version}" for one in artifacts]
        (home / _COMPLETE).write_text("\n".join(resolved) + "\n")
    return jars
