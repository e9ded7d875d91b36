"""Dropping a warehouse also forgets the sinks' watermarks of its tables."""

from __future__ import annotations

import psycopg

from migrators.watermarks import ensure_watermarks
from sstore.workloads.tpcdi.warehouse import create_warehouse, drop_warehouse


def test_drop_warehouse_forgets_its_watermarks(pg_url: str) -> None:
    create_warehouse(pg_url, "wh_a")
    create_warehouse(pg_url, "wh_b")
    with psycopg.connect(pg_url) as con:
        ensure_watermarks(con)
        for target in ("wh_a.dimtrade", "wh_a.dimessages", "wh_b.dimtrade"):
            con.execute("INSERT INTO sstore.watermarks (source, stream, target, batch_id) "
                        "VALUES ('engine', 's', %s, 42)", (target,))
    drop_warehouse(pg_url, "wh_a")
    with psycopg.connect(pg_url) as con:
        left = con.execute("SELECT target FROM sstore.watermarks ORDER BY target").fetchall()
        schemas = con.execute("SELECT schema_name FROM information_schema.schemata WHERE "
                              "schema_name LIKE 'wh_%' ORDER BY 1").fetchall()
    assert left == [("wh_b.dimtrade",)]
    assert schemas == [("wh_b",)]
