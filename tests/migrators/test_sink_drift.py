"""Issue 38, step 4: a sink fails closed on silent drift.

Each start records a fingerprint of the stream's schema version, the sink's query (mode, key,
batch column) and the target's layout with the watermark; the next start compares. An allowed
evolution passes (tests/migrators/test_warehouse_follows.py); these changes are errors naming what
changed, with nothing written."""

from __future__ import annotations

import shutil
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from migrators import StreamToPostgres
from migrators.drift import DriftError
from sstore import Engine

V1 = {"id": "INTEGER", "amount": "DECIMAL(10,2)"}


def pg(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as con:
        cur = con.execute(sql)
        return cur.fetchall() if cur.description else []


def deliver(path: str, url: str, columns: dict, batch: tuple | None = None,
            **sink: object) -> int:
    with Engine(path) as engine:
        engine.stream("orders", columns)
        target = StreamToPostgres(engine, "orders", url, "orders", **sink)  # type: ignore[arg-type]
        if batch is not None:
            engine.ingest("orders", [batch])
        try:
            return target.run_pending()
        finally:
            target.close()


def test_a_state_file_restored_from_an_older_copy_is_refused(tmp_path: Path,
                                                              pg_url: str) -> None:
    path, old = str(tmp_path / "s.duckdb"), str(tmp_path / "old.duckdb")
    deliver(path, pg_url, V1, (1, Decimal("1.50")))
    shutil.copy(path, old)
    deliver(path, pg_url, {**V1, "note": "VARCHAR"}, (2, Decimal("2.50"), "x"))
    deliver(path, pg_url, {**V1, "note": "VARCHAR"})  # the evolution was allowed
    shutil.copy(old, path)  # the older copy, same identity, back in place
    with pytest.raises(DriftError, match=r"the stream changed since this sink last started, "
                                         r"and no recorded evolution leads there: it "
                                         r"delivered version 2 .*now has version 1"):
        deliver(path, pg_url, V1, (2, Decimal("9.99")))
    assert pg(pg_url, "SELECT id FROM orders ORDER BY id") == [(1,), (2,)]


def test_another_mode_on_the_same_target_is_refused(state_path: str, pg_url: str) -> None:
    deliver(state_path, pg_url, V1, (1, Decimal("1.50")))
    with pytest.raises(DriftError, match=r"the sink's query changed since it last started "
                                         r"\(key \[\] -> \['id'\]; mode 'append' -> 'merge'\)"):
        deliver(state_path, pg_url, V1, (2, Decimal("2.50")), mode="merge", key=("id",))
    assert pg(pg_url, "SELECT count(*) FROM orders") == [(1,)]
    assert deliver(state_path, pg_url, V1) == 1  # as before: carries on


def test_a_target_column_dropped_and_added_again_is_refused(state_path: str,
                                                            pg_url: str) -> None:
    deliver(state_path, pg_url, V1, (1, Decimal("1.50")))
    pg(pg_url, "ALTER TABLE orders DROP COLUMN amount")
    pg(pg_url, "ALTER TABLE orders ADD COLUMN amount numeric(10,2)")
    with pytest.raises(DriftError, match=r"column 'amount' of the target was dropped and added "
                                         r"again .*position 2 -> 3"):
        deliver(state_path, pg_url, V1, (2, Decimal("2.50")))
    assert pg(pg_url, "SELECT id, amount FROM orders") == [(1, None)]


def test_a_column_widened_by_hand_or_a_recreated_target_is_no_drift(state_path: str,
                                                                    pg_url: str) -> None:
    deliver(state_path, pg_url, V1, (1, Decimal("1.50")))
    pg(pg_url, "ALTER TABLE orders ALTER COLUMN id TYPE bigint")
    assert deliver(state_path, pg_url, V1, (2, Decimal("2.50"))) == 1
    pg(pg_url, "DROP TABLE orders")
    deliver(state_path, pg_url, V1)  # recreated: starts over, its layout is new
    assert pg(pg_url, "SELECT count(*) FROM orders") in ([(1,)], [(2,)])
