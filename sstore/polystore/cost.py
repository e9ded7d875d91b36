"""The cost model: seconds a plan is expected to take, from constants measured on this machine.

Every step of a plan is priced as a fixed cost per statement plus a cost per value (row x
column) moved or read, with one constant per engine kind and direction:

- ``fixed[k]``: one statement in engine kind ``k`` (connect, parse, plan, first byte);
- ``fetch[k]``: one value from ``k`` into this process as Arrow;
- ``fetch_row[k]``: one row from ``k`` into this process, beyond its values (PostgreSQL's wire
  protocol frames and ADBC decodes each row: 20,000 rows of one column took 9 ms here, of two
  13 ms, of nine 25 ms, so a narrow fetch costs more per value than the wide one a per-value
  constant alone was measured on: the island's plans, which fetch only the columns a query
  uses, were priced at half their time);
- ``load[k]``: one value from Arrow into ``k`` (binary COPY for PostgreSQL);
- ``store_fixed[k]``: one write transaction in ``k`` that creates or replaces a table;
- ``fingerprint[k]``: one value hashed by ``k`` to check that a cached copy is still valid;
- ``process[k]``: one value read by the final query in ``k``;
- ``spark_jdbc``: one value read by Spark straight from PostgreSQL; ``spark_start``: a Spark
  session, paid only when none is running;
- ``parallel_overlap``: how much of the shorter parallel fetches still shows (0: only the
  slowest counts; 1: they might as well have run one after the other). Parallel fetches from
  one engine whose connector reads one statement at a time (``CONCURRENT_READS``: PostgreSQL's
  reads share one ADBC connection) add up before that: a join of a split object with a
  PostgreSQL dimension fetches twice from PostgreSQL, one read after the other.

``sstore polystore calibrate`` measures them (``sstore.polystore.calibrate``) and stores them as
JSON; without that the defaults below hold (measured once on a 2-core development machine).

Repeated queries: a move kept as a cache is paid once. Its cost shrinks to a freshness check
when the source is unchanged (the planner input says how many rows are cached), and a caller who
expects to run a query ``repeats`` times may spread the first move over those runs.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field

from sstore.polystore.plan import ISLAND, Fetch, Move, Plan, Run

KINDS = ("streaming", "postgres", "spark", ISLAND)

#: Whether an engine kind's connector runs several reads at once (``connectors``): the
#: streaming engine gives each read a cursor of its own and Spark runs jobs side by side, but
#: PostgreSQL's reads take its one ADBC connection in turn (opening one costs ~70 ms).
CONCURRENT_READS: dict[str, bool] = {"streaming": True, "postgres": False, "spark": True,
                                     ISLAND: True}


@dataclass
class CostModel:
    fixed: dict[str, float] = field(default_factory=lambda: {
        "streaming": 0.0008, "postgres": 0.004, "spark": 0.35, ISLAND: 0.001})
    fetch: dict[str, float] = field(default_factory=lambda: {
        "streaming": 2e-9, "postgres": 4e-8, "spark": 3e-7, ISLAND: 1e-9})
    fetch_row: dict[str, float] = field(default_factory=lambda: {
        "streaming": 0.0, "postgres": 3e-7, "spark": 0.0, ISLAND: 0.0})
    load: dict[str, float] = field(default_factory=lambda: {
        "streaming": 2e-8, "postgres": 1.5e-7, "spark": 2e-7, ISLAND: 0.0})
    store_fixed: dict[str, float] = field(default_factory=lambda: {
        "streaming": 0.004, "postgres": 0.006, "spark": 0.05, ISLAND: 0.0})
    fingerprint: dict[str, float] = field(default_factory=lambda: {
        "streaming": 1e-8, "postgres": 1.5e-7, "spark": 3e-7, ISLAND: 0.0})
    process: dict[str, float] = field(default_factory=lambda: {
        "streaming": 2e-9, "postgres": 2e-8, "spark": 5e-8, ISLAND: 2e-9})
    spark_jdbc: float = 3e-7
    spark_start: float = 12.0
    parallel_overlap: float = 0.5
    measured: str = "defaults (not calibrated on this machine)"

    # ------------------------------------------------------------------ persistence
    @classmethod
    def read(cls, path: str | None) -> CostModel:
        """The stored constants at ``path``; the defaults when there is none."""
        if path is None or not os.path.exists(path):
            return cls()
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        model = cls()
        for name, value in data.items():
            if hasattr(model, name):
                setattr(model, name, value)
        return model

    def write(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(asdict(self), f, indent=2)

    # ------------------------------------------------------------------ pricing
    def value(self, term: str) -> float:
        """A constant by its term name: ``fixed.postgres``, ``spark_start``."""
        group, _, kind = term.partition(".")
        found = getattr(self, group)
        return float(found[kind] if kind else found)

    def scale(self, term: str, factor: float) -> None:
        """Multiply one constant (refitting, ``sstore.polystore.learning``)."""
        group, _, kind = term.partition(".")
        if kind:
            getattr(self, group)[kind] *= factor
        else:
            setattr(self, group, getattr(self, group) * factor)

    def price(self, plan: Plan, kinds: dict[str, str], *, spark_running: bool = False,
              repeats: int = 1) -> Plan:
        """Set ``plan.cost`` (seconds), ``plan.cost_detail`` (seconds per part) and
        ``plan.cost_terms`` (the price as a sum of constants times counts: what a refit from
        measured times adjusts). ``kinds`` maps engine names to kinds (``island`` to itself)."""
        parts: dict[str, Terms] = {}
        fetches = self._fetch_lanes([s for s in plan.steps if isinstance(s, Fetch)], kinds)
        if fetches:
            slowest = max(fetches, key=self._sum)
            merged = Terms()
            for terms in fetches:
                merged.add(terms, 1.0 if terms is slowest else self.parallel_overlap)
            parts["fetch"] = merged
        moves = [self._move(s, kinds, max(1, repeats)) for s in plan.steps if isinstance(s, Move)]
        if moves:
            merged = Terms()
            for terms in moves:
                merged.add(terms)
            parts["move"] = merged
        parts["run"] = self._run(plan.final, kinds)
        if (not spark_running and "spark" in {kinds[e] for e in plan.engines()}):
            parts["spark start"] = Terms({"spark_start": 1.0})
        plan.cost_detail = {name: self._sum(terms) for name, terms in parts.items()}
        total = Terms()
        for terms in parts.values():
            total.add(terms)
        plan.cost_terms = dict(total)
        plan.cost = sum(plan.cost_detail.values()) if plan.feasible else math.inf
        return plan

    def _sum(self, terms: Terms) -> float:
        return sum(count * self.value(term) for term, count in terms.items())

    def _fetch_lanes(self, steps: list[Fetch], kinds: dict[str, str]) -> list[Terms]:
        """The plan's fetches as parallel lanes: each fetch its own lane, except that the
        fetches from one engine whose connector reads one statement at a time share a lane
        (their terms add up)."""
        lanes: list[Terms] = []
        serial: dict[str, Terms] = {}
        for step in steps:
            terms = self._fetch(step, kinds)
            if CONCURRENT_READS.get(kinds[step.engine], True):
                lanes.append(terms)
            elif step.engine in serial:
                serial[step.engine].add(terms)
            else:
                serial[step.engine] = terms
                lanes.append(terms)
        return lanes

    def _fetch(self, step: Fetch, kinds: dict[str, str]) -> Terms:
        kind = kinds[step.engine]
        return Terms({f"fixed.{kind}": 1.0, f"fetch.{kind}": step.rows * step.columns,
                      f"fetch_row.{kind}": step.rows})

    def _move(self, step: Move, kinds: dict[str, str], repeats: int) -> Terms:
        """A cast: read at the source, write at the target. A cached move first checks its
        copy, and the check is priced by what it reads:

        - a growing source (an engine stream, a sink-fed PostgreSQL table): the copy's note at
          the target, and one question at the source (a stream: one pass over its batch-id
          column; a sink-fed table: its watermark row); then only the new rows move, in one
          append (``fresh``: rows the copy lacks), and a table's new rows are found by a scan
          of its batch-id column;
        - any other source: its fingerprint, a hash of every value (a scan), and a changed
          source is copied whole.

        A first copy (nothing cached yet) may be spread over ``repeats`` expected runs."""
        source, target = kinds[step.source], kinds[step.target]
        fresh = max(0, step.rows - step.cached_rows)
        values = fresh * step.columns
        if source == "postgres" and target == "spark":
            return Terms({f"store_fixed.{target}": 1.0, "spark_jdbc": values})
        copy = Terms({f"fixed.{source}": 1.0, f"store_fixed.{target}": 1.0,
                      f"fetch.{source}": values, f"fetch_row.{source}": fresh,
                      f"load.{target}": values})
        if not step.cache_key:
            return copy
        check = Terms({f"fixed.{source}": 1.0, f"fixed.{target}": 1.0})
        if step.incremental_by is None:
            check.add(Terms({f"fingerprint.{source}": step.rows * step.columns}))
        elif source == "streaming":
            check.add(Terms({f"process.{source}": step.rows}))
        if fresh == 0:
            return check
        if step.incremental_by is not None and source != "streaming" and step.cached_rows:
            copy.add(Terms({f"process.{source}": step.rows}))  # finding the new batches: a scan
        check.add(copy, 1.0 / repeats if step.cached_rows == 0 else 1.0)
        return check

    def _run(self, final: Run, kinds: dict[str, str]) -> Terms:
        kind = kinds[final.engine]
        return Terms({f"fixed.{kind}": 1.0,
                      f"process.{kind}": final.input_rows * final.input_columns,
                      f"fetch.{kind}": final.output_rows * final.output_columns,
                      f"fetch_row.{kind}": final.output_rows})


class Terms(dict[str, float]):
    """A price as constants times counts: ``{"fixed.postgres": 2, "fetch.postgres": 1e6}``."""

    def add(self, other: Terms, factor: float = 1.0) -> None:
        for term, count in other.items():
            self[term] = self.get(term, 0.0) + factor * count
