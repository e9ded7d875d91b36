"""How ``benchmarks.tpcdi`` turns runs into numbers: records, the same-rows check, ratios, rich
tables and a PNG.

The definitions are in ``DEFINITIONS`` (written into the JSON too): they are chosen so that
every system is measured the same way, from the same events, and so that a run capped by its
time budget is never mistaken for a complete one.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.table import Table

from benchmarks.common import percentile
from benchmarks.tpcdi_runs import Run, series
from benchmarks.tpcdi_setup import DataSet
from sstore.base.extras import needs

LABELS = {"sstore": "sstore streaming", "sstore-coalescing": "sstore, coalescing",
          "reference": "hand-written DuckDB + PG", "spark-sss": "Spark Structured Streaming",
          "spark-bulk": "Spark bulk"}
COLORS = {"sstore": "C1", "sstore-coalescing": "C4", "reference": "C3", "spark-sss": "C2",
          "spark-bulk": "C0"}
STREAMING = ("sstore", "sstore-coalescing", "reference", "spark-sss")
DEFINITIONS = {
    "trade": "one DimTrade row; the data set's trades are its I (insert) events",
    "events_per_trade": "all trade events of Batch1-3 / trades (Batch1: one event per "
                        "TradeHistory.txt row, ~2.5 per trade; Batch2/3: one per Trade.txt row)",
    "batch_trades": "batch size in trades; a batch is batch_trades * events_per_trade "
                    "consecutive trade events (batch_events), one engine batch, one chunk of "
                    "the hand-written reference or one Spark micro-batch; 0: every TPC-DI "
                    "batch is one chunk (sstore, reference); Spark bulk has no batch size (a "
                    "batch is a TPC-DI batch)",
    "seconds": "wall-clock seconds of the trade phases' measured parts (dimension phases "
               "excluded), first arrival to everything visible in PostgreSQL",
    "trades_per_s": "events of the measured parts / events_per_trade / seconds: trades end "
                    "to end into PostgreSQL per second (= trades / seconds when not capped)",
    "p50_ms/p99_ms": "nearest-rank percentiles of the latency of the historical phase's "
                     "measured batches (the full-size ones), from a batch's arrival (engine: "
                     "ingest; Spark streaming: its file written; Spark bulk: the start of "
                     "Batch1, one batch; open loop, --rates: when it was due) to its rows "
                     "committed in PostgreSQL; "
                     "incr_latency_ms: the same for each batch of Batch2/3 (small: a TPC-DI "
                     "incremental batch has fewer events than one batch of 100 trades at SF<=1)",
    "offered_trades_per_s": "--rates only (open loop, benchmarks.tpcdi_runs): the rate the "
                            "batches were due at; latency is then from a batch's due time, so "
                            "a system that cannot keep up has trades_per_s below it and a "
                            "latency that grows over the phase",
    "kept_up": "open loop: trades_per_s reached 95% of offered_trades_per_s (else the table "
               "says 'behind'); None in a closed loop",
    "hist_rows_per_s": "TPC-DI style: rows of Batch1's DimTrade source files (Trade.txt + "
                       "TradeHistory.txt), scaled to the measured part, / its seconds",
    "incr_rows_per_s": "TPC-DI style: rows of Batch2+3 Trade.txt / the incremental phases' "
                       "seconds",
    "capped": "a phase ran out of its time budget: only its first part is measured, the rest "
              "went as one unmeasured batch so the warehouse is still complete and checked",
    "matches": "dimtrade and dimessages have the same rows (md5 over every column, sorted) "
               "as the baseline run (the first sstore run of the scale factor)",
    "vs_sstore": "this run's trades/s (or latency) / sstore's at the same SF and batch size",
    "peak_rss_mb": "peak resident memory of the benchmark process during the run (VmHWM "
                   "reset before it; peak_rss_scope says if the reset failed and it is the "
                   "process's lifetime peak); peak_rss_children_mb: the same for its child "
                   "processes (Spark's JVM)",
    "service_series_ms": "per-batch wall time of sending a batch (the engine: ingest + "
                         "run_until_idle; reference and Spark streaming: until in "
                         "PostgreSQL) over the historical phase, as [first batch index, "
                         "median ms] of consecutive buckets; latency_series_ms: the same for "
                         "latency",
    "profile": "--profile only, sstore runs: ms per batch by phase (benchmarks.tpcdi_profile)",
}


def _rate(phases: list[Any], rows: dict[int, int]) -> float:
    """Source rows per second over ``phases``, counting of a capped phase its measured part."""
    measured = sum(rows[p.tpcdi_batch] * p.measured_events / p.events if p.events else 0
                   for p in phases)
    seconds = sum(p.seconds for p in phases)
    return measured / seconds if seconds else float("nan")


def to_record(run: Run, data: DataSet) -> dict[str, Any]:
    """One run as flat numbers (see ``DEFINITIONS``)."""
    per_trade = data.total_events / data.trades
    measured = sum(p.measured_events for p in run.phases)
    seconds = sum(p.seconds for p in run.phases)
    hist = [p for p in run.phases if p.tpcdi_batch == 1]
    incr = [p for p in run.phases if p.tpcdi_batch > 1]
    lat = run.latencies_ms.get(1, [])
    incr_lat = [ms for b, v in run.latencies_ms.items() if b > 1 for ms in v]
    record = {
        "system": run.system, "scale_factor": run.scale_factor,
        "batch_trades": run.batch_trades, "batch_events": run.batch_events,
        "batch_label": batch_label(run.batch_trades, run.offered_trades_per_s),
        "offered_trades_per_s": run.offered_trades_per_s,
        "trades": data.trades, "events": data.total_events,
        "events_per_trade": round(per_trade, 3), "measured_events": measured,
        "batches": sum(p.batches for p in run.phases), "seconds": round(seconds, 3),
        "trades_per_s": round(measured / per_trade / seconds, 1),
        "events_per_s": round(measured / seconds, 1),
        "p50_ms": round(percentile(lat, 0.5), 2), "p99_ms": round(percentile(lat, 0.99), 2),
        "latency_samples": len(lat), "latency_series_ms": series(lat),
        "incr_latency_ms": [round(ms, 1) for ms in incr_lat],
        "hist_rows": data.source_rows[1], "hist_seconds": round(sum(p.seconds for p in hist), 3),
        "hist_rows_per_s": round(_rate(hist, data.source_rows), 1),
        "incr_rows": sum(data.source_rows[p.tpcdi_batch] for p in incr),
        "incr_seconds": round(sum(p.seconds for p in incr), 3),
        "incr_rows_per_s": round(_rate(incr, data.source_rows), 1),
        "capped": any(p.capped for p in run.phases),
        "hist_measured_fraction": round(sum(p.measured_events for p in hist)
                                        / max(sum(p.events for p in hist), 1), 4),
        "phases": [asdict(p) for p in run.phases],
        "dimension_seconds": {k: round(v, 3) for k, v in run.dimension_seconds.items()},
        "result": run.result, **run.extra,
    }
    record["kept_up"] = kept_up(record)
    return record


def batch_label(batch_trades: int | None, offered: float | None = None) -> str:
    size = "TPC-DI batch" if batch_trades is None else "whole TPC-DI batch" \
        if batch_trades == 0 else f"{batch_trades:,}"
    return size + (f" at {offered:,.0f}/s" if offered else "")


def _key(r: dict[str, Any]) -> tuple[float, int | None, float | None]:
    """The runs compared with each other: same SF, batch size and offered rate."""
    return r["scale_factor"], r["batch_trades"], r.get("offered_trades_per_s")


def kept_up(r: dict[str, Any]) -> bool | None:
    """Open loop: whether the run's throughput reached 95% of the offered rate."""
    offered = r.get("offered_trades_per_s")
    return None if not offered else r["trades_per_s"] >= 0.95 * offered


def check_same_rows(records: list[dict[str, Any]]) -> None:
    """Set ``matches`` on every record of one scale factor against its reference run."""
    if not records:
        return
    reference = next((r for r in records if r["system"] == "sstore"), records[0])
    want = {k: reference["result"][k] for k in ("dimtrade_rows", "dimtrade_md5",
                                                "dimessages_rows", "dimessages_md5")}
    for r in records:
        got = {k: r["result"][k] for k in want}
        r["matches"] = got == want and want["dimtrade_rows"] > 0
        r["rows_match"] = (got["dimtrade_rows"], got["dimessages_rows"]) == \
            (want["dimtrade_rows"], want["dimessages_rows"])


def add_ratios(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``vs_sstore`` on every streaming record, and one row per SF and batch size comparing
    the systems (sstore's trades/s as a multiple of the others', their latency as a multiple
    of sstore's)."""
    engine = {_key(r): r for r in records if r["system"] == "sstore"}
    bulk = {r["scale_factor"]: r for r in records if r["system"] == "spark-bulk"}
    ratios = []
    for r in records:
        base = engine.get(_key(r))
        if r["system"] not in ("spark-sss", "reference", "sstore-coalescing") or base is None:
            continue
        r["vs_sstore"] = {"trades_per_s": _div(r["trades_per_s"], base["trades_per_s"]),
                          "p50_ms": _div(r["p50_ms"], base["p50_ms"]),
                          "p99_ms": _div(r["p99_ms"], base["p99_ms"])}
    for key, e in sorted(engine.items(),
                         key=lambda kv: (kv[0][0], kv[0][1] or 1e18, kv[0][2] or 0.0)):
        sf, size, offered = key
        sss = next((r for r in records if r["system"] == "spark-sss" and _key(r) == key), None)
        ref = next((r for r in records if r["system"] == "reference" and _key(r) == key), None)
        co = next((r for r in records if r["system"] == "sstore-coalescing"
                   and _key(r) == key), None)
        b = bulk.get(sf)
        ratios.append({
            "scale_factor": sf, "batch_trades": size, "offered_trades_per_s": offered,
            "batch_label": e["batch_label"],
            "sstore_over_sss_trades_per_s": _div(e["trades_per_s"], sss and sss["trades_per_s"]),
            "sstore_over_reference_trades_per_s": _div(e["trades_per_s"],
                                                       ref and ref["trades_per_s"]),
            "sstore_over_reference_p50": _div(e["p50_ms"], ref and ref["p50_ms"]),
            "coalescing_over_reference_trades_per_s": _div(co and co["trades_per_s"],
                                                           ref and ref["trades_per_s"]),
            "coalescing_over_reference_p50": _div(co and co["p50_ms"], ref and ref["p50_ms"]),
            "sstore_over_bulk_trades_per_s": _div(e["trades_per_s"], b and b["trades_per_s"]),
            "sss_over_sstore_p50": _div(sss and sss["p50_ms"], e["p50_ms"]),
            "sss_over_sstore_p99": _div(sss and sss["p99_ms"], e["p99_ms"]),
            "bulk_over_sstore_p50": _div(b and b["p50_ms"], e["p50_ms"]),
            "sstore_over_bulk_hist_rows_per_s": _div(e["hist_rows_per_s"],
                                                     b and b["hist_rows_per_s"]),
            "sstore_over_bulk_incr_rows_per_s": _div(e["incr_rows_per_s"],
                                                     b and b["incr_rows_per_s"]),
            "capped": e["capped"] or bool(sss and sss["capped"]) or bool(ref and ref["capped"])
            or bool(co and co["capped"])})
    return ratios


def _div(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x" if value >= 0.1 else f"{value:.3f}x"


def results_table(records: list[dict[str, Any]]) -> Table:
    table = Table(title="TPC-DI DimTrade into PostgreSQL. batch = trades per batch "
                        "(x events/trade events); trades/s end to end; latency = a batch's "
                        "arrival -> its rows visible in PostgreSQL; TPC-DI rows/s = source "
                        "rows / phase seconds; * = capped by the time budget (see notes)")
    offered = any(r.get("offered_trades_per_s") for r in records)
    for name in ("SF", "system", "batch", "events/batch", "batches", "seconds",
                 *(("offered trades/s",) if offered else ()), "trades/s",
                 "vs sstore", "p50 ms", "p99 ms", "hist rows/s", "incr rows/s", "peak RSS MB",
                 "same rows"):
        table.add_column(name, justify="left" if name == "system" else "right")
    for r in records:
        rate = r.get("offered_trades_per_s")
        rate_cell = (f"{rate:,.0f}" if rate else "closed loop",) if offered else ()
        star = "*" if r["capped"] else ""
        batch = r["batch_label"] + (" [red](behind)" if r.get("kept_up") is False else "")
        rss = "" if r.get("peak_rss_mb") is None else f"{r['peak_rss_mb']:,.0f}" + (
            f" (+JVM {r['peak_rss_children_mb']:,.0f})" if r.get("peak_rss_children_mb") and
            r["system"].startswith("spark") else "")
        table.add_row(
            f"{r['scale_factor']:g}", LABELS[r["system"]], batch,
            "-" if r["batch_events"] is None else f"{r['batch_events']:,}",
            f"{r['batches']:,}", f"{r['seconds']:,.1f}{star}", *rate_cell,
            f"{r['trades_per_s']:,.0f}{star}",
            _x(r.get("vs_sstore", {}).get("trades_per_s")), f"{r['p50_ms']:,.0f}",
            f"{r['p99_ms']:,.0f}", f"{r['hist_rows_per_s']:,.0f}{star}",
            f"{r['incr_rows_per_s']:,.0f}", rss, "yes" if r.get("matches") else "[red]NO")
    return table


def ratios_table(ratios: list[dict[str, Any]]) -> Table:
    table = Table(title="Ratios at the same SF and batch size (sstore's throughput as a "
                        "multiple of the other's; the other's latency as a multiple of sstore's; "
                        "vs reference: sstore's p50 as a multiple of the reference's)")
    for name in ("SF", "batch", "trades/s vs reference", "p50 vs reference",
                 "coalescing: trades/s vs reference", "coalescing: p50 vs reference",
                 "trades/s vs Spark SS", "trades/s vs bulk", "Spark SS p50",
                 "Spark SS p99", "bulk p50", "hist rows/s vs bulk", "incr rows/s vs bulk"):
        table.add_column(name, justify="right")
    for r in ratios:
        star = "*" if r["capped"] else ""
        table.add_row(f"{r['scale_factor']:g}", f"{r['batch_label']}{star}",
                      _x(r["sstore_over_reference_trades_per_s"]),
                      _x(r["sstore_over_reference_p50"]),
                      _x(r.get("coalescing_over_reference_trades_per_s")),
                      _x(r.get("coalescing_over_reference_p50")),
                      _x(r["sstore_over_sss_trades_per_s"]),
                      _x(r["sstore_over_bulk_trades_per_s"]), _x(r["sss_over_sstore_p50"]),
                      _x(r["sss_over_sstore_p99"]), _x(r["bulk_over_sstore_p50"]),
                      _x(r["sstore_over_bulk_hist_rows_per_s"]),
                      _x(r["sstore_over_bulk_incr_rows_per_s"]))
    return table


def breakdown_table(records: list[dict[str, Any]]) -> Table:
    table = Table(title="Where a streaming batch's time goes (median ms per batch)")
    for name in ("SF", "system", "batch", "part", "ms"):
        table.add_column(name, justify="left" if name in ("system", "part") else "right")
    for r in records:
        for part, ms in r.get("breakdown_ms_p50", {}).items():
            table.add_row(f"{r['scale_factor']:g}", LABELS[r["system"]],
                          r["batch_label"], part, f"{ms:,.1f}")
    return table


def _x_position(r: dict[str, Any]) -> float:
    """Where a run sits on the batch-size axis: a whole-TPC-DI-batch run at Batch1's trades."""
    if r["batch_trades"]:
        return float(r["batch_trades"])
    return r["batch_events"] / r["events_per_trade"]


def _pyplot() -> Any:
    with needs("bench"):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    return plt


def _closed_loop(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The closed-loop runs when there are any (the batch-size charts), else every run."""
    closed = [r for r in records if not r.get("offered_trades_per_s")]
    return closed or records


def plot_rates(records: list[dict[str, Any]], path: str) -> bool:
    """Per SF and batch size run open loop (``--rates``): each streaming system's p50 and
    p99 latency against the trades/s it delivered, one point per offered rate (a cross: it
    fell behind the rate), its closed-loop run as a diamond (saturation: the most it
    delivers, and the queueing latency that comes with it). False if no run was open loop."""
    keys = sorted({(r["scale_factor"], r["batch_trades"]) for r in records
                   if r.get("offered_trades_per_s")})
    if not keys:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(7 * len(keys), 5), squeeze=False)
    for ax, (sf, size) in zip(axes[0], keys, strict=True):
        for system in STREAMING:
            mine = [r for r in records if (r["scale_factor"], r["batch_trades"]) == (sf, size)
                    and r["system"] == system]
            opened = sorted((r for r in mine if r.get("offered_trades_per_s")),
                            key=lambda r: r["offered_trades_per_s"])
            color = COLORS[system]
            if opened:
                ax.plot([r["trades_per_s"] for r in opened], [r["p50_ms"] for r in opened],
                        "-", color=color, label=f"{LABELS[system]} p50")
                ax.plot([r["trades_per_s"] for r in opened], [r["p99_ms"] for r in opened],
                        ":", color=color, lw=1, label=f"{LABELS[system]} p99")
                for r in opened:
                    ax.plot([r["trades_per_s"]], [r["p50_ms"]], "o" if r["kept_up"] else "x",
                            color=color, ms=7)
                    ax.annotate(f"{r['offered_trades_per_s']:,.0f}",
                                (r["trades_per_s"], r["p50_ms"]), fontsize=6,
                                textcoords="offset points", xytext=(3, -9))
            for r in mine:
                if not r.get("offered_trades_per_s"):
                    ax.plot([r["trades_per_s"]], [r["p50_ms"]], "D", color=color, ms=7,
                            label=f"{LABELS[system]} closed loop p50")
        ax.set(yscale="log", xlabel="trades/s delivered into PostgreSQL (labels: offered)",
               ylabel="batch latency, due -> visible in PostgreSQL (ms)",
               title=f"SF {sf:g}, batches of {size:,} trades: latency by rate (x: fell behind)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot(records: list[dict[str, Any]], path: str) -> None:
    """Per SF: trades/s and p50 latency against batch size for every streaming system (the
    rightmost point of sstore and reference: every TPC-DI batch as one chunk); Spark bulk as
    a line."""
    plt = _pyplot()
    records = _closed_loop(records)
    sfs = sorted({r["scale_factor"] for r in records})
    fig, axes = plt.subplots(2, len(sfs), figsize=(6.5 * len(sfs), 8.5), squeeze=False)
    for col, sf in enumerate(sfs):
        top, bottom = axes[0][col], axes[1][col]
        for system in STREAMING:
            mine = [r for r in records if r["scale_factor"] == sf and r["system"] == system]
            if not mine:
                continue
            rs = sorted((r for r in mine if r["batch_trades"]), key=_x_position)
            whole = [r for r in mine if r["batch_trades"] == 0]
            x = [_x_position(r) for r in rs]
            top.plot(x, [r["trades_per_s"] for r in rs], "o-", color=COLORS[system],
                     label=LABELS[system])
            bottom.plot(x, [r["p50_ms"] for r in rs], "o-", color=COLORS[system],
                        label=f"{LABELS[system]} p50")
            for r in whole:  # a point of its own: its size is the data set's, not a setting
                top.plot([_x_position(r)], [r["trades_per_s"]], "*", ms=12,
                         color=COLORS[system], label=f"{LABELS[system]}, whole TPC-DI batches")
                bottom.plot([_x_position(r)], [r["p50_ms"]], "*", ms=12, color=COLORS[system],
                            label=f"{LABELS[system]}, whole TPC-DI batches (Batch1 at once)")
            for r in rs + whole:
                if r["capped"]:
                    top.annotate("capped", (_x_position(r), r["trades_per_s"]), fontsize=7)
        for r in records:
            if r["scale_factor"] == sf and r["system"] == "spark-bulk":
                top.axhline(r["trades_per_s"], color=COLORS["spark-bulk"], ls=":",
                            label="Spark bulk (whole TPC-DI batches)")
                bottom.axhline(r["p50_ms"], color=COLORS["spark-bulk"], ls=":",
                               label="Spark bulk (Batch1 is one batch)")
        top.set(xscale="log", yscale="log", title=f"SF {sf:g}: trades/s into PostgreSQL",
                xlabel="batch size (trades)", ylabel="trades/s")
        bottom.set(xscale="log", yscale="log", title=f"SF {sf:g}: p50 batch latency",
                   xlabel="batch size (trades)", ylabel="arrival -> visible in PostgreSQL (ms)")
        for ax in (top, bottom):
            ax.legend(fontsize=7)
            ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_batches(records: list[dict[str, Any]], path: str) -> None:
    """Per SF and batch size: each streaming system's per-batch time over the whole
    historical phase (``service_series_ms``, medians of consecutive buckets), to see whether
    a batch's cost stays flat as the state grows; dashed: the latency series."""
    plt = _pyplot()
    records = _closed_loop(records)
    keys = sorted({(r["scale_factor"], r["batch_trades"]) for r in records
                   if r["system"] in STREAMING and r["batch_trades"]})
    if not keys:
        return
    fig, axes = plt.subplots(len(keys), 1, figsize=(10, 3.2 * len(keys)), squeeze=False)
    for ax, (sf, size) in zip((a[0] for a in axes), keys, strict=True):
        for r in records:
            if (r["scale_factor"], r["batch_trades"]) != (sf, size) or \
                    r["system"] not in STREAMING:
                continue
            # closed loop: the others' send is their latency; sstore's sinks lag behind it
            series_of = (("service_series_ms", "-", "send"),) + (
                (("latency_series_ms", "--", "latency"),) if r["system"] == "sstore" else ())
            for key, style, what in series_of:
                points = r.get(key) or []
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], style,
                            marker="." if len(points) < 30 else None,
                            color=COLORS[r["system"]], lw=1,
                            label=f"{LABELS[r['system']]} ({what})")
        ax.set(yscale="log", title=f"SF {sf:g}, batches of {size:,} trades: per-batch time "
                                   f"over the historical phase (Batch1)",
               xlabel="batch number", ylabel="ms per batch")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
