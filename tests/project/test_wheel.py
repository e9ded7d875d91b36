"""The wheel is all a user needs, and a missing extra is one line, not a traceback.

The wheel is built from a clean copy of the sources (what git tracks, nothing built), installed
with its dependencies into a fresh virtual environment outside the checkout, and driven from a
directory outside the checkout with PYTHONPATH unset: it must find its SQL schemas inside
site-packages (they were once found through ``Path(__file__).parents[3]``, which only works in
a checkout). The editable install that scripts/setup.sh and CI use must keep mapping
``sstore._schemas`` to the checkout's ``schemas/`` folder.

Installs go through pip as configured on the machine (its index and cache); the timings are
printed (``pytest -s``).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

from sstore.base.extras import OPTIONAL_MODULES

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("sstore", "migrators")           # the top-level packages of the wheel
SCHEMAS = ("tpcdi.sql", "tpcc_orders.sql")
SPARK_HINT = "Error: this needs PySpark: pip install 'sstore[spark]'"
BENCH_HINT = "Error: this needs matplotlib: pip install 'sstore[bench]'"


# -- helpers -----------------------------------------------------------------------------------
def clean_copy(dest: Path) -> Path:
    """The files git tracks (and new ones it does not ignore), nothing built or installed."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def outside_env(venv: Path | None = None) -> dict[str, str]:
    """This process's environment without what would let a child import the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 400
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, (f"{' '.join(map(str, done.args))}: exit {done.returncode}\n"
                                  f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done


def one_line_hint(done: subprocess.CompletedProcess[str], hint: str) -> None:
    """Exit 1, and stderr is exactly the hint: no traceback anywhere."""
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])
    assert done.stderr.strip() == hint, done.stderr[-4000:]
    assert "Traceback" not in done.stdout


def timed_pip_install(venv: Path, target: str, cwd: Path) -> float:
    t0 = time.perf_counter()
    ok(run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", target], cwd,
           outside_env(), timeout=500))
    return time.perf_counter() - t0


def new_venv(path: Path, cwd: Path) -> Path:
    ok(run([sys.executable, "-m", "venv", str(path)], cwd, outside_env(), timeout=120))
    return path


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel built from a clean copy (which is deleted afterwards), and pip's output."""
    base = tmp_path_factory.mktemp("wheel")
    source = clean_copy(base / "src")
    t0 = time.perf_counter()
    done = ok(run([sys.executable, "-m", "pip", "wheel", "--no-deps", str(source), "-w",
                   str(base / "dist")], base, outside_env(), timeout=300))
    print(f"\nwheel built in {time.perf_counter() - t0:.1f} s")
    shutil.rmtree(source)
    (wheel,) = (base / "dist").glob("sstore-*.whl")
    return wheel, done.stdout + done.stderr


# -- what the project declares -----------------------------------------------------------------
def test_pyproject_ships_every_package_the_schemas_and_py_typed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    tools = config["tool"]["setuptools"]
    on_disk = {str(init.parent.relative_to(ROOT)).replace(os.sep, ".")
               for top in SHIPPED for init in (ROOT / top).rglob("__init__.py")}
    assert set(tools["packages"]) == on_disk | {"sstore._schemas"}, \
        "pyproject.toml [tool.setuptools] packages must name every package on disk"
    assert tools["package-dir"] == {"sstore._schemas": "schemas"}
    assert all((ROOT / "schemas" / name).is_file() for name in SCHEMAS)
    for top in SHIPPED:
        assert (ROOT / top / "py.typed").is_file()
        assert "py.typed" in tools["package-data"][top]
    assert config["project"]["license"] == "Apache-2.0"
    assert all((ROOT / name).is_file() for name in config["project"]["license-files"])
    extras = config["project"]["optional-dependencies"]
    for module, (_label, extra) in OPTIONAL_MODULES.items():
        assert extra in extras, f"sstore.base.extras names extra {extra!r} for {module}"


def test_shipped_code_does_not_locate_files_next_to_itself() -> None:
    """``__file__`` in sstore/ or migrators/ is how the schemas got lost in site-packages."""
    offenders = [f"{path.relative_to(ROOT)}:{node.lineno}" for top in SHIPPED
                 for path in (ROOT / top).rglob("*.py")
                 for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, ast.Name) and node.id == "__file__"]
    assert offenders == [], "read shipped files with sstore.base.resources / importlib.resources"


def test_wheel_contents(built: tuple[Path, str]) -> None:
    wheel, output = built
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("sstore/py.typed", "migrators/py.typed", "sstore/observe/dashboard.html",
                   *(f"sstore/_schemas/{name}" for name in SCHEMAS)):
        assert needed in names, needed
    tops = {name.split("/")[0] for name in names if not name.startswith("sstore-")}
    assert tops == set(SHIPPED), tops        # no top-level "schemas", "tests", "benchmarks"
    (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "SetuptoolsDeprecationWarning" not in output, output


# -- the wheel in a fresh environment ----------------------------------------------------------
IMPORT_CHECK = """
import json, sys
import migrators, sstore, sstore._schemas
from importlib import resources
from sstore.base.resources import read_schema
print(json.dumps({"files": [sstore.__file__, migrators.__file__,
                            str(resources.files("sstore._schemas") / "tpcdi.sql")],
                  "path": sys.path, "ddl": len(read_schema("tpcdi"))}))
"""


def test_wheel_in_a_fresh_venv(built: tuple[Path, str], pg_url: str, tmp_path: Path) -> None:
    """Install the wheel (no extras), check where it imports from, generate data, see the
    one-line hints of the missing extras; then install ``[spark]`` and run the streaming
    load, its audit and the polystore calibration, all from outside the checkout."""
    wheel, _ = built
    work = tmp_path / "work"
    work.mkdir()
    venv = new_venv(tmp_path / "venv", work)
    env = outside_env(venv)
    seconds = timed_pip_install(venv, str(wheel), work)
    print(f"\nwheel + dependencies installed in {seconds:.1f} s")
    python, sstore = str(venv / "bin" / "python"), str(venv / "bin" / "sstore")

    found = json.loads(ok(run([python, "-c", IMPORT_CHECK], work, env)).stdout)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" \
        / "site-packages"
    for file in found["files"]:
        assert Path(file).is_relative_to(site), file
    assert not [p for p in found["path"] if p and Path(p).resolve().is_relative_to(ROOT)]
    assert found["ddl"] > 1000

    ok(run([sstore, "tpcdi", "generate", "--scale-factor", "0.01", "--output", "data"],
           work, env))
    assert (work / "data" / "Batch1" / "Trade.txt").is_file()

    # without the spark extra: one line that says what to install
    one_line_hint(run([sstore, "tpcdi", "run", "--mode", "spark", "--input", "data",
                       "--postgres", pg_url, "--schema", "no_spark"], work, env), SPARK_HINT)
    one_line_hint(run([sstore, "tpcdi", "demo", "--postgres", pg_url, "--workdir", "demo"],
                      work, env), SPARK_HINT)
    one_line_hint(run([sstore, "polystore", "calibrate", "--spark", "--postgres", pg_url,
                       "--rows", "1000", "--output", "costs.json"], work, env), SPARK_HINT)
    assert not (work / "costs.json").exists()
    # the benchmarks are not in the wheel: a copy of them beside it, matplotlib missing
    shutil.copytree(ROOT / "benchmarks", tmp_path / "bench" / "benchmarks",
                    ignore=shutil.ignore_patterns("results", "__pycache__"))
    one_line_hint(run([python, "-m", "benchmarks.union_plans", "--quick", "--no-spark",
                       "--postgres", pg_url], work,
                      {**env, "PYTHONPATH": str(tmp_path / "bench")}), BENCH_HINT)

    seconds = timed_pip_install(venv, f"{wheel}[spark]", work)
    print(f"[spark] extra installed in {seconds:.1f} s")
    t0 = time.perf_counter()
    ok(run([sstore, "tpcdi", "run", "--mode", "streaming", "--input", "data", "--postgres",
            pg_url, "--state", "state.duckdb"], work, env))
    ok(run([sstore, "tpcdi", "audit", "--postgres", pg_url, "--input", "data"], work, env))
    print(f"streaming run and audit at SF 0.01 in {time.perf_counter() - t0:.1f} s")
    ok(run([sstore, "polystore", "calibrate", "--postgres", pg_url, "--rows", "1000",
            "--output", "costs.json", "--catalog", "catalog.json"], work, env))
    costs = json.loads((work / "costs.json").read_text(encoding="utf-8"))
    assert not costs["measured"].startswith("defaults"), costs["measured"]
    assert costs["fixed"]["postgres"] > 0 and costs["fixed"]["streaming"] > 0, costs


def test_editable_install_reads_the_checkouts_schemas(tmp_path: Path) -> None:
    """``pip install -e`` (scripts/setup.sh, CI, the Docker image): ``sstore._schemas`` is the
    checkout's ``schemas/`` folder itself, so an edit there is what the code reads."""
    source = clean_copy(tmp_path / "src")
    work = tmp_path / "work"
    work.mkdir()
    venv = new_venv(tmp_path / "venv", work)
    seconds = timed_pip_install(venv, f"--editable={source}", work)
    print(f"\neditable install with dependencies in {seconds:.1f} s")
    ddl = source / "schemas" / "tpcc_orders.sql"
    ddl.write_text(ddl.read_text(encoding="utf-8") + "-- edited in the checkout\n",
                   encoding="utf-8")
    probe = ("import json, sstore._schemas; from sstore.base.resources import read_schema; "
             "print(json.dumps([list(sstore._schemas.__path__), read_schema('tpcc_orders')]))")
    folders, text = json.loads(ok(run([str(venv / "bin" / "python"), "-c", probe], work,
                                      outside_env(venv))).stdout)
    assert [Path(f).resolve() for f in folders] == [(source / "schemas").resolve()]
    assert text == ddl.read_text(encoding="utf-8")
