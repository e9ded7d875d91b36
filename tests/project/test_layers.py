"""The layer order of docs/architecture.md ("Layers"), checked on the source itself.

    cli  ->  workloads (tpcdi, voter, icu, tpcc)  ->  polystore  ->  migrators  ->  observe
         ->  core engine

Each layer imports only the layers to its right; ``benchmarks/`` and ``dags/`` sit above all of
them; ``tests/`` are exempt. Every ``import`` and ``from ... import`` counts, wherever it is
(inside a function, under ``TYPE_CHECKING``), and so does ``importlib.import_module("...")``
with a literal name: a lazy import is still a dependency.

``sstore.observe`` (metrics, HTTP status, the dashboard) is a layer of its own just above the
core: it reads an engine through ``Engine.view()`` (``sstore.engine_view``), and no module of
the core imports it, not even under ``TYPE_CHECKING`` (issue 34, "one consumer port").

Second rule: no module reaches into another module's private names (``from m import _x``,
``m._x``, ``pkg.m._x``); a name another module needs is made public, with a docstring. What
this cannot see statically (``obj._x`` on an instance of another module's class) is kept out
by review.

Why a test: the layer order is what lets each layer be tested, replaced and reasoned
about alone (the polystore knows no workload, the migrators know no planner); imports that go
the wrong way creep in one convenient line at a time, and nothing else notices.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE, DATAFLOW, STORAGE, EXECUTION, CORE, OBSERVE, MIGRATORS, POLYSTORE, WORKLOADS, CLI, TOP = \
    range(11)
#: The core's wings, bottom up (``sstore.base`` ... ``sstore.execution``), then the engine.
CORE_WINGS = (BASE, DATAFLOW, STORAGE, EXECUTION, CORE)
LAYER_NAMES = ("core: base", "core: dataflow", "core: storage", "core: execution",
               "core engine", "observe", "migrators", "polystore", "workloads", "cli",
               "benchmarks/dags")

#: Module name prefix -> layer; the longest matching prefix decides. A key ending in ``*``
#: matches any name that starts with what precedes it (``sstore.cli_*``: ``sstore.cli_format``).
LAYERS: dict[str, int] = {
    "sstore": CORE,                 # the Engine and what sits on it (engine_view, coalesce)
    # the core's wings, each importing only the wings below it
    "sstore.base": BASE,            # errors, retry, sql/duck helpers, rows, faults, files
    "sstore.dataflow": DATAFLOW,    # graph, windows, event windows, fusion, declarations
    "sstore.storage": STORAGE,      # system tables, ledger, streams, input log, versions
    "sstore.execution": EXECUTION,  # runtime, scheduler, executor, ingest, gc, recovery
    # metrics, /status, the dashboard: read the core through Engine.view(); never imported
    # by it (the engine works, and is tested, without it)
    "sstore.observe": OBSERVE,
    "migrators": MIGRATORS,
    # State-file upkeep (the sstore_maintenance DAG, TPC-DI orchestration): migrate_streams
    # is StreamToPostgres.run_once for every target, a migrator's job over the core; it
    # uses the migrators, nothing above them.
    "sstore.maintenance": MIGRATORS,
    "sstore.polystore": POLYSTORE,
    "sstore.workloads": WORKLOADS,
    "sstore.cli": CLI,              # the CLI package (sstore/cli/) or module (sstore/cli.py)
    "sstore.cli_*": CLI,            # its former sibling modules (cli_format, cli_polystore, ...)
    # click commands that live beside their workload; only the CLI imports them
    "sstore.workloads.tpcdi.audit_cli": CLI,
    "sstore.workloads.tpcdi.generator.cli": CLI,
    "benchmarks": TOP,
    "dags": TOP,
}
#: Top-level folders whose modules are checked; the others that hold Python are exempt.
CHECKED = ("sstore", "migrators", "benchmarks", "dags")
EXEMPT = {"tests": "tests may reach anything",
          "schemas": "SQL files, installed as the data package sstore._schemas",
          "scripts": "stand-alone tools run by path (the standard library only), imported by "
                     "nothing in the product"}
PROJECT = frozenset(CHECKED)


def layer_of(module: str) -> int | None:
    best, rank = -1, None
    for key, layer in LAYERS.items():
        if key.endswith("*"):
            hit, size = module.startswith(key[:-1]), len(key) - 1
        else:
            hit, size = module == key or module.startswith(key + "."), len(key)
        if hit and size > best:
            best, rank = size, layer
    return rank


@dataclass(frozen=True)
class Finding:
    module: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.what}"


def module_files(root: Path, packages: tuple[str, ...] = CHECKED) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the given top-level folders."""
    out: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` of a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def imports_of(module: str, path: Path, known: frozenset[str]
               ) -> Iterator[tuple[int, str, str | None]]:
    """(line, imported module, imported name or None) of every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            source = _resolve_relative(module, is_package, node.level, node.module) \
                if node.level else (node.module or "")
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                yield node.lineno, sub if sub in known else source, alias.name
        elif isinstance(node, ast.Call) and _dotted(node.func) in (
                "importlib.import_module", "import_module") and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            yield node.lineno, node.args[0].value, None


def layer_findings(modules: dict[str, Path]) -> list[Finding]:
    known = frozenset(modules)
    found = []
    for module, path in modules.items():
        own = layer_of(module)
        if own is None:
            found.append(Finding(module, 0, "has no layer: add its prefix to LAYERS"))
            continue
        for line, target, _name in imports_of(module, path, known):
            if target.split(".")[0] not in PROJECT:
                continue
            theirs = layer_of(target)
            finding = Finding(module, line, f"imports {target} ({LAYER_NAMES[theirs]}), above "
                              f"its own layer ({LAYER_NAMES[own]})") \
                if theirs is not None and theirs > own else None
            if finding is not None and finding not in found:  # one per line, not per name
                found.append(finding)
    return found


def private_findings(modules: dict[str, Path]) -> list[Finding]:
    known = frozenset(modules)
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bound: dict[str, str] = {}  # local name -> the project module it stands for
        for line, target, name in imports_of(module, path, known):
            if target.split(".")[0] not in PROJECT:
                continue
            if name is not None and _private(name) and target != module:
                found.append(Finding(module, line, f"imports the private {name} of {target}"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        bound[top] = top
            elif isinstance(node, ast.ImportFrom):
                source = _resolve_relative(module, path.name == "__init__.py", node.level,
                                           node.module) if node.level else (node.module or "")
                for alias in node.names:
                    if f"{source}.{alias.name}" in known:
                        bound[alias.asname or alias.name] = f"{source}.{alias.name}"
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            chain = _dotted(node.value)
            if chain is None or chain.split(".")[0] not in bound:
                continue
            head, _, rest = chain.partition(".")
            target = bound[head] + (f".{rest}" if rest else "")
            if target in known and target != module:
                found.append(Finding(module, node.lineno,
                                     f"reaches into {target}.{node.attr}, a private name"))
    return found


# ---------------------------------------------------------------------------------- the repo
def test_every_import_follows_the_layer_order() -> None:
    found = layer_findings(module_files(ROOT))
    assert not found, "imports against the layer order (see docs/architecture.md):\n" + \
        "\n".join(map(str, found))


def test_no_module_reaches_into_another_modules_private_names() -> None:
    found = private_findings(module_files(ROOT))
    assert not found, "private names used across modules (make them public):\n" + \
        "\n".join(map(str, found))


def test_the_core_never_imports_observe() -> None:
    """The dependency between the engine and its observability points one way: a core
    module that imports ``sstore.observe`` (lazily, under ``TYPE_CHECKING``, by importlib)
    is a finding, named here on its own so that the message says which rule broke."""
    modules = module_files(ROOT, ("sstore",))
    known = frozenset(modules)
    found = [f"{module}:{line}: imports {target}" for module, path in modules.items()
             if layer_of(module) in CORE_WINGS
             for line, target, _name in imports_of(module, path, known)
             if target == "sstore.observe" or target.startswith("sstore.observe.")]
    assert not found, "the core imports sstore.observe (read the engine through " \
        "Engine.view() from observe instead):\n" + "\n".join(found)


def _type_only(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): imports that never run."""
    return isinstance(node, ast.If) and _dotted(node.test) in ("TYPE_CHECKING",
                                                               "typing.TYPE_CHECKING")


def running_imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports when it runs (at import time or lazily in a
    function); imports under ``TYPE_CHECKING`` are left out: an annotation may name a module
    that imports this one without either waiting for the other."""
    known = frozenset(modules)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if _type_only(node):
                node.body = []
        lines = {n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))}
        found = set()
        for line, target, _name in imports_of(module, path, known):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if line in lines and target and target != module and \
                    not module.startswith(target + "."):
                found.add(target)
        graph[module] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    """No two modules need each other to run (lazily or not): a circle makes the two one
    module in all but name, and the first of them to be imported sees the other half-made."""
    found = circles(running_imports(module_files(ROOT)))
    assert not found, "modules that import each other (move what both need into a third):\n" \
        + "\n".join(" <-> ".join(c) for c in found)


def test_the_circle_check_finds_a_lazy_circle_and_allows_annotations(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "sstore/__init__.py": "",
        "sstore/a.py": "from sstore import b\n",
        "sstore/b.py": "def f():\n    from sstore.a import x  # lazy, still a circle\n",
        "sstore/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from sstore.d import D\n",
        "sstore/d.py": "from sstore.c import C\n",
    }, ("sstore",))
    assert circles(running_imports(modules)) == [["sstore.a", "sstore.b"]]


def test_every_python_folder_is_checked_or_exempt_for_a_reason() -> None:
    folders = {p.relative_to(ROOT).parts[0] for p in ROOT.glob("*/**/*.py")
               if not p.relative_to(ROOT).parts[0].startswith(".")}
    unaccounted = folders - set(CHECKED) - set(EXEMPT)
    assert not unaccounted, f"folders with Python that no layer covers: {sorted(unaccounted)}"
    assert layer_of("sstore.cli") == layer_of("sstore.cli.polystore") == \
        layer_of("sstore.cli_polystore") == CLI
    assert layer_of("sstore.client") == CORE  # a prefix is a whole name part, not any text
    assert layer_of("sstore.observe.metrics") == OBSERVE
    assert layer_of("sstore.observer") == CORE
    assert layer_of("sstore.base.errors") == BASE < layer_of("sstore.dataflow.graph") == \
        DATAFLOW < layer_of("sstore.storage.ledger") == STORAGE < \
        layer_of("sstore.execution.ingest") == EXECUTION < layer_of("sstore.engine") == CORE


def test_the_core_is_in_wings() -> None:
    """No module of the core lies loose in ``sstore/`` but the engine and what sits on it: a
    new module goes into the wing its imports put it in (docs/architecture.md, "The core's
    wings")."""
    loose = sorted(p.stem for p in (ROOT / "sstore").glob("*.py"))
    assert loose == ["__init__", "airflow_errors", "coalesce", "dead_letters", "engine",
                     "engine_declarations", "engine_reads", "engine_view", "maintenance"], loose


# ------------------------------------------------------------------- the checker catches ...
def _tree(tmp_path: Path, files: dict[str, str], packages: tuple[str, ...] = CHECKED
          ) -> dict[str, Path]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return module_files(tmp_path, packages)


@pytest.fixture
def fake_repo(tmp_path: Path) -> dict[str, Path]:
    """A small tree with one example of every kind of violation, and legal neighbours."""
    return _tree(tmp_path, {
        "sstore/__init__.py": "",
        "sstore/engine.py": """
            import duckdb
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from sstore.observe.metrics import EngineMetrics  # a type only, still counted
            _cache = {}
            def serve():
                from sstore.observe import server  # lazy, still counted
            """,
        "sstore/observe/__init__.py": "",
        "sstore/observe/metrics.py": ("from sstore.engine import _cache\n"
                                      "import sstore.storage.status\n"),
        "sstore/storage/status.py": """
            def report():
                from sstore.workloads.tpcc.orders import orders_rows  # lazy, still counted
                return orders_rows
            """,
        "sstore/base/errors.py": "from sstore.dataflow.graph import Graph\n",
        "sstore/dataflow/graph.py": "from sstore.base.errors import Error\nclass Graph: ...\n",
        "sstore/execution/ingest.py": "from sstore.storage import status\nimport sstore.engine\n",
        "sstore/polystore/__init__.py": "",
        "sstore/polystore/calibrate.py": """
            from migrators import spark_session
            from ..workloads.tpcc import orders
            running = spark_session._session is not None
            """,
        "sstore/polystore/executor.py": "def _run():\n    return 1\n",
        "sstore/polystore/connectors.py": """
            import importlib
            from migrators.spark import _for_spark
            from sstore.polystore import executor
            import sstore.engine
            executor._run()
            sstore.engine._cache.clear()
            importlib.import_module("sstore.cli_format")
            """,
        "sstore/workloads/__init__.py": "",
        "sstore/workloads/tpcc/__init__.py": "",
        "sstore/workloads/tpcc/orders.py": """
            from sstore.polystore.calibrate import running  # down the layers: fine
            def orders_rows(): ...
            """,
        "sstore/cli_format.py": "import sstore.workloads.tpcc.orders\n",
        "migrators/__init__.py": "",
        "migrators/spark_session.py": "_session = None\n",
        "migrators/spark.py": """
            import sstore.polystore.executor as ex
            def _for_spark(): ...
            def own(): return _for_spark()
            """,
        "benchmarks/__init__.py": "",
        "benchmarks/run.py": "from sstore.cli_format import x\nfrom sstore.engine import Engine\n",
    })


def test_the_layer_check_finds_imports_that_go_up(fake_repo: dict[str, Path]) -> None:
    found = {(f.module, f.line) for f in layer_findings(fake_repo)}
    assert found == {
        ("sstore.engine", 5),                  # core -> observe, under TYPE_CHECKING
        ("sstore.engine", 8),                  # core -> observe, inside a function
        ("sstore.storage.status", 3),          # core -> workload, inside a function
        ("sstore.base.errors", 1),             # a wing -> a wing above it
        ("sstore.execution.ingest", 2),        # the execution wing -> the engine on top
        ("sstore.polystore.calibrate", 3),     # polystore -> workload, relative import
        ("sstore.polystore.connectors", 8),    # polystore -> cli, by importlib
        ("migrators.spark", 2),                # migrators -> polystore, "import ... as"
    }


def test_the_private_check_finds_reach_ins(fake_repo: dict[str, Path]) -> None:
    found = {(f.module, f.line, f.what.split(",")[0]) for f in private_findings(fake_repo)}
    assert found == {
        ("sstore.polystore.calibrate", 4, "reaches into migrators.spark_session._session"),
        ("sstore.polystore.connectors", 3, "imports the private _for_spark of migrators.spark"),
        ("sstore.polystore.connectors", 6, "reaches into sstore.polystore.executor._run"),
        ("sstore.polystore.connectors", 7, "reaches into sstore.engine._cache"),
        ("sstore.observe.metrics", 1, "imports the private _cache of sstore.engine"),
    }


def test_a_module_without_a_layer_is_reported(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {"tools/x.py": "import sstore\n"}, ("tools",))
    found = layer_findings(modules)
    assert [str(f) for f in found] == ["tools.x:0: has no layer: add its prefix to LAYERS"]
