"""The README's engine example runs as printed, and resumes when run again on the same file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_example_runs_and_resumes(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Five minutes with the engine\n\n```python\n(.*?)```", readme, re.S)
    assert code, "the README lost its engine example"
    script = tmp_path / "example.py"
    script.write_text(code.group(1))
    outputs = [subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120) for _ in range(2)]
    for out in outputs:
        assert out.returncode == 0, out.stderr
    assert "n: [[1,1,1]]" in outputs[0].stdout
    assert "n: [[2,1,2]]" in outputs[1].stdout  # batch 1 was not counted twice
