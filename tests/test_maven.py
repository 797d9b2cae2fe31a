"""producerkit.testing.maven: jars resolved once into the cache, with a stand-in ``mvn`` (a shell
script on the PATH that records its arguments and writes the jars it is asked for), so that no
test here reaches Maven Central."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from producerkit.errors import MissingDependencyError
from producerkit.testing.maven import Artifact, cache_root, resolve_jars

#: The stand-in: appends its arguments to calls.txt; with MVN_FAIL set, fails saying so; else
#: writes one jar per name in MVN_JARS into -DoutputDirectory.
_FAKE_MVN = """#!/bin/sh
echo "$@" >> "$MVN_CALLS"
if [ -n "$MVN_FAIL" ]; then echo "[ERROR] $MVN_FAIL"; exit 1; fi
for arg in "$@"; do
  case "$arg" in -DoutputDirectory=*) out="${arg#-DoutputDirectory=}";; esac
done
mkdir -p "$out"
for jar in $MVN_JARS; do : > "$out/$jar"; done
"""


@pytest.fixture
def fake_mvn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text(_FAKE_MVN)
    mvn.chmod(mvn.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MVN_CALLS", str(calls))
    monkeypatch.setenv("PRODUCERKIT_CACHE", str(tmp_path / "cache"))
    return calls


def test_the_pom_names_each_artifact_and_its_exclusions() -> None:
    entry = Artifact("org.example", "tool", "1.2", excluded=("org.other:heavy",)).pom_entry()
    assert entry == (
        "<dependency><groupId>org.example</groupId><artifactId>tool</artifactId>"
        "<version>1.2</version><exclusions><exclusion><groupId>org.other</groupId>"
        "<artifactId>heavy</artifactId></exclusion></exclusions></dependency>"
    )
    assert "<exclusions>" not in Artifact("org.example", "tool", "1.2").pom_entry()


def test_jars_are_resolved_once_then_taken_from_the_cache(
    fake_mvn: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MVN_JARS", "tool-1.2.jar dependency-3.0.jar")
    sink = [Artifact("org.example", "tool", "1.2")]
    jars = resolve_jars("tool-1.2", sink, only=("tool", "dependency"))
    assert jars == cache_root() / "tool-1.2" / "jars"
    assert sorted(path.name for path in jars.iterdir()) == ["dependency-3.0.jar", "tool-1.2.jar"]
    (call,) = fake_mvn.read_text().splitlines()
    assert "dependency:copy-dependencies" in call
    assert "-DincludeArtifactIds=tool,dependency" in call
    assert "<artifactId>tool</artifactId>" in (jars.parent / "pom.xml").read_text()
    assert resolve_jars("tool-1.2", sink) == jars
    assert len(fake_mvn.read_text().splitlines()) == 1  # the second call asked no Maven


def test_maven_failing_or_a_jar_missing_is_a_missing_dependency(
    fake_mvn: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MVN_FAIL", "tool:jar:9.9 was not found in central")
    with pytest.raises(MissingDependencyError, match="was not found in central") as raised:
        resolve_jars("tool-9.9", [Artifact("org.example", "tool", "9.9")])
    assert "missing: tool" in str(raised.value)
    assert not (cache_root() / "tool-9.9" / ".complete").exists()
    # Maven succeeding without the artifact's jar (filtered out by ``only``) is no success
    monkeypatch.delenv("MVN_FAIL")
    monkeypatch.setenv("MVN_JARS", "other-1.0.jar")
    with pytest.raises(MissingDependencyError, match=r"exit code 0; missing: tool"):
        resolve_jars("tool-9.9", [Artifact("org.example", "tool", "9.9")])
