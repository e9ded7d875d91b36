"""Dataflow graphs used by several tests, declared the way a user program would.

``ordered_graph`` records every transaction execution in ``te_log`` (inside the execution's own
transaction, so the log is exactly the set of committed executions, in commit order).
"""

from __future__ import annotations

from sstore import Engine


def te_logging(engine: Engine) -> None:
    engine.execute("CREATE SEQUENCE IF NOT EXISTS te_seq")
    engine.execute("CREATE TABLE IF NOT EXISTS te_log (seq BIGINT, proc VARCHAR, batch_id BIGINT,"
                   " n BIGINT)")


def log_te(tx, name: str, n: int) -> None:
    tx.execute("INSERT INTO te_log VALUES (nextval('te_seq'), ?, ?, ?)", name, tx.batch_id, n)


def ordered_graph(engine: Engine) -> dict[str, list[str]]:
    """A fan-out and fan-in graph over two border streams.

        a ──▶ split ──▶ evens ──▶ double ──▶ doubled ─┐
                   └──▶ odds ───▶ triple ──▶ tripled ─┴─▶ merge ──▶ merged
        b ─────────────────────────────────────────────────▶ merge (third input)

    Returns each procedure's upstream procedures (for the ordering checker).
    """
    te_logging(engine)
    engine.stream("a", {"x": "BIGINT"})
    engine.stream("b", {"x": "BIGINT"})
    engine.stream("evens", {"x": "BIGINT"})
    engine.stream("odds", {"x": "BIGINT"})
    engine.stream("doubled", {"x": "BIGINT"})
    engine.stream("tripled", {"x": "BIGINT"})
    engine.execute("CREATE TABLE IF NOT EXISTS merged_total (src VARCHAR PRIMARY KEY, s BIGINT)")

    @engine.procedure(input="a", output=["evens", "odds"])
    def split(tx, batch):
        log_te(tx, "split", batch.num_rows)
        return {"evens": tx.sql("SELECT x FROM batch WHERE x % 2 = 0"),
                "odds": tx.sql("SELECT x FROM batch WHERE x % 2 = 1")}

    @engine.procedure(input="evens", output="doubled")
    def double(tx, batch):
        log_te(tx, "double", batch.num_rows)
        return tx.sql("SELECT x * 2 AS x FROM batch")

    @engine.procedure(input="odds", output="tripled")
    def triple(tx, batch):
        log_te(tx, "triple", batch.num_rows)
        return tx.sql("SELECT x * 3 AS x FROM batch")

    @engine.procedure(input=["doubled", "tripled", "b"], output="merged")
    def merge(tx, batches):
        n = sum(t.num_rows for t in batches.values())
        log_te(tx, "merge", n)
        tx.execute("""
            INSERT INTO merged_total
            SELECT src, sum(x) FROM (
                SELECT 'doubled' AS src, x FROM doubled_batch UNION ALL
                SELECT 'tripled', x FROM tripled_batch UNION ALL
                SELECT 'b', x FROM b_batch) GROUP BY src
            ON CONFLICT (src) DO UPDATE SET s = merged_total.s + excluded.s""")
        return tx.sql("SELECT ?::BIGINT AS batch_id, ?::BIGINT AS n", tx.batch_id, n)

    return {"split": [], "double": ["split"], "triple": ["split"],
            "merge": ["double", "triple"]}


def check_order(rows: list[tuple[int, str, int]], upstream: dict[str, list[str]]) -> None:
    """Fail on any ordering violation in (seq, proc, batch_id) rows of committed executions.

    1. Per procedure, batch-ids strictly increase in commit order, and no batch runs twice.
    2. Per batch, every upstream procedure that ran it committed before the downstream one.
    """
    rows = sorted(rows)
    last: dict[str, int] = {}
    committed_at: dict[tuple[str, int], int] = {}
    for seq, proc, batch_id in rows:
        assert batch_id > last.get(proc, 0), \
            f"{proc} ran batch {batch_id} after batch {last.get(proc)}"
        last[proc] = batch_id
        committed_at[(proc, batch_id)] = seq
    for (proc, batch_id), seq in committed_at.items():
        for up in upstream[proc]:
            if (up, batch_id) in committed_at:
                assert committed_at[(up, batch_id)] < seq, \
                    f"{proc} committed batch {batch_id} before its upstream {up}"
