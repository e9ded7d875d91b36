"""``benchmarks.tpcdi_spread`` measures formulations of SP5's write that must leave the same
DimTrade (all but ``merge-4-columns``, which updates fewer columns on purpose)."""

from __future__ import annotations

from pathlib import Path

import duckdb

from benchmarks import tpcdi_spread


def dimtrade(path: Path) -> list[tuple[object, ...]]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute("SELECT * FROM dimtrade ORDER BY tradeid").fetchall()


def test_the_formulations_leave_the_same_dimtrade(tmp_path: Path) -> None:
    tables = {}
    for name, write in tpcdi_spread.FORMULATIONS.items():
        path = tmp_path / f"{name}.duckdb"
        seconds = tpcdi_spread.run_case(str(path), write, reach=3_000, batches=6, seed=7,
                                        storage=tpcdi_spread.STORAGE.get(name))
        assert len(seconds) == 6 and all(s > 0 for s in seconds)
        tables[name] = dimtrade(path)
    reference = tables.pop("merge-returning")
    assert len(reference) == tpcdi_spread.INITIAL_ROWS + 6 * tpcdi_spread.INSERTS
    assert sum(1 for row in reference if row[6] == "Completed") >= tpcdi_spread.UPDATES
    assert tables.pop("merge-4-columns") != reference  # fewer columns: it must differ
    for name, rows in tables.items():
        assert rows == reference, name


def test_storage_reaches_the_table(tmp_path: Path) -> None:
    path = tmp_path / "plain.duckdb"
    name = "merge-returning-plain-executedby"
    tpcdi_spread.run_case(str(path), tpcdi_spread.FORMULATIONS[name], reach=3_000, batches=2,
                          seed=7, storage=tpcdi_spread.STORAGE[name])
    with duckdb.connect(str(path), read_only=True) as con:
        sql = con.execute("SELECT sql FROM duckdb_tables() WHERE table_name = 'dimtrade'"
                          ).fetchone()[0]
    assert "executedby VARCHAR USING COMPRESSION Uncompressed" in sql
    assert "tradeid BIGINT PRIMARY KEY" in sql
