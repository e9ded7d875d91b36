"""``sstore.base.files.write_atomically``: a writer SIGKILLed between writing and renaming leaves
the old file whole, one killed after the rename leaves the new one whole; and every place that
replaces a file uses it (a scan of the source)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

WRITER = """
import sys
from sstore.base.files import write_atomically
write_atomically(sys.argv[1], sys.argv[2] * 100_000)
"""


def write_in_child(path: Path, text: str, crash_at: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "SSTORE_CRASH_AT"}
    if crash_at:
        env["SSTORE_CRASH_AT"] = crash_at
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", WRITER, str(path), text], env=env,
                          timeout=60).returncode


def test_a_writer_killed_before_the_rename_leaves_the_old_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "catalog.json"
    assert write_in_child(path, "a", None) == 0
    assert write_in_child(path, "b", "file.before_rename:1") == -9  # SIGKILL
    assert path.read_text() == "a" * 100_000
    assert write_in_child(path, "c", None) == 0
    assert path.read_text() == "c" * 100_000


def test_a_write_that_fails_leaves_no_temporary_file(tmp_path: Path) -> None:
    from sstore.base.files import write_atomically

    path = tmp_path / "x"
    write_atomically(str(path), "old")
    with pytest.raises(IsADirectoryError):
        write_atomically(str(tmp_path), "new")  # a directory cannot be replaced by a file
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]


def test_every_file_replacement_goes_through_write_atomically() -> None:
    """No product or benchmark module renames a file over another by itself."""
    found = []
    for folder in ("sstore", "migrators", "benchmarks", "dags"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "sstore" / "base" / "files.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\bos\.(replace|rename)\(|\.rename\(", line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, ("use sstore.base.files.write_atomically / replace_durably:\n"
                       + "\n".join(found))
