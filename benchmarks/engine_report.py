"""How ``benchmarks.engine`` shows its results: rich tables for people, a PNG plot."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from sstore.base.extras import needs

MODES = ("full", "weak")
LABELS = {"chain": "sstore chain", "voter": "sstore voter", "baseline": "chain by hand (DuckDB)",
          "spark": "chain on Spark Structured Streaming"}
COLORS = {"baseline": "C0", "chain": "C1", "spark": "C2", "voter": "C3"}  # same in every panel


def relative(records: list[dict[str, Any]], rec: dict[str, Any], other: str) -> str:
    """``other``'s throughput as a multiple of the engine chain's (same mode and batch size)."""
    if rec["workload"] != "chain":
        return ""
    for base in records:
        if (base["workload"], base["mode"], base["batch_size"]) == \
                (other, rec["mode"], rec["batch_size"]):
            ratio = base["rows_per_s"] / rec["rows_per_s"]
            return f"{ratio:.1f}x" if ratio >= 0.1 else f"{ratio:.3f}x"
    return ""


def results_table(records: list[dict[str, Any]]) -> Table:
    table = Table(title="sstore vs the chain by hand on DuckDB (baseline) and on Spark Structured "
                        "Streaming (spark), closed loop: one batch in, run it to the end, next. "
                        "\"by-hand is\"/\"Spark is\": their rows/s as a multiple of the chain's")
    for name in ("workload", "mode", "batch", "batches", "TE/s", "ms/TE", "batches/s", "rows/s",
                 "p50 ms", "p99 ms", "by-hand is", "Spark is"):
        table.add_column(name, justify="left" if name in ("workload", "mode") else "right")
    ordered = sorted(records, key=lambda r: (r["mode"], r["batch_size"], r["workload"]))
    for r in ordered:
        table.add_row(r["workload"], r["mode"], f"{r['batch_size']:,}", str(r["batches"]),
                      f"{r['te_per_s']:,.0f}", f"{r['ms_per_te']:.2f}",
                      f"{r['batches_per_s']:,.1f}", f"{r['rows_per_s']:,.0f}",
                      f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}",
                      relative(records, r, "baseline"), relative(records, r, "spark"))
    return table


def phases_table(profile: dict[str, Any]) -> Table:
    table = Table(title=f"Where the time goes: {profile['workload']}, {profile['mode']} "
                        f"durability, batch size {profile['batch_size']}, {profile['batches']} "
                        f"batches under cProfile ({profile['wall_ms_per_batch']:.2f} ms per "
                        f"batch, {profile['tes'] / profile['batches']:.2f} TEs per batch, "
                        f"{profile['duckdb_share']:.0%} of it inside DuckDB calls)")
    for name in ("phase", "calls/batch", "ms/batch", "ms/TE", "share", "status"):
        table.add_column(name, justify="left" if name in ("phase", "status") else "right")
    for p in profile["phases"]:
        label = "  " * p["depth"] + p["phase"]
        if p["calls_per_batch"] is None:
            table.add_row(label, "-", "-", "-", "-", f"[red]{p['status']}")
            continue
        status = "" if p["status"] == "ok" else p["status"]
        table.add_row(label, f"{p['calls_per_batch']:.2f}", f"{p['ms_per_batch']:.3f}",
                      f"{p['ms_per_te']:.3f}", f"{p['share']:.0%}",
                      f"[red]{status}" if "unexpected" in status else status)
    return table


def calls_table(profile: dict[str, Any]) -> Table:
    calls = profile["duckdb_calls"]
    table = Table(title=f"DuckDB calls of {profile['workload']} ({profile['mode']}, batch size "
                        f"{profile['batch_size']}): {calls['sql_statements_per_te']:.2f} SQL "
                        f"statements and {calls['duckdb_calls_per_te']:.2f} DuckDB calls per "
                        f"TE; {calls['sql_statements_per_batch']:.2f} statements and "
                        f"{calls['duckdb_calls_per_batch']:.2f} calls per batch")
    for name in ("context", "caller", "call", "per batch", "ms/call"):
        table.add_column(name, justify="left" if name in ("context", "caller", "call")
                         else "right")
    for row in calls["rows"]:
        note = " (bind only)" if row["call"] == "sql" else ""
        table.add_row(row["context"], row["caller"], row["call"] + note,
                      f"{row['per_batch']:.2f}", f"{row['ms_per_call']:.3f}")
    return table


def spark_table(records: list[dict[str, Any]]) -> Table | None:
    """Spark's own account of a micro-batch, median ms per batch size."""
    spark = sorted((r for r in records if r.get("spark_breakdown_ms_p50")),
                   key=lambda r: r["batch_size"])
    if not spark:
        return None
    table = Table(title=f"Where a batch's time goes in Spark {spark[0]['spark_version']} "
                        f"(median ms; trigger phases from its progress reports; "
                        f"triggerExecution covers the others)")
    table.add_column("phase")
    for r in spark:
        table.add_column(f"{r['batch_size']:,} rows", justify="right")
    phases = sorted({p for r in spark for p in r["spark_breakdown_ms_p50"]})
    rows = [("write + fsync the input file", [r["file_write_ms_p50"] for r in spark])]
    rows += [(p, [r["spark_breakdown_ms_p50"].get(p) for r in spark]) for p in phases]
    rows.append(("latency p50 (file write to foreachBatch done)", [r["p50_ms"] for r in spark]))
    for phase, values in rows:
        table.add_row(phase, *("-" if v is None else f"{v:,.1f}" for v in values))
    return table


def plot(records: list[dict[str, Any]], path: str) -> None:
    """Rows/s and p50 latency against batch size, one column per durability mode, log-log."""
    with needs("bench"):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(MODES), figsize=(11, 8), sharex=True, sharey="row")
    for col, mode in enumerate(MODES):
        for name in sorted({r["workload"] for r in records}):
            series = sorted((r for r in records if r["mode"] == mode and r["workload"] == name),
                            key=lambda r: r["batch_size"])
            if not series:
                continue
            sizes = [r["batch_size"] for r in series]
            style = {"marker": "o", "label": LABELS.get(name, f"sstore {name}"),
                     "color": COLORS.get(name)}
            axes[0][col].plot(sizes, [r["rows_per_s"] for r in series], **style)
            axes[1][col].plot(sizes, [r["p50_ms"] for r in series], **style)
        axes[0][col].set_title(f"{mode} durability")
        axes[1][col].set_xlabel("batch size (rows)")
    axes[0][0].set_ylabel("throughput (input rows/s)")
    axes[1][0].set_ylabel("p50 latency, batch in to last commit (ms)")
    for ax in axes.flat:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[0]:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
