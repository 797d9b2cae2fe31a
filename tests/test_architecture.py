"""docs/architecture.md names the code it walks through, and each name must be where it says.

The page's notation: a function, class or method is named as a backticked path followed, after
one space on the same line, by the backticked name defined in that file, as in
`` `producerkit/_window.py` `InFlightWindow.acked_run` `` or
`` `producerkit/_speedups.c` `Admission_admit` ``. These checks read the page and the code
without importing anything:

- every backticked path ending in ``.py`` or ``.c`` exists, relative to the repository root;
- every name given with a ``.py`` path is defined there, found by ``ast``: a module-level
  function, class or assignment, or a class's function or nested class (``Class.method``);
- every name given with a ``.c`` path is defined there: a function definition, a
  ``typedef struct { ... } Name;``, or a ``PyTypeObject NameType``;
- a backticked ``Class.name`` written in prose without its path is one the page names with its
  path somewhere, so that renaming it in the code fails here too;
- in the table, each row naming the Python core (``_core_py.py``) names its C twin too.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"

_PATH = r"[\w./-]+\.(?:py|c)"
_NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
#: A name given with its file: `path` `Name`, one space between, on one line.
_PAIR = re.compile(rf"`({_PATH})` `({_NAME})`")
_TICKED = re.compile(r"`([^`\n]+)`")
_A_PATH = re.compile(rf"{_PATH}")
#: A qualified name in prose (``Class.method``), which must be named with its file somewhere.
_QUALIFIED = re.compile(r"[A-Z]\w*(?:\.[A-Za-z_]\w*)+")


def references(text: str) -> list[tuple[int, str, str]]:
    """``(line number, path, name)`` for each name the page gives with its file."""
    return [
        (number, match[1], match[2])
        for number, line in enumerate(text.splitlines(), 1)
        for match in _PAIR.finditer(line)
    ]


def python_names(source: str) -> set[str]:
    """The qualified names a module defines: functions, classes and module-level assignments,
    and the functions, classes and attributes (assigned or annotated) inside its classes (also
    under ``if``/``try``)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(prefix + node.name)
            elif isinstance(node, ast.ClassDef):
                names.add(prefix + node.name)
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body + node.orelse, prefix)
            elif isinstance(node, ast.Assign | ast.AnnAssign):  # a module's or a class's
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(
                    prefix + target.id for target in targets if isinstance(target, ast.Name)
                )

    visit(ast.parse(source).body, "")
    return names


def c_defines(source: str, name: str) -> bool:
    """Whether C ``source`` defines ``name``: a function (its definition, not a declaration or
    a call), a typedef'd struct, or a type object ``NameType``."""
    quoted = re.escape(name)
    return any(
        re.search(pattern, source, re.MULTILINE)
        for pattern in (
            rf"^[A-Za-z_][\w \t*]*?\b{quoted}\s*\([^;{{}}]*\)\s*\{{",
            rf"^\}}\s*{quoted}\s*;",
            rf"\bPyTypeObject\s+{quoted}Type\b",
        )
    )


@functools.cache
def _source(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def problems(text: str) -> list[str]:
    """What is wrong with a page's names (an empty list: nothing)."""
    found: list[str] = []
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        for ticked in _TICKED.findall(line):
            if _A_PATH.fullmatch(ticked) and not (ROOT / ticked).is_file():
                found.append(f"line {number}: no file {ticked}")
        # A pair broken over two lines would escape the check: keep each on one line.
        ending = re.search(rf"`({_PATH})`\W*$", line)
        if ending and number < len(lines) and re.match(rf"\s*`{_NAME}`", lines[number]):
            found.append(f"line {number}: `{ending[1]}` and its name are on two lines")
    pairs = references(text)
    named = {name for _, _, name in pairs}
    for number, path, name in pairs:
        if not (ROOT / path).is_file():
            continue  # reported above
        if path.endswith(".py"):
            defined = name in _python_names(path)
        else:
            defined = c_defines(_source(path), name)
        if not defined:
            found.append(f"line {number}: {path} defines no {name}")
    for number, line in enumerate(lines, 1):
        in_pairs = {match[2] for match in _PAIR.finditer(line)}
        for ticked in _TICKED.findall(line):
            if _QUALIFIED.fullmatch(ticked) and ticked not in in_pairs and ticked not in named:
                found.append(f"line {number}: {ticked} is never named with its file")
        if line.startswith("|") and "_core_py.py` `" in line and "_speedups.c` `" not in line:
            found.append(f"line {number}: a row names the Python core without its C twin")
    return found


@functools.cache
def _python_names(path: str) -> frozenset[str]:
    return frozenset(python_names(_source(path)))


def test_every_name_on_the_architecture_page_is_where_it_says() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert references(text), "the page names no function with its file"
    assert problems(text) == []


def test_the_page_names_both_implementations_of_the_core() -> None:
    pairs = {(path, name) for _, path, name in references(DOC.read_text(encoding="utf-8"))}
    for python, c in [
        ("WindowCore.full", "window_full"),
        ("Admission.admit", "Admission_admit"),
        ("Admission.admit_chunk", "Admission_admit_chunk"),
        ("Router.route", "Router_route"),
        ("pop_run", "pop_run"),
        ("tell_run", "tell_run"),
        ("ProduceDoor", "ProduceDoor"),
        ("ProducerCore", "ProducerCore"),
    ]:
        assert ("producerkit/_core_py.py", python) in pairs
        assert ("producerkit/_speedups.c", c) in pairs


def test_the_page_names_both_implementations_of_the_kafka_wire_each_in_its_own_extension() -> None:
    pairs = {(path, name) for _, path, name in references(DOC.read_text(encoding="utf-8"))}
    wire, cwire = "producerkit/backends/kafka/wire.py", "producerkit/backends/kafka/_cwire.c"
    for python, c in [
        ("encode_batch_in_python", "encode_batch"),
        ("encode_records_in_python", "encode_records_only"),
        ("frame_batch_in_python", "frame_batch"),
        ("crc32c_of_in_python", "crc32c"),
        ("partition_runs_in_python", "partition_runs"),
    ]:
        assert (wire, python) in pairs
        assert (cwire, c) in pairs
        assert not c_defines(_source("producerkit/_speedups.c"), c), c
    for core in ("Admission_admit", "pop_run", "tell_run", "ProduceDoor", "Record"):
        assert c_defines(_source("producerkit/_speedups.c"), core), core
        assert not c_defines(_source(cwire), core), core


@pytest.mark.parametrize(
    ("page", "problem"),
    [
        ("`producerkit/_window.py` `InFlightWindow.acked_twice`", "defines no"),
        ("`producerkit/_window.py` `InFlightWindow`", None),
        ("`producerkit/_core_py.py` `new_delivery`", None),
        ("`producerkit/_speedups.c` `Admission_admit`", None),
        ("`producerkit/_speedups.c` `window_full`", None),
        ("`producerkit/_speedups.c` `WindowCore`", None),
        ("`producerkit/_speedups.c` `Record`", None),
        ("`producerkit/_speedups.c` `Admission_admitted`", "defines no"),
        ("`producerkit/_speedups.c` `PyDict_SetItem`", "defines no"),  # called, not defined
        ("`producerkit/_nowhere.py` `f`", "no file"),
        ("`producerkit/_window.py`\n`InFlightWindow.acked`", "two lines"),
        ("see `InFlightWindow.acked_run`", "never named with its file"),
        ("| x | `producerkit/_core_py.py` `pop_run` | |", "without its C twin"),
    ],
)
def test_the_check_catches_a_wrong_name(page: str, problem: str | None) -> None:
    found = problems(page)
    if problem is None:
        assert found == []
    else:
        assert any(problem in line for line in found), found


#: Client libraries, named only below the seam (and by what drives them from outside).
_CLIENTS = ("aiokafka", "nats", "confluent_kafka")
#: Modules above ``backends/`` allowed to import a backend's module or a client: the test
#: kit (it starts and reads back real brokers), the benchmark's peers (the clients measured
#: beside producerkit), and the handle type ``producerkit.transactions`` re-exports.
_OUTSIDE_THE_SEAM = {
    "producerkit/testing": None,
    "producerkit/bench/peers.py": None,
    "producerkit/transactions.py": {"producerkit.backends.kafka.prepared"},
}


def _imports(path: Path) -> set[str]:
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module)
    return imported


def test_no_module_above_the_seam_imports_a_client_or_a_backends_module() -> None:
    package = ROOT / "producerkit"
    crossing: list[str] = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        if where.startswith("producerkit/backends/"):
            continue
        allowed: set[str] | None = set()
        for prefix, exempt in _OUTSIDE_THE_SEAM.items():
            if where.startswith(prefix):
                allowed = exempt
        if allowed is None:
            continue
        for module in sorted(_imports(path) - allowed):
            top = module.split(".")[0]
            backend = module.startswith(("producerkit.backends.kafka", "producerkit.backends.nats"))
            if top in _CLIENTS or backend:
                crossing.append(f"{where} imports {module}")
    assert not crossing, crossing
