"""The migrating process killed with SIGKILL at random points: PostgreSQL ends up exact.

The real command line (`sstore migrate`) runs as a child process over a state file with
400 committed batches; it is killed at random moments and started again until it finishes.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pyarrow as pa

from sstore import Engine

BATCHES, ROWS = 400, 500
SSTORE = str(Path(sys.executable).with_name("sstore"))


def prepare(path: str) -> None:
    eng = Engine(path)
    eng.stream("events", {"id": "BIGINT", "kind": "VARCHAR", "amount": "DOUBLE"})
    eng.hold("events", "migrator:public.events")  # as the first `sstore migrate` would
    for b in range(BATCHES):
        ids = range(b * ROWS, (b + 1) * ROWS)
        eng.ingest("events", pa.table({"id": pa.array(ids, pa.int64()),
                                       "kind": [f"k{i % 5}" for i in ids],
                                       "amount": [i * 0.25 for i in ids]}))
    eng.close()


def migrate_cmd(path: str, url: str) -> list[str]:
    return [SSTORE, "migrate", path, "--stream", "events", "--postgres", url,
            "--table", "public.events", "--chunk-rows", "500"]


def test_sigkill_during_migration_neither_loses_nor_duplicates(tmp_path: Path,
                                                               pg_url: str) -> None:
    path = str(tmp_path / "events.duckdb")
    prepare(path)
    rng = random.Random(7)
    kills = 0
    while True:
        proc = subprocess.Popen(migrate_cmd(path, pg_url), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            proc.wait(timeout=rng.uniform(0.3, 1.0) if kills < 8 else 120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            continue
        out, err = proc.communicate()
        assert proc.returncode == 0, err.decode()
        break
    assert kills >= 5
    with psycopg.connect(pg_url) as con:
        count, distinct, total = con.execute(
            "SELECT count(*), count(DISTINCT id), sum(amount) FROM public.events").fetchone()
        watermark = con.execute("SELECT batch_id FROM sstore.watermarks").fetchone()[0]
    n = BATCHES * ROWS
    assert (count, distinct, watermark) == (n, n, BATCHES)
    assert total == sum(i * 0.25 for i in range(n))
    # and the engine heard back: every batch is acknowledged, so collectable
    eng = Engine.open_existing(path)
    assert eng.acknowledged("migrator:public.events") == BATCHES
    eng.close()


def test_cli_merge_mode_and_errors(tmp_path: Path, pg_url: str) -> None:
    path = str(tmp_path / "s.duckdb")
    eng = Engine(path)
    eng.stream("accounts", {"id": "INTEGER", "status": "VARCHAR"})
    eng.ingest("accounts", [(1, "open"), (2, "open")])
    eng.ingest("accounts", [(1, "closed")])
    eng.close()
    cmd = [SSTORE, "migrate", path, "--stream", "accounts", "--postgres", pg_url, "--table",
           "dw.accounts", "--mode", "merge", "--key", "id"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Moved 2 rows in 2 batches" in done.stdout
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT id, status FROM dw.accounts ORDER BY id").fetchall() == [
            (1, "closed"), (2, "open")]
    bad = subprocess.run(cmd[:-4] + ["--mode", "merge"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1 and "merge mode needs key columns" in bad.stderr
    missing = subprocess.run([SSTORE, "migrate", str(tmp_path / "none.duckdb"), "--stream", "x",
                              "--postgres", pg_url, "--table", "t"], capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 1 and "no state file" in missing.stderr
