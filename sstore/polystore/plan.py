"""Query plans: what the planner's rules produce, the cost model prices and the executor runs.

A plan is a few *steps* that move rows, then one *final* query in one place:

- ``Fetch``: run SQL in an engine and keep the rows in the island (Arrow, in this process)
  under a name; the fetches of a plan run in parallel.
- ``Move``: run SQL in one engine and store the rows as a table in another (a cast). A move may
  be kept as a cache (``cache_key``): a later query finds it there and pays only for what has
  changed at the source since.
- ``Run``: the final query, in an engine's dialect, or in the island (DuckDB over the fetched
  Arrow tables). Its rows are the answer.

A plan over a split object whose engine stream a sink delivers into its PostgreSQL table also
carries *guards* (``Delivered``): the stream's reads keep only the batches above the sink's
watermark, a value the executor reads when the plan runs (``sstore.polystore.delivered``).

Plans are plain values: rules build them without touching any engine, and two runs of the
planner over the same inputs give equal plans (the golden fixtures rely on that).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ISLAND = "island"  # the executor's own DuckDB over Arrow: where pulled rows are combined


@dataclass(frozen=True)
class Fetch:
    engine: str
    sql: str
    into: str        # name of the Arrow table in the island
    rows: int        # estimated rows
    columns: int     # columns fetched


@dataclass(frozen=True)
class Move:
    source: str
    sql: str
    target: str
    table: str       # the table created in ``target``
    rows: int
    columns: int
    cache_key: str | None = None   # set: keep the table and reuse it while the source is unchanged
    #: rows the target already has from an earlier move (planner input)
    cached_rows: int = 0
    incremental_by: str | None = None  # a growing column (``_batch_id``): move only newer rows


@dataclass(frozen=True)
class Run:
    engine: str      # an engine of the catalog, or ISLAND
    sql: str
    input_rows: int
    input_columns: int
    output_rows: int
    output_columns: int


Step = Fetch | Move


@dataclass(frozen=True)
class Delivered:
    """A sink delivers engine stream ``stream`` (of the engine whose identity is ``source``;
    None: not known, matched by stream alone) into PostgreSQL table ``target`` of engine
    ``engine``. The plan's SQL names ``placeholder`` where the sink's watermark goes: each
    read of the stream (or of its cached copy) keeps ``_batch_id > watermark`` only.
    ``stream_engine``: the catalog's name of the engine the stream is in, asked before a run
    which batches it already collected (batches past the watermark it no longer has are in
    neither fragment)."""

    placeholder: str
    engine: str
    target: str
    stream: str
    source: str | None
    stream_engine: str


@dataclass
class Plan:
    """One way to answer a query. ``rule`` names the planner rule that proposed it."""

    name: str
    rule: str
    steps: tuple[Step, ...]
    final: Run
    cost: float = math.nan
    cost_detail: dict[str, float] = field(default_factory=dict)
    cost_terms: dict[str, float] = field(default_factory=dict)  # constant -> count (cost.py)
    measured: float | None = None  # seconds its last run took (set by Polystore.query)
    #: names this plan of this query in the learnt observations (``corrections.plan_key``)
    learn_key: str = ""
    #: ``cost`` is the model's price times this, learnt from measured runs (``corrections``)
    correction: float = 1.0
    pruned: tuple[tuple[str, str], ...] = ()  # (engine, physical) left out as empty
    guards: tuple[Delivered, ...] = ()  # watermarks the SQL needs when it runs (delivered)
    #: sinks whose target the plan reads without their stream (left out as empty): checked
    #: before a run to still hold the rows their watermarks count (``delivered.check_targets``)
    checks: tuple[Delivered, ...] = ()
    feasible: bool = True
    why_not: str = ""
    #: the session time zone the final query runs in outside PostgreSQL (PostgreSQL's, so
    #: timestamptz values are shown, cut and cast as PostgreSQL would; None: the engine's)
    time_zone: str | None = None

    def engines(self) -> set[str]:
        used = {self.final.engine}
        for step in self.steps:
            used |= {step.engine} if isinstance(step, Fetch) else {step.source, step.target}
        return used

    def describe(self, costs: bool = True) -> str:
        """The plan as EXPLAIN prints it: one line per step, then its SQL, indented."""
        head = f"plan {self.name}  (rule {self.rule})"
        if costs and not math.isnan(self.cost):
            head += f"  estimated {self.cost * 1000:.1f} ms"
            if self.correction != 1.0 and math.isfinite(self.cost):
                head += (f" (model {self.cost / self.correction * 1000:.1f} ms x "
                         f"{self.correction:.2f} learnt from runs)")
        if costs and self.measured is not None:
            head += f", measured {self.measured * 1000:.1f} ms (last run)"
        if not self.feasible:
            head += f"  [not feasible: {self.why_not}]"
        lines = [head]
        for step in self.steps:
            if isinstance(step, Fetch):
                lines.append(f"  fetch {step.engine} -> {ISLAND}.{step.into}  "
                             f"(~{step.rows:,} rows x {step.columns} cols, in parallel)")
            else:
                cache = ""
                if step.cache_key:
                    cache = (f", cached: {step.cached_rows:,} rows already there"
                             if step.cached_rows else ", kept as a cache")
                lines.append(f"  move {step.source} -> {step.target}.{step.table}  "
                             f"(~{step.rows:,} rows x {step.columns} cols{cache})")
            lines.append(f"      {step.sql}")
        zone = f", time zone {self.time_zone}" if self.time_zone else ""
        lines.append(f"  run in {self.final.engine}  (~{self.final.input_rows:,} rows in, "
                     f"~{self.final.output_rows:,} out{zone})")
        lines.append(f"      {self.final.sql}")
        for guard in self.guards:
            lines.append(f"  {guard.stream} is delivered into {guard.engine}.{guard.target}: "
                         f"its batches up to the sink's watermark are read there only")
        for check in self.checks:
            lines.append(f"  {check.stream} is delivered into {check.engine}.{check.target}: "
                         f"checked to hold the rows the sink's watermark counts")
        if costs and self.cost_detail:
            parts = ", ".join(f"{k} {v * 1000:.1f}" for k, v in self.cost_detail.items())
            lines.append(f"  cost ms: {parts}")
        return "\n".join(lines)
