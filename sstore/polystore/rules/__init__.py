"""Planner rules: ordered lists of pure functions, one per file.

``REWRITES`` take a ``PlanningInput`` and return a simpler one (applied in order, each to the
result of the one before). ``RULES`` take the rewritten input and return the plans they propose
(possibly none). The planner prices every proposal with the cost model and keeps the cheapest.
``CHECKS`` take the rewritten input and every proposal and keep those that may run
(``keep_meaning``: PostgreSQL's meaning is kept where the final query runs).
Each has a golden fixture (``tests/fixtures/planner/<name>.sql``) with the SQL it must produce.
"""

from sstore.polystore.rules.keep_meaning import keep_meaning
from sstore.polystore.rules.migrate_then_run import migrate_then_run
from sstore.polystore.rules.prune_empty_fragments import prune_empty_fragments
from sstore.polystore.rules.pull_into_island import pull_into_island
from sstore.polystore.rules.run_in_place import run_in_place
from sstore.polystore.rules.run_in_spark import run_in_spark

REWRITES = (prune_empty_fragments,)
RULES = (run_in_place, migrate_then_run, pull_into_island, run_in_spark)
CHECKS = (keep_meaning,)

__all__ = ["CHECKS", "REWRITES", "RULES", "keep_meaning", "migrate_then_run",
           "prune_empty_fragments", "pull_into_island", "run_in_place", "run_in_spark"]
