"""Landing files (sstore.sources.files, `sstore source files`): each complete file exactly once,
in name order, recorded with its batch; a changed file is an error; a half-written one waits."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sstore import Engine
from sstore.sources import FileChangedError, FileSource, SourceError, feed, forget
from sstore.sources.files import writer_open

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = {"id": "INTEGER", "name": "VARCHAR", "day": "DATE"}


def program(path: str, *, seen: list[int] | None = None) -> Engine:
    """The program that owns the state: a stream fed by files and a procedure reading it."""
    eng = Engine(path)
    eng.stream("trades", COLUMNS)

    @eng.procedure(input="trades", output="ids")
    def count(tx, batch):
        if seen is not None:
            seen.append(tx.batch_id)
        return tx.sql("SELECT id FROM batch")

    return eng


def land(folder: Path, name: str, rows: list[tuple[int, str, str]], *,
         header: str = "id,name,day") -> Path:
    """Write a file under a temporary name and rename it into place (the safe way)."""
    text = header + "\n" + "".join(f"{i},{n},{d}\n" for i, n, d in rows)
    part = folder / f".{name}.part"
    part.write_text(text)
    os.rename(part, folder / name)
    return folder / name


def stored(path: str) -> list[tuple[int, int]]:
    with Engine.open_existing(path) as eng:
        return [(r["_batch_id"], r["id"]) for r in
                eng.query("SELECT _batch_id, id FROM trades ORDER BY id").to_pylist()]


def taken(path: str) -> list[tuple[str, int, int, str]]:
    with Engine.open_existing(path) as eng:
        return [(r["name"], r["batch_id"], r["rows"], r["digest"]) for r in eng.query(
            "SELECT name, batch_id, rows, digest FROM sstore_sources.files ORDER BY batch_id"
        ).to_pylist()]


def test_each_file_once_in_name_order_with_its_record(tmp_path: Path, state_path: str) -> None:
    folder = tmp_path / "landing"
    folder.mkdir()
    land(folder, "b2.csv", [(3, "c", "2024-01-03")])
    land(folder, "b1.csv", [(1, "a", "2024-01-01"), (2, "", "2024-01-02")])
    (folder / "notes.txt").write_text("not a landing file\n")
    (folder / ".b0.csv").write_text("id,name,day\n99,x,2024-01-01\n")  # hidden: never taken
    seen: list[int] = []
    with program(state_path, seen=seen) as eng:
        report = feed(eng, FileSource(str(folder), "*.csv", settle=0), "trades",
                      until_idle=True, poll=0.05)
        assert (report.batches, report.rows, report.position) == (2, 3, 2)
        assert seen == [1, 2]  # the program's procedure ran on each batch before the next
        rows = eng.query("SELECT id, name FROM trades ORDER BY id").to_pylist()
        assert rows == [{"id": 1, "name": "a"}, {"id": 2, "name": None}, {"id": 3, "name": "c"}]
    expected = [(name, batch, count, hashlib.sha256((folder / name).read_bytes()).hexdigest())
                for name, batch, count in (("b1.csv", 1, 2), ("b2.csv", 2, 1))]
    assert taken(state_path) == expected
    # run again, then land another: only the new file is taken, as batch 3
    land(folder, "b3.csv", [(4, "d", "2024-01-04")])
    os.rename(folder / "b1.csv", folder / "b1.csv.done")  # taken files may move away
    with program(state_path) as eng:
        report = feed(eng, FileSource(str(folder), "*.csv", settle=0), "trades",
                      until_idle=True, poll=0.05)
    assert (report.batches, report.position) == (1, 3)
    assert stored(state_path) == [(1, 1), (1, 2), (2, 3), (3, 4)]


def test_a_file_changed_after_it_was_taken_is_an_error(tmp_path: Path, state_path: str) -> None:
    folder = tmp_path / "landing"
    folder.mkdir()
    first = land(folder, "b1.csv", [(1, "a", "2024-01-01")])
    with program(state_path) as eng:
        feed(eng, FileSource(str(folder), settle=0), "trades", until_idle=True, poll=0.05)
    before = first.read_bytes()
    os.utime(first, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched: the same rows
    land(folder, "b2.csv", [(2, "b", "2024-01-02")])
    with program(state_path) as eng:
        assert feed(eng, FileSource(str(folder), settle=0), "trades", until_idle=True,
                    poll=0.05).batches == 1
    first.write_bytes(before.replace(b"1,a", b"7,z"))  # same size, other rows
    land(folder, "b3.csv", [(3, "c", "2024-01-03")])
    with program(state_path) as eng, pytest.raises(FileChangedError, match="b1.csv changed"):
        feed(eng, FileSource(str(folder), settle=0), "trades", until_idle=True, poll=0.05)
    assert stored(state_path) == [(1, 1), (2, 2)]  # nothing of the rewrite, nor after it
    first.write_bytes(before)  # put back what was taken: the source goes on
    with program(state_path) as eng:
        assert feed(eng, FileSource(str(folder), settle=0), "trades", until_idle=True,
                    poll=0.05).batches == 1
    assert stored(state_path) == [(1, 1), (2, 2), (3, 3)]


def test_a_half_written_file_is_not_taken(tmp_path: Path, state_path: str) -> None:
    folder = tmp_path / "landing"
    folder.mkdir()
    land(folder, "b1.csv", [(1, "a", "2024-01-01")])
    writing = open(folder / "b2.csv", "w")  # noqa: SIM115 - a writer that keeps it open
    writing.write("id,name,day\n2,b,2024-01-02\n3,c,")  # half a row so far
    writing.flush()
    land(folder, "b3.csv", [(4, "d", "2024-01-04")])
    assert writer_open(str(folder / "b2.csv")) is True
    assert writer_open(str(folder / "b1.csv")) is False
    with program(state_path) as eng:
        report = feed(eng, FileSource(str(folder), settle=0), "trades", until_idle=True,
                      poll=0.05)
    assert report.batches == 1  # b1 only: b2 is open for writing, and b3 waits behind it
    writing.write("2024-01-03\n")
    writing.close()
    with program(state_path) as eng:
        report = feed(eng, FileSource(str(folder), settle=0), "trades", until_idle=True,
                      poll=0.05)
    assert report.batches == 2
    assert stored(state_path) == [(1, 1), (2, 2), (2, 3), (3, 4)]
    assert [name for name, *_ in taken(state_path)] == ["b1.csv", "b2.csv", "b3.csv"]


def test_a_file_still_changing_waits_for_the_settle_time(tmp_path: Path,
                                                          state_path: str) -> None:
    """Without the kernel's word (a writer that closes and reopens), size and time must hold
    still for ``settle`` seconds: a writer appending every 0.1 s is not taken before it ends."""
    folder = tmp_path / "landing"
    folder.mkdir()
    path = folder / "b1.csv"
    path.write_text("id,name,day\n")

    def append() -> None:
        for i in range(1, 8):
            time.sleep(0.1)
            with open(path, "a") as f:
                f.write(f"{i},n,2024-01-01\n")

    writer = threading.Thread(target=append)
    writer.start()
    with program(state_path) as eng:
        report = feed(eng, FileSource(str(folder), settle=0.5), "trades", until_idle=True,
                      poll=0.05)
    writer.join()
    assert report.batches == 1 and report.rows == 7  # waited for the whole file


def test_a_file_that_cannot_be_read_stops_the_source_untaken(tmp_path: Path,
                                                              state_path: str) -> None:
    folder = tmp_path / "landing"
    folder.mkdir()
    land(folder, "b1.csv", [(1, "a", "2024-01-01")])
    land(folder, "b2.csv", [(2, "b", "2024-13-45")])  # no such day
    land(folder, "b3.csv", [(3, "c", "2024-01-03")])
    with program(state_path) as eng, pytest.raises(SourceError, match="b2.csv.*day.*not taken"):
        feed(eng, FileSource(str(folder), settle=0), "trades", until_idle=True, poll=0.05)
    assert stored(state_path) == [(1, 1)]
    land(folder, "b2.csv", [(2, "b", "2024-12-25")])  # fixed before it was taken: fine
    with program(state_path) as eng:
        feed(eng, FileSource(str(folder), settle=0), "trades", until_idle=True, poll=0.05)
    assert stored(state_path) == [(1, 1), (2, 2), (3, 3)]


def test_a_stream_has_one_source(tmp_path: Path, state_path: str) -> None:
    folder, other = tmp_path / "landing", tmp_path / "other"
    folder.mkdir()
    other.mkdir()
    land(folder, "b1.csv", [(1, "a", "2024-01-01")])
    with program(state_path) as eng:
        feed(eng, FileSource(str(folder), settle=0), "trades", until_idle=True, poll=0.05)
        with pytest.raises(SourceError, match="fed by the files source"):
            feed(eng, FileSource(str(other), settle=0), "trades", until_idle=True)
        assert forget(eng, "trades")
        # forgotten: a new source starts at position 0, whose batch-id 1 the stream holds
        land(other, "a1.csv", [(5, "e", "2024-01-05")])
        with pytest.raises(SourceError, match="another feeder"):
            feed(eng, FileSource(str(other), settle=0), "trades", until_idle=True, poll=0.05)


# ------------------------------------------------------------------ SIGKILL, a real process
def cli(state: str, folder: Path, env: dict[str, str] | None = None,
        ) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sstore.cli", "source", "files", state, "--dir", str(folder),
         "--pattern", "*.csv", "--stream", "trades", "--settle", "0", "--poll", "0.05",
         "--until-idle"],
        cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)


def test_sigkill_anywhere_then_restart_takes_every_file_exactly_once(
        tmp_path: Path, state_path: str) -> None:
    folder = tmp_path / "landing"
    folder.mkdir()
    with program(state_path) as eng:
        eng.run_until_idle()  # the program ran once: the state file knows the stream
    files = 24
    for n in range(1, files + 1):
        land(folder, f"batch{n:03d}.csv", [(n * 10 + k, f"r{k}", "2024-02-01")
                                          for k in range(n % 4)])  # some are empty
    kills = ["ingest.before_commit:3", "source.after_commit:2", "ingest.after_commit:4"]
    for spec in kills:  # killed at a protocol step each
        proc = cli(state_path, folder, {"SSTORE_CRASH_AT": spec})
        proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, spec
    for delay in (0.4, 0.7):  # and wherever a timer lands
        proc = cli(state_path, folder)
        time.sleep(delay)
        proc.kill()
        proc.communicate(timeout=60)
    proc = cli(state_path, folder)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    expected = sorted((n, n * 10 + k) for n in range(1, files + 1) for k in range(n % 4))
    assert stored(state_path) == expected  # every row once, in its file's batch
    assert [(name, batch) for name, batch, *_ in taken(state_path)] == \
        [(f"batch{n:03d}.csv", n) for n in range(1, files + 1)]
    with Engine.open_existing(state_path) as eng:
        assert eng.query_rows("SELECT position, batches FROM sstore_sources.positions")[1] == \
            [(files, files)]


def test_cli_errors_are_one_line(tmp_path: Path, state_path: str) -> None:
    folder = tmp_path / "landing"
    folder.mkdir()
    proc = cli(state_path, folder)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and b"no state file" in err
    with Engine(state_path) as eng:
        eng.run_until_idle()
    proc = cli(state_path, folder)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and b"no border stream 'trades'" in err
    assert b"Traceback" not in err


def test_source_status_and_drop(tmp_path: Path, state_path: str) -> None:
    from click.testing import CliRunner

    from sstore.cli.app import main

    folder = tmp_path / "landing"
    folder.mkdir()
    land(folder, "b1.csv", [(1, "a", "2024-01-01")])
    with program(state_path) as eng:
        eng.run_until_idle()
    runner = CliRunner()
    assert "no stream is fed by a source" in runner.invoke(
        main, ["source", "status", state_path]).output
    done = runner.invoke(main, ["source", "files", state_path, "--dir", str(folder),
                                "--stream", "trades", "--settle", "0", "--until-idle"])
    assert done.exit_code == 0 and "1 batch(es), 1 row(s)" in done.output, done.output
    shown = runner.invoke(main, ["source", "status", state_path, "--json"])
    assert '"position": 1' in shown.output and '"kind": "files"' in shown.output
    dropped = runner.invoke(main, ["source", "drop", state_path, "--stream", "trades"])
    assert dropped.exit_code == 0 and "dropped the source of 'trades'" in dropped.output
    assert "no stream is fed" in runner.invoke(main, ["source", "status", state_path]).output
    assert taken(state_path) == []
    assert stored(state_path) == [(1, 1)]  # the batches stay


def test_following_until_ctrl_c_stops_cleanly(tmp_path: Path, state_path: str) -> None:
    """Without --until-idle the command follows the folder; SIGINT ends it between batches
    (exit 130), and a file landed while it follows is taken."""
    folder = tmp_path / "landing"
    folder.mkdir()
    with program(state_path) as eng:
        eng.run_until_idle()
    land(folder, "b1.csv", [(1, "a", "2024-01-01")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "sstore.cli", "-v", "source", "files", state_path, "--dir",
         str(folder), "--stream", "trades", "--settle", "0", "--poll", "0.05"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    seen = b""

    def wait_for(expected: bytes) -> None:
        nonlocal seen
        while expected not in seen:
            line = proc.stderr.readline()  # type: ignore[union-attr]
            assert line, seen.decode()
            seen += line

    wait_for(b"batch 1 committed")
    land(folder, "b2.csv", [(2, "b", "2024-01-02")])  # lands while it follows
    wait_for(b"batch 2 committed")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    err = seen + err
    assert proc.returncode == 130, err.decode()
    assert b"every committed batch is safe" in err and b"Traceback" not in err
    assert stored(state_path) == [(1, 1), (2, 2)]


def test_headerless_pipe_separated_files_as_tpcdi_lands_them(tmp_path: Path,
                                                             state_path: str) -> None:
    """TPC-DI's incremental Trade.txt: '|'-separated, no header, CDC_FLAG and CDC_DSN first."""
    folder = tmp_path / "landing"
    folder.mkdir()
    (folder / ".batch002_trade.txt").write_text(
        "I|1|7|2017-07-12 10:00:01|SBMT|TMB|1|BIG|100|12.50|3||||\n"
        "U|2|5|2017-07-12 10:00:02|CMPT|TLS|0|SML|20|9.75|4|10.00|1.25|0.20|3.10\n")
    os.rename(folder / ".batch002_trade.txt", folder / "batch002_trade.txt")
    eng = Engine(state_path)
    eng.stream("trade", {"cdc_flag": "VARCHAR", "cdc_dsn": "BIGINT", "t_id": "BIGINT",
                         "t_dts": "TIMESTAMP", "t_st_id": "VARCHAR", "t_tt_id": "VARCHAR",
                         "t_is_cash": "TINYINT", "t_s_symb": "VARCHAR", "t_qty": "INTEGER",
                         "t_bid_price": "DECIMAL(8,2)", "t_ca_id": "BIGINT",
                         "t_exec_name": "VARCHAR", "t_trade_price": "DECIMAL(8,2)",
                         "t_chrg": "DECIMAL(10,2)", "t_comm": "DECIMAL(10,2)"})
    with eng:
        feed(eng, FileSource(str(folder), "batch*_trade.txt", settle=0, delimiter="|",
                             header=False), "trade", until_idle=True, poll=0.05)
        rows = eng.query("SELECT t_id, t_is_cash, t_bid_price, t_exec_name, t_comm "
                         "FROM trade ORDER BY t_id").to_pylist()
    assert [(r["t_id"], r["t_is_cash"], str(r["t_bid_price"]), r["t_exec_name"],
             r["t_comm"] and str(r["t_comm"])) for r in rows] == [
        (5, 0, "9.75", "10.00", "3.10"), (7, 1, "12.50", None, None)]
