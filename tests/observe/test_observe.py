"""A running engine is observable: commit times, dataflow order, /metrics, /status.

Real engines on real state files, served on real loopback ports and read over HTTP; the
Prometheus text is parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from sstore import Engine, observe
from sstore.base import allocator
from sstore.cli import main
from sstore.observe import live
from sstore.observe.server import ServeError
from sstore.storage.status import status_of_file
from tests.observe_flow import (
    DATAFLOW,
    INPUTS,
    PROCEDURES,
    ROWS_PER_BATCH,
    declare_flow,
    feed,
)

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy


def get(url: str, timeout: float = 10.0) -> bytes:
    with OPENER.open(url, timeout=timeout) as response:
        return response.read()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    text = get(url + "metrics").decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def listening_ports() -> set[int]:
    """TCP ports this process listens on (from /proc: the sockets among its own fds)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def assert_dataflow_order(names: list[str], inputs: dict[str, list[str]]) -> None:
    """Each node comes after every node it reads from."""
    position = {name: i for i, name in enumerate(names)}
    for name, ups in inputs.items():
        for up in ups:
            assert position[up] < position[name], f"{up} should come before {name}: {names}"


# -- commit times ---------------------------------------------------------------------------
def test_commits_record_when_they_happened(state_path: str) -> None:
    before = datetime.datetime.now(datetime.UTC)
    with Engine(state_path) as eng:
        declare_flow(eng)
        feed(eng, 3)
        after = datetime.datetime.now(datetime.UTC)
        times = eng.query("SELECT node, batch_id, epoch(committed_at) AS t "
                          "FROM sstore_sys.commits").to_pylist()
        status = eng.status()
    assert times and all(r["t"] is not None for r in times)
    for r in times:
        assert before.timestamp() - 1 <= r["t"] <= after.timestamp() + 1, r
    for p in status.procedures:
        at = datetime.datetime.fromisoformat(p.last_commit_at or "")
        assert before - datetime.timedelta(seconds=1) <= at <= after, p
    # the file alone says the same, read-only
    again = {p.name: p.last_commit_at for p in status_of_file(state_path).procedures}
    assert again == {p.name: p.last_commit_at for p in status.procedures}


def test_an_older_state_file_gains_commit_times_and_keeps_old_ones_unknown(
        state_path: str) -> None:
    with Engine(state_path) as eng:
        declare_flow(eng)
        feed(eng, 2)
    con = duckdb.connect(state_path)  # the file as an sstore without commit times left it
    con.execute("ALTER TABLE sstore_sys.commits DROP COLUMN committed_at")
    con.close()
    old = status_of_file(state_path)  # read-only: works, times unknown, file not changed
    assert [p.last_batch for p in old.procedures] == [2, 2, 2, 2]
    assert all(p.last_commit_at is None for p in old.procedures)
    con = duckdb.connect(state_path, read_only=True)
    assert "committed_at" not in [c[0] for c in con.execute(
        "DESCRIBE sstore_sys.commits").fetchall()]
    con.close()
    with Engine(state_path) as eng:  # opening it for writing adds the column
        declare_flow(eng)
        feed(eng, 1, first=3)
        rows = eng.query("SELECT batch_id, committed_at IS NULL AS unknown FROM "
                         "sstore_sys.commits WHERE node = 'zz_raw' ORDER BY batch_id")
    assert rows.to_pylist() == [{"batch_id": 1, "unknown": True},
                                {"batch_id": 2, "unknown": True},
                                {"batch_id": 3, "unknown": False}]
    new = status_of_file(state_path)
    assert all(p.last_batch == 3 and p.last_commit_at for p in new.procedures)


# -- dataflow order -------------------------------------------------------------------------
def test_status_lists_procedures_and_streams_in_dataflow_order(state_path: str) -> None:
    with Engine(state_path) as eng:
        declare_flow(eng)
        feed(eng, 2)
        live_order = [p.name for p in eng.status().procedures]
        streams = [s.name for s in eng.status().streams]
    assert live_order == PROCEDURES
    assert streams == [n for n in DATAFLOW if n not in PROCEDURES]
    assert [p.name for p in status_of_file(state_path).procedures] == PROCEDURES
    text = CliRunner().invoke(main, ["status", state_path]).output
    shown = [line.split()[0] for line in text.splitlines()
             if line.split() and line.split()[0] in PROCEDURES]
    assert shown[:4] == PROCEDURES and shown[4:8] == PROCEDURES  # Dataflow, then Progress
    assert "ago)" in text  # the last commit of each procedure, with how long ago


# -- nothing unless asked -------------------------------------------------------------------
def test_nothing_serves_or_counts_unless_asked(state_path: str) -> None:
    ports = listening_ports()
    with Engine(state_path) as eng:
        declare_flow(eng)
        feed(eng, 2)
        assert observe.serving_url(eng) is None
        assert eng.runtime is not None and eng.runtime.observers == []  # no metrics observer
        assert listening_ports() == ports
        assert not os.path.exists(live.discovery_path(state_path))
    result = CliRunner().invoke(main, ["demo", "--votes", "300", "--batch-size", "100",
                                       "--state", state_path + ".voter"])
    assert result.exit_code == 0, result.output
    assert "Live status" not in result.output
    assert listening_ports() == ports


# -- /metrics --------------------------------------------------------------------------------
def test_metrics_match_what_the_engine_did(state_path: str) -> None:
    with Engine(state_path) as eng:
        declare_flow(eng, halt_at=4)
        url = observe.serve(eng, 0)
        feed(eng, 6)
        m = scrape(url)
        for name in ("z_parse", "b_enrich", "a_total"):
            assert sample(m, "sstore_procedure_batches_committed_total", procedure=name) == 6
            assert sample(m, "sstore_procedure_last_batch", procedure=name) == 6
            assert sample(m, "sstore_procedure_pending_batches", procedure=name) == 0
            assert sample(m, "sstore_procedure_halted", procedure=name) == 0
            assert sample(m, "sstore_procedure_te_seconds_count", procedure=name) == 6
            assert sample(m, "sstore_procedure_te_seconds_sum", procedure=name) > 0
        # y_watch halted at batch 4: 3 committed, batches 4-6 of its window wait
        assert sample(m, "sstore_procedure_batches_committed_total", procedure="y_watch") == 3
        assert sample(m, "sstore_procedure_halted", procedure="y_watch") == 1
        assert sample(m, "sstore_procedure_pending_batches", procedure="y_watch") == 3
        # rows: z_parse reads 3 a batch and drops the negative one
        assert sample(m, "sstore_procedure_rows_in_total", procedure="z_parse") == \
            6 * ROWS_PER_BATCH
        assert sample(m, "sstore_procedure_rows_out_total", procedure="z_parse") == \
            6 * (ROWS_PER_BATCH - 1)
        assert sample(m, "sstore_stream_batches_ingested_total", stream="zz_raw",
                      kind="border") == 6
        assert sample(m, "sstore_stream_last_batch", stream="k_enriched", kind="derived") == 6
        kept = eng.query("SELECT count(*) AS n FROM m_clean").column("n")[0].as_py()
        assert sample(m, "sstore_stream_retained_rows", stream="m_clean", kind="derived") == kept
        assert sample(m, "sstore_stream_holders", stream="m_clean", kind="derived") == 1
        assert sample(m, "sstore_engine_stale") == 0
        assert sample(m, "sstore_checkpoints_total") == 0  # far below the WAL limit
        assert sample(m, "sstore_wal_bytes") > 0
        info = [k for k in m if k[0] == "sstore_engine_info"]
        assert dict(info[0][1])["engine_id"] == eng.engine_id
        assert dict(info[0][1])["malloc"] == allocator.in_use()  # pytest itself: no re-exec


def test_two_engines_in_one_process_keep_their_numbers_apart(tmp_path: Path) -> None:
    with Engine(str(tmp_path / "a.duckdb")) as a, Engine(str(tmp_path / "b.duckdb")) as b:
        declare_flow(a)
        declare_flow(b)
        url_a, url_b = observe.serve(a, 0), observe.serve(b, 0)
        assert url_a != url_b
        feed(a, 2)
        feed(b, 5)
        assert sample(scrape(url_a), "sstore_procedure_batches_committed_total",
                      procedure="z_parse") == 2
        assert sample(scrape(url_b), "sstore_procedure_batches_committed_total",
                      procedure="z_parse") == 5


def test_serving_twice_and_a_port_in_use(tmp_path: Path) -> None:
    with Engine(str(tmp_path / "a.duckdb")) as a, Engine(str(tmp_path / "b.duckdb")) as b:
        url = observe.serve(a, 0)
        assert observe.serve(a, 0) == url == observe.serving_url(a)
        port = int(url.rsplit(":", 1)[1].strip("/"))
        with pytest.raises(ServeError, match=f"cannot serve .* on 127.0.0.1:{port}"):
            observe.serve(b, port)
        assert observe.serving_url(b) is None
    with pytest.raises(urllib.error.URLError):  # closed: nothing answers any more
        get(url + "status", timeout=2)


# -- /status ----------------------------------------------------------------------------------
def test_status_json_is_the_engine_status_plus_live_numbers(state_path: str) -> None:
    with Engine(state_path) as eng:
        declare_flow(eng, halt_at=2)
        url = observe.serve(eng, 0)
        feed(eng, 4)
        doc = json.loads(get(url + "status"))
        expected = eng.status().to_dict()
    served = {k: v for k, v in doc.items() if k != "live"}
    assert served == json.loads(json.dumps(expected, default=str))
    assert [p["name"] for p in doc["procedures"]] == PROCEDURES
    flow = doc["live"]["dataflow"]
    assert [n["name"] for n in flow] == DATAFLOW
    assert_dataflow_order([n["name"] for n in flow], INPUTS)
    numbers = {p["name"]: p for p in doc["live"]["procedures"]}
    assert numbers["z_parse"]["batches_committed"] == 4
    assert numbers["z_parse"]["batches_per_s"] > 0
    assert numbers["y_watch"]["halted"] and "bad batch 2" in numbers["y_watch"]["halted"]
    assert doc["live"]["pid"] == os.getpid() and doc["live"]["skipped"] is None
    assert doc["errors"][0]["procedure"] == "y_watch"


def test_status_and_metrics_answer_while_a_long_transaction_holds_the_engine(
        state_path: str) -> None:
    with Engine(state_path) as eng:
        declare_flow(eng)
        url = observe.serve(eng, 0)
        feed(eng, 3)
        answers: dict[str, object] = {}

        def read() -> None:
            t0 = time.monotonic()
            answers["status"] = json.loads(get(url + "status"))
            answers["metrics"] = scrape(url)
            answers["seconds"] = time.monotonic() - t0

        with eng.transaction() as tx:  # holds the engine's lock until the block ends
            tx.execute("INSERT INTO totals VALUES (99, 1)")
            reader = threading.Thread(target=read)
            reader.start()
            reader.join(timeout=20)
            assert not reader.is_alive(), "/status waited behind the transaction"
        doc = answers["status"]
        assert isinstance(doc, dict)
        assert answers["seconds"] < 5  # type: ignore[operator]
        assert "long transaction" in doc["live"]["skipped"]
        assert doc["live"]["stale"] is True
        assert [p["name"] for p in doc["procedures"]] == PROCEDURES  # from memory
        assert [p["last_batch"] for p in doc["procedures"]] == [3, 3, 3, 3]
        assert sample(answers["metrics"], "sstore_engine_stale") == 1  # type: ignore[arg-type]
        assert sample(answers["metrics"], "sstore_procedure_batches_committed_total",
                      procedure="a_total") == 3  # type: ignore[arg-type]
        after = json.loads(get(url + "status"))  # the lock is free again: read in full
        assert after["live"]["skipped"] is None and after["live"]["stale"] is False


def test_serving_before_the_engine_starts_shows_the_file(state_path: str) -> None:
    with Engine(state_path) as eng:
        declare_flow(eng)
        feed(eng, 2)
    with Engine(state_path) as eng:  # the program is still declaring when it serves
        url = observe.serve(eng, 0)
        doc = json.loads(get(url + "status"))
        assert doc["live"]["started"] is False and "not started" in doc["live"]["note"]
        assert [p["last_batch"] for p in doc["procedures"]] == [2, 2, 2, 2]
        declare_flow(eng)
        feed(eng, 1, first=3)
        assert json.loads(get(url + "status"))["live"]["started"] is True


def test_the_dashboard_page_is_self_contained(state_path: str) -> None:
    with Engine(state_path) as eng:
        url = observe.serve(eng, 0)
        page = get(url).decode()
        assert get(url + "index.html").decode() == page
        with pytest.raises(urllib.error.HTTPError, match="404"):
            get(url + "nope")
    assert "<svg" in page and "fetch(\"status\"" in page and "setInterval(refresh, 2000)" in page
    for external in ("http://", "https://", "//cdn", "@import", "<link"):
        assert external not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") \
            .replace('"http://www.w3.org/2000/svg"', ""), external


# -- the discovery file ------------------------------------------------------------------------
def test_the_discovery_file_lives_as_long_as_the_server(state_path: str) -> None:
    eng = Engine(state_path)
    url = observe.serve(eng, 0)
    found = live.find(state_path)
    assert found is not None and found.pid == os.getpid() and found.url == url
    assert found.engine_id == eng.engine_id
    eng.close()
    assert not os.path.exists(live.discovery_path(state_path))
    assert live.find(state_path) is None


def test_a_stale_discovery_file_is_ignored(state_path: str) -> None:
    with Engine(state_path) as eng:
        declare_flow(eng)
        feed(eng, 2)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    path = live.discovery_path(state_path)
    with open(path, "w") as out:  # what a process killed while serving leaves behind
        json.dump({"pid": gone.pid, "host": "127.0.0.1", "port": 9, "engine_id": "x",
                   "url": "http://127.0.0.1:9/", "state": os.path.abspath(state_path)}, out)
    assert live.find(state_path) is None
    result = CliRunner().invoke(main, ["status", state_path, "--json"])
    assert result.exit_code == 0, result.output  # the file itself is read, as usual
    assert "live" not in json.loads(result.output)


# -- the command line ---------------------------------------------------------------------------
def test_commands_that_run_a_dataflow_serve_when_asked(tmp_path: Path) -> None:
    state = str(tmp_path / "voter.duckdb")
    seen: dict[str, object] = {}

    def watch() -> None:  # an operator looking at the running demo
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "doc" not in seen:
            found = live.find(state)
            if found is not None:
                try:
                    seen["doc"] = json.loads(get(found.url + "status"))
                except OSError:
                    pass
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    result = CliRunner().invoke(main, ["demo", "--votes", "6000", "--batch-size", "100",
                                       "--state", state, "--serve", "0"])
    watcher.join(timeout=70)
    assert result.exit_code == 0, result.output
    assert "Live status, metrics and dashboard: http://127.0.0.1:" in result.output
    doc = seen["doc"]
    assert isinstance(doc, dict) and doc["live"]["started"] in (True, False)
    assert doc["engine_id"] == status_of_file(state).engine_id
    assert not os.path.exists(live.discovery_path(state))  # gone with the demo
    for command in (["demo"], ["tpcdi", "run"], ["tpcdi", "demo"]):
        help_text = CliRunner().invoke(main, [*command, "--help"]).output
        assert "--serve PORT" in help_text and "--serve-host" in help_text, command
