"""Modules that moved stay importable from their old path for one release: the same objects, and
a DeprecationWarning naming the new path, attributed to the line that imports the old one."""

from __future__ import annotations

import subprocess
import sys

import pytest

MOVED = [
    ("producerkit.brokers", "producerkit.testing.brokers"),
    ("producerkit.bench.proxy", "producerkit.testing.proxy"),
]


@pytest.mark.parametrize(("old", "new"), MOVED)
def test_old_path_imports_the_same_objects_and_warns(old: str, new: str) -> None:
    # A fresh interpreter: here the old module may already be imported.
    code = "\n".join(
        [
            "import warnings",
            "with warnings.catch_warnings(record=True) as caught:",
            "    warnings.simplefilter('always')",
            f"    import {old} as old",
            f"import {new} as new",
            "assert set(new.__all__) <= set(old.__all__), old.__all__",
            "assert all(getattr(old, name) is getattr(new, name) for name in old.__all__)",
            "[warning] = caught",
            "print(warning.category.__name__, warning.filename, warning.lineno, warning.message)",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"DeprecationWarning <string> 4 {old} is deprecated: import {new}"


def test_import_producerkit_imports_no_tooling() -> None:
    tooling = ("producerkit.testing", "producerkit.brokers", "producerkit.bench", "producerkit.cli")
    code = f"import sys, producerkit; print([m for m in sys.modules if m.startswith({tooling})])"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"
