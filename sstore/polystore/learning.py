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

Shared constants cannot express an error one plan of one query makes and the others do not,
so each observation also carries its plan's key, and ``corrections`` gives every (query, plan)
the residual of its recent runs against the refitted constants (``sstore.polystore.corrections``).

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
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sstore.base.files import write_atomically
from sstore.polystore.corrections import Corrections, Observation, corrections
from sstore.polystore.cost import CostModel


@dataclass
class Learner:
    base: CostModel                     # the calibrated constants (never changed)
    window: int = 200                   # observations kept
    every: int = 3                      # refit after this many new observations
    prior: float = 0.3                  # weight pulling each factor toward 1
    limit: float = 4.0                  # factors stay within [1/limit, limit]
    observations: deque[Observation] = field(default_factory=deque)
    factors: dict[str, float] = field(default_factory=dict)
    _since: int = 0
    _corrections: Corrections | None = None   # computed on demand, dropped on any change

    def observe(self, terms: dict[str, float], seconds: float, model: CostModel,
                key: str | None = None) -> bool:
        """Record one run (its plan's ``cost_terms``, its measured seconds and the plan's
        ``learn_key``); refit ``model`` in place when it is time. Returns whether it
        refitted."""
        if not terms or seconds <= 0:
            return False
        self.observations.append((dict(terms), seconds, key))
        self._corrections = None
        while len(self.observations) > self.window:
            self.observations.popleft()
        self._since += 1
        if self._since < self.every:
            return False
        self._since = 0
        self.refit(model)
        return True

    def corrections(self, model: CostModel) -> Corrections:
        """Each observed (query, plan)'s correction against ``model``'s constants now (kept
        until the next observation or refit: planning asks for it every time)."""
        if self._corrections is None:
            self._corrections = corrections(self.observations, model)
        return self._corrections

    def refit(self, model: CostModel) -> None:
        """Solve for the factors and write ``base * factor`` into ``model``'s constants."""
        self._corrections = None
        names = sorted({t for terms, _s, _k in self.observations for t in terms})
        if not names:
            return
        # relative errors: a 5 ms query counts as much as a 500 ms one
        rows, target = [], []
        for terms, seconds, _key in self.observations:
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
        data = {"format": 2, "observations": [[terms, seconds, key]
                                              for terms, seconds, key in self.observations]}
        write_atomically(path, json.dumps(data))

    def restore(self, path: str, model: CostModel) -> int:
        """Read the equations ``save`` wrote and refit ``model`` from them; the number read.
        A missing file is none; one that is not what ``save`` writes is an error that names
        it (a silent fresh start would hide that the learning is lost). A file of format 1
        (before plan keys) is read with no keys: its runs refit the constants only."""
        if not os.path.exists(path):
            return 0
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            found = [_observation(entry) for entry in data["observations"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a file of learned cost equations ({exc}); "
                             f"delete it to start learning afresh") from None
        for observation in found[-self.window:]:
            self.observations.append(observation)
        while len(self.observations) > self.window:
            self.observations.popleft()
        self._corrections = None
        if self.observations:
            self.refit(model)
        return len(found)


def _observation(entry: list[Any]) -> Observation:
    """One kept run as ``save`` writes it: [terms, seconds] (format 1) or [terms, seconds,
    plan key or null] (format 2)."""
    if len(entry) not in (2, 3):
        raise ValueError(f"an observation has 2 or 3 fields, not {len(entry)}")
    key = entry[2] if len(entry) == 3 else None
    if key is not None and not isinstance(key, str):
        raise TypeError(f"a plan key is a string, not {key!r}")
    terms = {str(t): float(c) for t, c in dict(entry[0]).items()}
    return terms, float(entry[1]), key


def learned_path(costs_path: str) -> str:
    """Where the equations learnt with the constants at ``costs_path`` are kept:
    ``costs.json`` -> ``costs.learned.json``, beside it."""
    root, ext = os.path.splitext(costs_path)
    return f"{root}.learned{ext or '.json'}"


def learner_for(model: CostModel) -> Learner:
    return Learner(copy.deepcopy(model))
