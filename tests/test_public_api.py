"""The public API is what ``producerkit.__all__`` says: sorted, every name importable, nothing
public left out of it, and ``import producerkit`` pulls in no client library or heavy extra."""

from __future__ import annotations

import inspect
import subprocess
import sys
import types

import producerkit

#: Optional dependencies ``import producerkit`` must not import (each is imported inside the one
#: function that needs it).
HEAVY = ("aiokafka", "nats", "pyspark", "matplotlib", "confluent_kafka", "hdrh", "rich")


def test_all_is_sorted_and_without_duplicates() -> None:
    assert producerkit.__all__ == sorted(producerkit.__all__)
    assert len(set(producerkit.__all__)) == len(producerkit.__all__)


def test_every_name_in_all_is_importable() -> None:
    for name in producerkit.__all__:
        assert hasattr(producerkit, name), name
        namespace: dict[str, object] = {}
        exec(f"from producerkit import {name}", namespace)
        assert namespace[name] is getattr(producerkit, name)
    namespace = {}
    exec("from producerkit import *", namespace)
    assert set(producerkit.__all__) <= set(namespace)


def test_nothing_public_is_missing_from_all() -> None:
    """Every public class, function or exception producerkit defines and its top-level module
    exposes is in __all__ (submodules are not: they are imported by their own name)."""
    missing = []
    for name, value in vars(producerkit).items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        if (getattr(value, "__module__", "") or "").split(".")[0] != "producerkit":
            continue
        if name not in producerkit.__all__:
            missing.append(name)
    assert missing == []


def test_every_public_name_has_a_docstring() -> None:
    undocumented = [
        name
        for name in producerkit.__all__
        if (inspect.isclass(value := getattr(producerkit, name)) or inspect.isfunction(value))
        and not inspect.getdoc(value)
    ]
    assert undocumented == []


def test_import_producerkit_imports_no_client_library_or_heavy_extra() -> None:
    code = f"import sys, producerkit; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout
