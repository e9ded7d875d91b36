"""``migrators/delivery.py`` (the protocol's statements) and ``migrators/watermarks.py`` (the
table's DDL, the names a row is keyed on, its readers and upkeep) are the only code that reads
or writes ``sstore.watermarks`` (issue 34, "one sink runner"), checked on the source itself,
like ``test_layers``.

Why: the watermark decides what a restart delivers again. Each module that queried it on its
own matched rows to tables its own way (by the spelling given, by ``split_part`` or ``LIKE``
of the schema, with or without the OID the row was written for), and a row one module counts
and another misses is a batch delivered twice or skipped. Readers and upkeep (status, the
polystore's probes, dropping a warehouse) ask ``migrators.watermarks`` instead.

A finding is any string in a module of ``sstore/``, ``migrators/``, ``benchmarks/`` or
``dags/`` (other than those two) that uses the table in SQL: after ``FROM``, ``JOIN``,
``UPDATE``, ``INTO``, ``TABLE``, ``EXISTS`` or inside ``to_regclass('...')``; and any use of
``WATERMARKS``, the table's name as a constant. Docstrings and comments may
name the table (they explain it); tests may query it (they check what a sink did).
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("sstore", "migrators", "benchmarks", "dags")
OWNERS = (Path("migrators/delivery.py"), Path("migrators/watermarks.py"))
TABLE = "sstore.watermarks"
IN_SQL = re.compile(r"(?i)(\b(from|join|update|into|table|exists)\s+|to_regclass\(\s*')"
                    r"\"?sstore\"?\.\"?watermarks\b")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (a module's, class's or function's)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _text(node: ast.expr) -> str | None:
    """A string literal's text; an f-string's with ``{}`` for each formatted value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def findings(root: Path, folders: tuple[str, ...] = CHECKED) -> list[str]:
    out = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root)
            if rel in OWNERS:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            docs = _docstrings(tree)
            inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)
                     for v in n.values}
            for node in ast.walk(tree):
                if id(node) in docs or id(node) in inner:
                    continue
                text = _text(node)  # type: ignore[arg-type]
                if text is not None and IN_SQL.search(text):
                    out.append(f"{rel}:{node.lineno}: {TABLE} in SQL")  # type: ignore[attr-defined]
                elif isinstance(node, ast.Attribute) and node.attr == "WATERMARKS":
                    out.append(f"{rel}:{node.lineno}: uses {ast.unparse(node)}")
                elif isinstance(node, ast.ImportFrom) and any(
                        a.name == "WATERMARKS" for a in node.names):
                    out.append(f"{rel}:{node.lineno}: imports WATERMARKS")
    return out


def test_only_delivery_reads_or_writes_the_watermarks() -> None:
    found = findings(ROOT)
    assert not found, ("sstore.watermarks used outside migrators/delivery.py and "
                       "migrators/watermarks.py (ask watermarks: watermark_of, "
                       "forget_targets, ...):\n" + "\n".join(found))


def test_the_owners_do_write_it() -> None:
    """The scan looks where the table really is named: the owners are full of it."""
    from migrators import watermarks
    assert watermarks.WATERMARKS == TABLE
    protocol, table = ((ROOT / path).read_text(encoding="utf-8") for path in OWNERS)
    assert IN_SQL.search(table) and "FROM {WATERMARKS}" in table
    assert "FROM {WATERMARKS}" in protocol and "UPDATE {WATERMARKS}" in protocol


def test_the_scan_finds_every_kind_of_use(tmp_path: Path) -> None:
    files = {
        "sstore/a.py": '''
            """Reads ``sstore.watermarks`` (a docstring may say so)."""
            # SELECT batch_id FROM sstore.watermarks  (a comment may too)
            def f(con, t):
                """DELETE FROM sstore.watermarks in a docstring is prose."""
                con.execute("SELECT batch_id FROM sstore.watermarks WHERE target = %s", (t,))
                con.execute(f"DELETE FROM sstore.watermarks WHERE target = {t!r}")
                con.execute("SELECT to_regclass('sstore.watermarks') IS NOT NULL")
                raise ValueError("no sink's watermark (sstore.watermarks) links them")
            ''',
        "benchmarks/b.py": '''
            from migrators.delivery import WATERMARKS
            from migrators import delivery
            def g(con):
                con.execute(f"UPDATE {delivery.WATERMARKS} SET batch_id = 0")
            ''',
        "migrators/delivery.py": 'Q = "SELECT * FROM sstore.watermarks"\n',
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    found = sorted(findings(tmp_path, ("sstore", "migrators", "benchmarks")))
    assert found == [
        "benchmarks/b.py:2: imports WATERMARKS",
        "benchmarks/b.py:5: uses delivery.WATERMARKS",
        "sstore/a.py:6: sstore.watermarks in SQL",
        "sstore/a.py:7: sstore.watermarks in SQL",
        "sstore/a.py:8: sstore.watermarks in SQL",
    ]
