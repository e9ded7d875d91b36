"""Golden fixtures of the planner rules: one file per rule in tests/fixtures/planner/.

A fixture gives a catalog (engines, objects, fragment sizes), one query, and the plans the rule
must propose, as ``Plan.describe(costs=False)`` prints them (the SQL of every step). Regenerate
after a deliberate change with ``python -m tests.planner_golden --update`` and review the diff.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from sstore.polystore.catalog import CatalogObject, EngineEntry, EngineKind, Fragment
from sstore.polystore.meaning import kept_types
from sstore.polystore.plan import Delivered
from sstore.polystore.planning import FragmentStats, PlanningInput
from sstore.polystore.rules import CHECKS, REWRITES, RULES
from sstore.polystore.sqltext import parse

FIXTURES = Path(__file__).parent / "fixtures" / "planner"


@dataclass
class Golden:
    path: Path
    rule: str
    header: list[str]
    query: str
    expected: str

    def planning_input(self) -> PlanningInput:
        engines: dict[str, EngineEntry] = {}
        objects: list[CatalogObject] = []
        stats: dict[Fragment, FragmentStats] = {}
        cached: dict[str, int] = {}
        delivered: dict[Fragment, Delivered] = {}
        types: dict[tuple[str, str], dict[str, str]] = {}
        for line in self.header:
            word, *args = line.split()
            if word == "engine":
                engines[args[0]] = EngineEntry(args[0], EngineKind(args[1]), "")
            elif word == "object":
                frags = [Fragment(*a.split(":", 1)) for a in args[1:]]
                objects.append(CatalogObject(args[0], frags))
            elif word == "stats":
                fields = dict(a.split("=", 1) for a in args[1:])
                stats[Fragment(*args[0].split(":", 1))] = FragmentStats(
                    int(fields["rows"]), fields["columns"].split(","), fields.get("growing"))
            elif word == "types":  # types ENGINE:TABLE col=type ...: what the probe read
                engine, table = args[0].split(":", 1)
                types[(engine, table)] = dict(a.split("=", 1) for a in args[1:])
            elif word == "cached":
                cached[args[0]] = int(args[1])
            elif word == "delivered":  # delivered STREAM_FRAGMENT INTO_FRAGMENT: a sink
                stream, into = Fragment(*args[0].split(":", 1)), Fragment(*args[1].split(":", 1))
                delivered[stream] = Delivered(f"sstore_delivered_{len(delivered)}", into.engine,
                                              into.physical, stream.physical, None,
                                              stream.engine)
        tree = parse(self.query)
        names = [n for n in _names(tree)]
        used = [o for o in objects if o.name in names]
        return PlanningInput(tree, tuple(used), engines, stats, cached, delivered=delivered,
                             kept_columns=kept_types(types))

    def actual(self) -> str:
        """A proposing rule: the plans it proposes. A rewrite: the plans every proposing
        rule makes of the rewritten input. A check: what it keeps of every rule's plans."""
        rewrites = {r.__name__: r for r in REWRITES}
        checks = {c.__name__: c for c in CHECKS}
        if self.rule in checks:
            inp = self.planning_input()
            plans = checks[self.rule](inp, [plan for rule in RULES for plan in rule(inp)])
        elif self.rule in rewrites:
            inp = rewrites[self.rule](self.planning_input())
            plans = [plan for rule in RULES for plan in rule(inp)]
        else:
            plans = {r.__name__: r for r in RULES}[self.rule](self.planning_input())
        return "\n\n".join(p.describe(costs=False) for p in plans) or "(no plan)"


def _names(tree):
    from sstore.polystore.sqltext import table_names
    return table_names(tree)


def load(path: Path) -> Golden:
    rule, header, query, expected, section = "", [], [], [], ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("-- rule:"):
            rule = line.split(":", 1)[1].strip()
        elif line.strip() in ("-- catalog:", "-- query:", "-- expect:"):
            section = line.strip()[3:-1]
        elif section == "catalog" and line.startswith("--"):
            header.append(line[2:].strip())
        elif section == "query":
            query.append(line)
        elif section == "expect":
            expected.append(line)
    return Golden(path, rule, header, "\n".join(query).strip(), "\n".join(expected).strip())


def fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.sql"))


def update() -> None:
    for path in fixtures():
        golden = load(path)
        text = path.read_text(encoding="utf-8")
        head = text[:text.index("-- expect:")]
        path.write_text(f"{head}-- expect:\n{golden.actual()}\n", encoding="utf-8")
        print(f"updated {path.name}")


if __name__ == "__main__":
    if "--update" in sys.argv:
        update()
