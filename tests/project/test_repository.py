"""The repository stands alone: nothing in it refers to files outside the checkout (a clean
clone on any machine must pass the README's test command), and the architecture the tests cite
is in it.

The one exception is ``.ci/run``, CI's own script, which looks for the real DIGen data where
CI's machines keep it, beside the checkout, and hands it to the tests through
``SSTORE_DIGEN_DIR`` (``tests/external_data.py``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = re.compile(r"\.\./shared|/work/|ARCHITECTURE\.md")
EXEMPT = {".ci/run": "CI's own script finds CI's data beside the checkout",
          "tests/project/test_repository.py": "this test names what it looks for"}


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    return [ROOT / name for name in listed
            if name not in EXEMPT and not name.startswith("benchmarks/results/")
            and Path(name).suffix in {".py", ".md", ".sh", ".toml", ".yml", ".yaml", ".cfg",
                                      ".txt", ".sql", ".json", ""}]


def test_nothing_refers_to_files_outside_the_repository() -> None:
    found = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not found, "references outside the repository:\n" + "\n".join(found)


def test_the_architecture_is_in_the_repository() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for heading in ("## Layers", "## One home per guarantee", "## Commit protocols"):
        assert heading in text
    assert "docs/architecture.md" in (ROOT / "README.md").read_text(encoding="utf-8")
    layers = ROOT / "tests" / "project" / "test_layers.py"
    assert "docs/architecture.md" in layers.read_text("utf-8")


#: Each folder of tests/ and what it tests: a package (tests mirror the packages) or, for the
#: two that cut across them, the concern.
TEST_FOLDERS = {
    "engine": "sstore's core (sstore.engine and its wings base, dataflow, storage, execution)",
    "migrators": "migrators/ and sstore.maintenance",
    "polystore": "sstore.polystore",
    "observe": "sstore.observe",
    "sources": "sstore.sources",
    "cli": "sstore.cli",
    "workloads": "sstore.workloads (tpcdi in its own folder)",
    "workloads/tpcdi": "sstore.workloads.tpcdi",
    "dags": "dags/ (and a real Airflow scheduler)",
    "benchmarks": "benchmarks/ (their --quick paths, the chaos and model runs)",
    "seams": "the seams between layers, each crossed on purpose",
    "project": "the repository itself: layers, wheel, README, compose, lint-free files",
}


def test_the_tests_mirror_the_packages() -> None:
    """Every test module lives in the folder of what it tests; shared helpers and the one
    conftest stay at the top of tests/."""
    tests = ROOT / "tests"
    loose = sorted(p.name for p in tests.glob("test_*.py"))
    assert not loose, f"test modules outside a folder (move them where they belong): {loose}"
    folders = sorted(p.parent.relative_to(tests).as_posix() for p in tests.rglob("test_*.py"))
    assert set(folders) <= set(TEST_FOLDERS), set(folders) - set(TEST_FOLDERS)
    for folder in TEST_FOLDERS:
        assert (tests / folder / "__init__.py").exists(), folder


MAX_MODULE_LINES = 500


def test_every_product_module_is_small() -> None:
    """A module has one job and reads in one sitting: at most 500 lines in sstore/ and
    migrators/ (split along the job's seams, as engine.py into engine_declarations.py and
    engine_reads.py, not into numbered parts)."""
    long = {str(p.relative_to(ROOT)): n for folder in ("sstore", "migrators")
            for p in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
