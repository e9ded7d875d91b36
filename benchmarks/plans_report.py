"""The report of ``benchmarks.plans``: per-shape accuracy of the planner, the table, the charts."""

from __future__ import annotations

import os
from typing import Any

from rich.table import Table

from benchmarks.common import RESULTS
from sstore.extras import needs

TOLERANCE = 1.10


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per query shape: the share of (share, repetition) cases where the planner's choice was
    within 10% of the fastest plan, the worst ratio, and cumulative seconds under the planner
    against the best fixed plan in hindsight (summed over the repetitions of each share: a
    fixed plan is one plan name kept for every repetition at that share)."""
    out: dict[str, dict[str, Any]] = {}
    for shape in dict.fromkeys(r["shape"] for r in records):
        mine = [r for r in records if r["shape"] == shape]
        planner = sum(r["seconds"][r["chosen"]] for r in mine)
        planning = sum(r["planning_seconds"] for r in mine)
        best_fixed = 0.0
        for share in dict.fromkeys(r["share"] for r in mine):
            at = [r for r in mine if r["share"] == share]
            names = set.intersection(*(set(r["seconds"]) for r in at))
            best_fixed += min(sum(r["seconds"][n] for r in at) for n in names)
        worst = max(mine, key=lambda r: r["ratio"])
        out[shape] = {
            "cases": len(mine),
            "within_10pct": sum(r["ratio"] <= TOLERANCE for r in mine) / len(mine),
            "worst_ratio": worst["ratio"],
            "worst_case": {"share": worst["share"], "rep": worst["rep"],
                           "chosen": worst["chosen"], "fastest": worst["fastest"]},
            "planner_seconds": planner, "planning_seconds": planning,
            "best_fixed_seconds": best_fixed,
            "planner_vs_best_fixed": planner / best_fixed if best_fixed else float("nan"),
            "with_planning_vs_best_fixed": ((planner + planning) / best_fixed
                                            if best_fixed else float("nan")),
        }
    return out


def summary_table(summary: dict[str, dict[str, Any]]) -> Table:
    table = Table(title="the planner over repeated queries while the stream ingests")
    for col in ("shape", "cases", "within 10%", "worst ratio", "planner s", "best fixed s",
                "planner / best fixed", "planning s"):
        table.add_column(col, justify="right" if col != "shape" else "left")
    for shape, s in summary.items():
        table.add_row(shape, str(s["cases"]), f"{100 * s['within_10pct']:.0f}%",
                      f"{s['worst_ratio']:.2f}", f"{s['planner_seconds']:.2f}",
                      f"{s['best_fixed_seconds']:.2f}", f"{s['planner_vs_best_fixed']:.3f}",
                      f"{s['planning_seconds']:.2f}")
    return table


def plot_shape(records: list[dict[str, Any]], shape: str, name: str) -> str:
    """Median time per plan over the repetitions, by share; the planner's picks as circles."""
    with needs("bench"):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    shares = sorted(dict.fromkeys(r["share"] for r in records))
    names = list(dict.fromkeys(n for r in records for n in r["seconds"]))
    fig, ax = plt.subplots(figsize=(8, 5))
    for plan in names:
        ys = []
        for share in shares:
            vals = sorted(r["seconds"][plan] for r in records
                          if r["share"] == share and plan in r["seconds"])
            ys.append(1000 * vals[len(vals) // 2] if vals else None)
        ax.plot([100 * s for s in shares], ys, marker="o", label=plan)
    ax.scatter([100 * r["share"] for r in records],
               [1000 * r["seconds"][r["chosen"]] for r in records], s=140,
               facecolors="none", edgecolors="black", zorder=5, label="planner's choice")
    ax.set_yscale("log")
    ax.set_xlabel("share of ORDERS rows held in the streaming engine (%)")
    ax.set_ylabel("query time incl. cache refresh, ms (log)")
    ax.set_title(f"{shape}: repeated while the stream ingests (circles: each repetition's pick)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(RESULTS, f"{name}-{shape}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
