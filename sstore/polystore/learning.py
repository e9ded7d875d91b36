"""Refitting the cost model from the times of the plans the polystore ran.

Calibration (``sstore.polystore.calibrate``) measures each constant once, on a scratch table,
on an idle moment. Queries then run on real tables, under real load, with real caches: the
constants drift from what they cost now. Every plan's price is a sum of constants times
counts (``Plan.cost_terms``), so every measured run is one linear equation in the constants.
``Learner`` keeps the last ``window`` equations and, every ``every`` runs, finds one factor
per constant that best explains them (least squares), pulled toward 1 (``prior``: a constant
no run has exercised keeps its calibrated value, and one noisy run moves nothing far), and
kept within ``[1/limit, limit]`` of the calibrated value. As the polystore only observes
the plans it chose, it learns where it spends its time; the prior keeps the rest as measured.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from sstore.polystore.cost import CostModel


@dataclass
class Learner:
    base: CostModel                     # the calibrated constants (never changed)
    window: int = 200                   # observations kept
    every: int = 3                      # refit after this many new observations
    prior: float = 0.3                  # weight pulling each factor toward 1
    limit: float = 4.0                  # factors stay within [1/limit, limit]
    observations: deque[tuple[dict[str, float], float]] = field(default_factory=deque)
    factors: dict[str, float] = field(default_factory=dict)
    _since: int = 0

    def observe(self, terms: dict[str, float], seconds: float, model: CostModel) -> bool:
        """Record one run (its plan's ``cost_terms`` and its measured seconds); refit
        ``model`` in place when it is time. Returns whether it refitted."""
        if not terms or seconds <= 0:
            return False
        self.observations.append((dict(terms), seconds))
        while len(self.observations) > self.window:
            self.observations.popleft()
        self._since += 1
        if self._since < self.every:
            return False
        self._since = 0
        self.refit(model)
        return True

    def refit(self, model: CostModel) -> None:
        """Solve for the factors and write ``base * factor`` into ``model``'s constants."""
        names = sorted({t for terms, _s in self.observations for t in terms})
        if not names:
            return
        # relative errors: a 5 ms query counts as much as a 500 ms one
        rows, target = [], []
        for terms, seconds in self.observations:
            rows.append([terms.get(n, 0.0) * self.base.value(n) / seconds for n in names])
            target.append(1.0)
        a = np.asarray(rows)
        b = np.asarray(target)
        weight = self.prior * len(self.observations) ** 0.5
        lhs = a.T @ a + weight * np.eye(len(names))
        rhs = a.T @ b + weight * np.ones(len(names))
        solved = np.linalg.solve(lhs, rhs)
        fitted = np.clip(solved, 1.0 / self.limit, self.limit)
        self.factors = {n: float(f) for n, f in zip(names, fitted)}
        for name in names:
            current = model.value(name)
            wanted = self.base.value(name) * self.factors[name]
            if current > 0:
                model.scale(name, wanted / current)
        model.measured = (f"{self.base.measured}; refitted from {len(self.observations)} "
                          f"measured runs")


def learner_for(model: CostModel) -> Learner:
    return Learner(copy.deepcopy(model))
