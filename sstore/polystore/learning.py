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

What it learnt outlives the process: ``save`` writes the kept equations (counts and measured
seconds: they do not depend on the constants, so they stay valid after a new calibration) to
``costs.learned.json`` beside the calibrated ``costs.json`` (``learned_path``), atomically
(a temporary file renamed over it), and ``restore`` reads them back and refits, so each
``sstore query`` starts from what the earlier ones measured. The calibrated file is never
rewritten. Two processes saving at once: the last rename wins (the other's newest runs are
lost, never half-written).
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
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


    def save(self, path: str) -> None:
        """Write the kept equations to ``path`` atomically (temporary file, then rename)."""
        data = {"format": 1, "observations": [[terms, seconds]
                                              for terms, seconds in self.observations]}
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".costs-learned-", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def restore(self, path: str, model: CostModel) -> int:
        """Read the equations ``save`` wrote and refit ``model`` from them; the number read.
        A missing file is none; one that is not what ``save`` writes is an error that names
        it (a silent fresh start would hide that the learning is lost)."""
        if not os.path.exists(path):
            return 0
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            found = [(dict(terms), float(seconds)) for terms, seconds in data["observations"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a file of learned cost equations ({exc}); "
                             f"delete it to start learning afresh") from None
        for terms, seconds in found[-self.window:]:
            self.observations.append((terms, seconds))
        while len(self.observations) > self.window:
            self.observations.popleft()
        if self.observations:
            self.refit(model)
        return len(found)


def learned_path(costs_path: str) -> str:
    """Where the equations learnt with the constants at ``costs_path`` are kept:
    ``costs.json`` -> ``costs.learned.json``, beside it."""
    root, ext = os.path.splitext(costs_path)
    return f"{root}.learned{ext or '.json'}"


def learner_for(model: CostModel) -> Learner:
    return Learner(copy.deepcopy(model))
