"""The migrating process killed with SIGKILL at random points: PostgreSQL ends up exact.

The real command line (`sstore migrate`) runs as a child process over a state file with
400 committed batches; it is killed at random moments and started again until it finishes.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
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


def watermark(con: psycopg.Connection) -> int:
    """The target's watermark (0 before the first run created it)."""
    try:
        row = con.execute("SELECT max(batch_id) FROM sstore.watermarks").fetchone()
    except psycopg.errors.UndefinedTable:
        return 0
    return int(row[0] or 0) if row else 0


def kill_mid_migration(proc: subprocess.Popen[bytes], con: psycopg.Connection,
                       rng: random.Random) -> bool:
    """SIGKILL ``proc`` at a random moment (0-30 ms) after it moved the watermark, so every kill
    lands in the middle of the migration whatever the machine's speed (a kill after a random
    wall-clock delay mostly hit the command still importing, and a fast machine finished the
    migration in fewer kills than the test asks for). False if it ended first."""
    before = watermark(con)
    deadline = time.monotonic() + 120
    while proc.poll() is None and watermark(con) <= before and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(rng.uniform(0.0, 0.03))
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return True


def test_sigkill_during_migration_neither_loses_nor_duplicates(tmp_path: Path,
                                                               pg_url: str) -> None:
    path = str(tmp_path / "events.duckdb")
    prepare(path)
    rng = random.Random(7)
    kills = 0
    with psycopg.connect(pg_url, autocommit=True) as probe:
        while True:
            proc = subprocess.Popen(migrate_cmd(path, pg_url), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
            if kills < 8 and kill_mid_migration(proc, probe, rng):
                kills += 1
                continue
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
            break
    assert kills == 8, f"the migration ended after {kills} kills: too little work for 8 kills"
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
