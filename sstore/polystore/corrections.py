"""Per-(query, plan) corrections learnt from measured runs: what shared constants cannot say.

The cost model prices every plan with one set of constants per engine kind
(``sstore.polystore.cost``), and the refit (``sstore.polystore.learning``) adjusts those
constants from the runs the polystore chose. Constants are shared by every query shape and
plan: ``process.island`` prices the island's scan of a UNION, its GROUP BY and its hash join
alike, so a plan whose real work the model gets wrong in a way the other shapes do not (the
island's join over Arrow at a 90% share, measured 2.5 times its estimate where the engine's
plan was 1.5 times) keeps its error: the least-squares fit splits it over the shared terms,
and the shapes the polystore runs most outvote it.

So each measured run also yields a *residual*: measured seconds over what the current
constants price its plan at. Residuals mix two things: how wrong the model is about this plan
of this query, and how loaded the machine was at that moment (on a shared 2-core machine one
plan measured at load 6 and another at load 10 differ by 2x for no fault of the model). So a
residual is divided by the machine's *level* when it was measured (the median residual of the
last ``LEVEL_WINDOW`` runs, whatever their plans), leaving its plan's *relative* error. A plan's
correction is the median of its last ``RECENT`` relative errors (one slow moment does not move
it; a plan that is always wrong is learnt from its first run), times the level now: plans are
compared at today's load. A plan of a query that has never run takes the median relative error
of the plans of the same name in other queries (the island's hash join and GROUP BY over Arrow
are both 2-3x dearer than the model says, relative to the engine's plans: a query that has
learnt it tells the next), or 1 if none has run, at that level. Corrections are computed against
the constants in force, so a refit and a
correction never count the same error twice. Each (query, plan) is named by ``plan_key``: the
plan's name and a digest of the query text.

These are pure functions of the kept observations and the model; ``Learner`` keeps the
observations (and writes them with their keys to ``costs.learned.json``).
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sstore.polystore.cost import CostModel
from sstore.polystore.plan import Plan

RECENT = 5        # relative errors per (query, plan) that make its correction
LEVEL_WINDOW = 9  # runs (of any plan) whose median residual is the machine's level
LIMIT = 8.0       # a relative error stays within [1/LIMIT, LIMIT]

Observation = tuple[dict[str, float], float, str | None]  # cost terms, seconds, plan key


def plan_key(query: str, plan_name: str) -> str:
    """Names one plan of one query in the learnt observations: ``migrate into stream@3f2a..``
    (a digest: the file of learnt observations holds no query text or literal)."""
    digest = hashlib.sha1(query.encode("utf-8")).hexdigest()[:16]
    return f"{plan_name}@{digest}"


def modelled(terms: dict[str, float], model: CostModel) -> float:
    """Seconds ``model``'s constants give a plan with these cost terms."""
    return sum(count * model.value(term) for term, count in terms.items())


@dataclass(frozen=True)
class Corrections:
    relative: dict[str, float] = field(default_factory=dict)  # plan key -> its own error
    level: float = 1.0    # the median residual of the latest runs: the machine now
    by_name: dict[str, float] = field(default_factory=dict)  # plan name -> median error

    def factor(self, key: str) -> float:
        """What the model's price of plan ``key`` is multiplied by: its relative error (for a
        plan of a query no run has measured, that of its name in other queries, else 1) at
        the level now."""
        found = self.relative.get(key)
        if found is None:
            found = self.by_name.get(plan_name(key), 1.0)
        return found * self.level


def plan_name(key: str) -> str:
    """The plan's name in a ``plan_key``."""
    return key.rpartition("@")[0] or key


def corrections(observations: Iterable[Observation], model: CostModel,
                recent: int = RECENT, level_window: int = LEVEL_WINDOW,
                limit: float = LIMIT) -> Corrections:
    """Each plan key's relative error (the median of its last ``recent``, each residual
    divided by the level when it was measured) and the level now; ``observations`` oldest
    first."""
    latest: deque[float] = deque(maxlen=level_window)
    errors: dict[str, list[float]] = {}
    values: dict[str, float] = {}  # each constant looked up once (this runs at every planning)
    for terms, seconds, key in observations:
        priced = 0.0
        for term, count in terms.items():
            value = values.get(term)
            if value is None:
                value = values[term] = model.value(term)
            priced += count * value
        if seconds <= 0 or priced <= 0 or not math.isfinite(priced):
            continue
        residual = seconds / priced
        latest.append(residual)
        if key is not None:
            errors.setdefault(key, []).append(residual / statistics.median(latest))
    relative = {key: _bounded(statistics.median(found[-recent:]), limit)
                for key, found in errors.items()}
    names: dict[str, list[float]] = {}
    for key, error in relative.items():
        names.setdefault(plan_name(key), []).append(error)
    by_name = {name: statistics.median(found) for name, found in names.items()}
    return Corrections(relative, statistics.median(latest) if latest else 1.0, by_name)


def apply(plans: Sequence[Plan], found: Corrections) -> None:
    """Scale each priced plan's cost by its correction (``plan.correction`` keeps the factor,
    ``plan.cost_terms`` stay the model's: what the next residual is measured against)."""
    for plan in plans:
        factor = found.factor(plan.learn_key) if plan.learn_key else 1.0
        plan.correction = factor
        if math.isfinite(plan.cost):
            plan.cost *= factor


def _bounded(value: float, limit: float) -> float:
    return min(limit, max(1.0 / limit, value))
