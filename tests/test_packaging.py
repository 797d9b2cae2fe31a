"""The wheel builds, installs into a fresh venv and works there: ``import producerkit`` with only
its core dependencies, ``python -m producerkit --help``, and the ``producerkit`` script.

Needs the package index (pip installs the core dependencies); about 10 s with a warm pip cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_NOT_SOURCE = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", "results")


def run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(arg) for arg in args],
        capture_output=True,
        text=True,
        timeout=600,
        **kwargs,  # type: ignore[call-overload]
    )
    assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    return result


def test_wheel_installs_and_runs_in_a_fresh_venv(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # From a copy without build leftovers: setuptools reuses build/ and *.egg-info, which can
    # hold files the package list no longer names. pip builds it in an isolated environment
    # (setuptools, and the C speedups where a compiler is).
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dist, source)
    wheels = list(dist.glob("producerkit-*.whl"))
    assert len(wheels) == 1, wheels

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run(python, "-m", "pip", "install", "--quiet", wheels[0], env=clean_env)

    # Imported from the venv, not from the source tree; no optional dependency pulled in.
    check = (
        "import sys, producerkit, producerkit.settings;"
        "assert 'site-packages' in producerkit.__file__, producerkit.__file__;"
        "heavy = [m for m in ('aiokafka', 'nats', 'pyspark', 'matplotlib', 'hdrh', 'rich')"
        " if m in sys.modules];"
        "assert not heavy, heavy;"
        "print(producerkit.__version__)"
    )
    version = run(python, "-c", check, env=clean_env, cwd=tmp_path).stdout.strip()
    assert version

    help_text = run(python, "-m", "producerkit", "--help", env=clean_env, cwd=tmp_path).stdout
    assert "produce" in help_text and "dev" in help_text
    # Every subpackage is in the wheel, not only the top-level ones.
    packaged = {name.split("/")[1] for name in _wheel_names(wheels[0]) if name.count("/") == 2}
    assert {"backends", "bench", "cli", "spark", "testing"} <= packaged, packaged
    # Both C extensions (the core's, the Kafka wire's) where a compiler built them, with stubs.
    names = _wheel_names(wheels[0])
    assert {"producerkit/_speedups.pyi", "producerkit/backends/kafka/_cwire.pyi"} <= set(names)
    built = {name.split(".")[0] for name in names if name.endswith(".so")}
    assert built in (set(), {"producerkit/_speedups", "producerkit/backends/kafka/_cwire"}), built
    script = env_dir / "bin" / "producerkit"
    assert run(script, "--version", env=clean_env, cwd=tmp_path).stdout.strip() == version

    # The core works with no extra installed: memory:// needs no broker client.
    source = tmp_path / "lines.txt"
    source.write_text("a\nb\n")
    result = run(script, "produce", "--url", "memory://", "--topic", "t", source, env=clean_env)
    assert "2 acked, 0 failed" in result.stderr


def _wheel_names(wheel: Path) -> list[str]:
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_declared_client_bounds_are_the_supported_ranges() -> None:
    """Every extra that installs aiokafka or nats-py declares exactly the range producerkit
    checks at start() (producerkit.backends._clients.SUPPORTED)."""
    import re
    import tomllib

    from producerkit.backends import _clients

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    found: dict[str, set[str]] = {}
    for requirements in extras.values():
        for requirement in requirements:
            named = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", requirement)
            assert named is not None
            if named[1] in _clients.SUPPORTED:
                found.setdefault(named[1], set()).add(named[2].replace(" ", ""))
    assert found == {name: {_clients.supported_range(name)} for name in _clients.SUPPORTED}
