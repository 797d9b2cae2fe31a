"""``format("producerkit")`` is found by Spark after any install the README shows, editable
included: Spark imports each top-level ``pyspark_*`` module that ``pkgutil.iter_modules()``
lists (pyspark/sql/worker/lookup_data_sources.py), and an editable install must leave
``pyspark_producerkit`` where that sees it (a path entry, not only an import hook)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: What Spark's lookup does, in a fresh interpreter whose site directory holds the install.
_LOOKUP = """
import pkgutil, site, sys
site.addsitedir(sys.argv[1])
print(sorted(m.name for m in pkgutil.iter_modules() if m.name.startswith("pyspark_producerkit")))
"""


def test_an_editable_install_leaves_the_spark_hook_where_spark_looks(tmp_path: Path) -> None:
    """The project's packaging (pyproject.toml; a setup.py without the C speedups, so nothing
    is built into the tree) built as an editable wheel, installed into a site directory, and
    Spark's lookup run over it from another directory."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "pyproject.toml", project)
    shutil.copy(ROOT / "README.md", project)
    (project / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    shutil.copytree(ROOT / "pyspark_producerkit", project / "pyspark_producerkit")
    (project / "producerkit").mkdir()
    (project / "producerkit" / "__init__.py").write_text("")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build = f"from setuptools import build_meta; print(build_meta.build_editable({str(wheels)!r}))"
    subprocess.run(
        [sys.executable, "-c", build], cwd=project, check=True, capture_output=True, timeout=240
    )
    (wheel,) = wheels.glob("*.whl")
    site_dir = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    found = subprocess.run(
        [sys.executable, "-c", _LOOKUP, str(site_dir)],
        cwd=elsewhere,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert found.strip() == "['pyspark_producerkit']"
