"""A seeded generator of random PostgreSQL SELECTs over the fuzz world's ``ev`` and ``dim``.

Why its own module: the differential test (``benchmarks.polystore_fuzz``) needs queries that
reach every construct a user writes in PostgreSQL (filters with NULLs, aggregates, DISTINCT,
ORDER BY + LIMIT on a total order, joins of every spelling, UNION ALL, scalar subqueries,
CTEs, CASE, casts, string, date and numeric functions, alias lists), each query tagged with
the features it uses so that mismatches and refusals can be counted by feature. The same seed
gives the same queries. Every query's answer is a multiset PostgreSQL defines exactly: a
LIMIT always follows an ORDER BY over every output column (rows that tie are equal rows).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class FuzzQuery:
    sql: str
    features: frozenset[str]


@dataclass(frozen=True)
class TlpQuery:
    """Ternary-logic partitioning (SQLancer's TLP): ``base``'s rows are, as a multiset, the
    UNION ALL of ``partitions`` (its WHERE p, WHERE NOT p, WHERE p IS NULL), whatever the
    engine. A second oracle that needs no PostgreSQL: for objects PostgreSQL does not hold."""

    base: str
    partitions: str
    features: frozenset[str]


class Generator:
    """``next()`` gives one random query; ``rng`` decides everything."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.features: set[str] = set()

    def next(self) -> FuzzQuery:
        self.features = set()
        shape = self.rng.choice([
            self.plain, self.plain, self.distinct, self.grouped, self.grouped, self.total,
            self.join, self.join, self.natural, self.using, self.union_all, self.scalar_sub,
            self.cte, self.having_sub, self.alias_list, self.where_sub, self.self_join,
            self.lateral, self.in_sub, self.window, self.dim_values, self.moments])
        sql = shape()
        return FuzzQuery(sql, frozenset(self.features))

    def tlp(self, table: str) -> TlpQuery:
        """A TLP pair over ``table`` (any object: the split ``ev``, or the engine's stream
        ``ev_in`` alone, which only the engine answers)."""
        self.features = {"tlp"}
        cols = ", ".join(self.select_list(self.rng.randint(1, 3)))
        p = self.predicate()
        head = f"SELECT {cols} FROM {table}"
        parts = " UNION ALL ".join(f"{head} WHERE {w}"
                                   for w in (f"({p})", f"NOT ({p})", f"({p}) IS NULL"))
        return TlpQuery(head, parts, frozenset(self.features))

    # ------------------------------------------------------------------ pieces
    def tag(self, *names: str) -> None:
        self.features.update(names)

    def pick(self, options: list[tuple[str, str | None]]) -> str:
        sql, feature = self.rng.choice(options)
        if feature:
            self.tag(feature)
        return sql

    def int_expr(self, p: str = "") -> str:
        return self.pick([
            (f"{p}id", None), (f"{p}k", None), (f"{p}id % 3", "modulo"),
            (f"{p}id / 2", "int_division"), (f"abs({p}k - 3)", "numeric_fn"),
            (f"length({p}name)", "string_fn"), (f"extract(month from {p}d)", "date_fn"),
            (f"date_part('year', {p}d)", "date_fn"), (f"CAST({p}amt AS integer)", "cast"),
            (f"coalesce({p}k, -1)", "coalesce"),
            (f"CASE WHEN {p}k > 2 THEN 1 WHEN {p}k IS NULL THEN NULL ELSE 0 END", "case"),
            (f"{p}d - DATE '2024-01-01'", "date_diff"), (f"7 / 2 + {p}k", "int_division"),
            (f"position('b' in {p}name)", "string_fn"), (f"octet_length({p}name)", "string_fn"),
            (f"{p}k::smallint", "cast")])

    def num_expr(self, p: str = "") -> str:
        return self.pick([
            (f"{p}amt", None), (f"round({p}amt, 1)", "numeric_fn"),
            (f"round({p}amt)", "numeric_fn"),
            (f"{p}amt * 2", None), (f"abs({p}amt)", "numeric_fn"), (f"ceil({p}amt)", "numeric_fn"),
            (f"floor({p}amt)", "numeric_fn"), (f"{p}amt / 3", "numeric_division"),
            (f"trunc({p}amt)", "numeric_fn"), (f"round(2.5 + {p}k)", "numeric_fn"),
            (f"CAST({p}k AS numeric) / 4", "cast"), (f"sign({p}amt)", "numeric_fn"),
            (f"greatest({p}amt, 0)", "numeric_fn")])

    def text_expr(self, p: str = "") -> str:
        return self.pick([
            (f"{p}name", None), (f"upper({p}name)", "string_fn"), (f"lower({p}name)", "string_fn"),
            (f"substr({p}name, 2)", "string_fn"), (f"{p}name || 'x'", "concat"),
            (f"replace({p}name, 'a', 'z')", "string_fn"), (f"trim({p}name)", "string_fn"),
            (f"{p}id::text", "cast"), (f"left({p}name, 2)", "string_fn"),
            (f"concat({p}name, {p}k)", "concat"), (f"CAST({p}d AS text)", "cast"),
            (f"concat({p}name, {p}flag)", "concat"), (f"{p}name || {p}flag", "concat"),
            (f"to_hex({p}id)", "string_fn"), (f"initcap({p}name)", "string_fn"),
            (f"reverse({p}name)", "string_fn"), (f"CAST({p}flag AS text)", "cast"),
            (f"lpad({p}name, 4, '*')", "string_fn")])

    def date_expr(self, p: str = "") -> str:
        return self.pick([
            (f"{p}d", None), (f"{p}d + 1", "date_arith"), (f"{p}d - 7", "date_arith"),
            (f"date_trunc('month', {p}d)", "date_fn"), (f"{p}d + interval '1 day'", "date_arith"),
            ("make_date(2024, 2, 29)", "date_fn")])

    def any_expr(self, p: str = "") -> str:
        kind = self.rng.choice([self.int_expr, self.num_expr, self.text_expr, self.date_expr])
        return kind(p)

    def predicate(self, p: str = "", depth: int = 0) -> str:
        self.tag("filter")
        if depth < 1 and self.rng.random() < 0.3:
            op = self.rng.choice(["AND", "OR"])
            return f"({self.predicate(p, depth + 1)} {op} {self.predicate(p, depth + 1)})"
        return self.pick([
            (f"{p}flag", "bool"), (f"NOT {p}flag", "bool"), (f"{p}k > 2", None),
            (f"{p}k IS NULL", "null"), (f"{p}amt IS NOT NULL", "null"),
            (f"{p}name LIKE 'a%'", "like"), (f"{p}name LIKE 'a\\_b'", "like_escape"),
            (f"{p}name ILIKE 'a%'", "like"), (f"{p}k IN (1, 2, NULL)", "null"),
            (f"{p}k NOT IN (1, 2)", None), (f"{p}k BETWEEN 1 AND 3", None),
            (f"{p}amt > 0 AND {p}flag", "bool"), (f"coalesce({p}flag, false)", "coalesce"),
            (f"{p}name IS DISTINCT FROM 'ab'", "null"), (f"{p}d >= DATE '2024-06-01'", None),
            (f"{p}id % 4 = 1", "modulo"), (f"{p}amt < {p}k", None),
            (f"{p}name = 'ab'", None), (f"{p}name ~ '^a'", "regex")])

    def aggregate(self, p: str = "") -> str:
        self.tag("aggregate")
        return self.pick([
            ("count(*)", None), (f"count({p}k)", None), (f"sum({p}amt)", None),
            (f"min({p}name)", None), (f"max({p}d)", None), (f"avg({p}k)", "avg"),
            (f"count(DISTINCT {p}k)", "count_distinct"), (f"bool_and({p}flag)", "bool_agg"),
            (f"every({p}flag)", "bool_agg"), (f"sum({p}k)", None),
            (f"string_agg({p}name, ',' ORDER BY {p}name)", "string_agg"),
            (f"max({p}amt) - min({p}amt)", None),
            (f"count(*) FILTER (WHERE {p}flag)", "agg_filter")])

    def where(self, p: str = "") -> str:
        return f" WHERE {self.predicate(p)}" if self.rng.random() < 0.7 else ""

    def order_limit(self, width: int) -> str:
        if self.rng.random() < 0.4:
            self.tag("order_limit")
            cols = ", ".join(str(i + 1) for i in range(width))
            return f" ORDER BY {cols} LIMIT {self.rng.randint(1, 8)}"
        return ""

    def select_list(self, n: int, p: str = "") -> list[str]:
        return [f"{self.any_expr(p)} AS c{i}" for i in range(n)]

    def ts_expr(self, p: str = "") -> str:
        return self.pick([
            (f"{p}ts", "timestamptz"), (f"{p}ts::date", "timestamptz"),
            (f"extract(hour from {p}ts)", "timestamptz"), (f"CAST({p}ts AS text)", "timestamptz"),
            (f"{p}ts + interval '1 hour'", "timestamptz"),
            (f"date_trunc('day', {p}ts)", "timestamptz"),
            (f"{p}ts > TIMESTAMPTZ '2024-06-01 00:00:00+00'", "timestamptz")])

    # ------------------------------------------------------------------ shapes
    def plain(self) -> str:
        cols = [f"{'e.' if self.rng.random() < 0.3 else ''}id AS c_id",
                *self.select_list(self.rng.randint(1, 3))]
        alias = " AS e" if cols[0].startswith("e.") else ""
        return (f"SELECT {', '.join(cols)} FROM ev{alias}{self.where()}"
                + self.order_limit(len(cols)))

    def distinct(self) -> str:
        self.tag("distinct")
        cols = self.select_list(self.rng.randint(1, 2))
        return f"SELECT DISTINCT {', '.join(cols)} FROM ev{self.where()}" + \
            self.order_limit(len(cols))

    def grouped(self) -> str:
        self.tag("group_by")
        key = self.rng.choice(["k", "flag", "name", self.int_expr(), self.text_expr()])
        aggs = [f"{self.aggregate()} AS a{i}" for i in range(self.rng.randint(1, 3))]
        having = ""
        if self.rng.random() < 0.3:
            self.tag("having")
            having = f" HAVING count(*) > {self.rng.randint(0, 3)}"
        return (f"SELECT {key} AS g, {', '.join(aggs)} FROM ev{self.where()} GROUP BY 1{having}"
                + self.order_limit(len(aggs) + 1))

    def total(self) -> str:
        aggs = [f"{self.aggregate()} AS a{i}" for i in range(self.rng.randint(1, 3))]
        return f"SELECT {', '.join(aggs)} FROM ev{self.where()}"

    def join(self) -> str:
        self.tag("join")
        kind = self.pick([("JOIN", None), ("LEFT JOIN", "left_join"),
                          ("RIGHT JOIN", "right_join"), ("FULL JOIN", "full_join")])
        cols = ["e.id AS c_id", "q.cat AS c_cat", *self.select_list(self.rng.randint(0, 2), "e.")]
        where = f" WHERE {self.predicate('e.')}" if self.rng.random() < 0.5 else ""
        return (f"SELECT {', '.join(cols)} FROM ev AS e {kind} dim AS q ON e.k = q.k{where}"
                + self.order_limit(len(cols)))

    def natural(self) -> str:
        self.tag("natural_join")
        cols = self.rng.choice(["*", "k, name, id, cat", "count(*)", "id, code"])
        return f"SELECT {cols} FROM ev NATURAL JOIN dim"

    def using(self) -> str:
        self.tag("using_join")
        cols = self.rng.choice(["k, id, cat", "*", "k, count(*)"])
        group = " GROUP BY k" if "count" in cols else ""
        return f"SELECT {cols} FROM ev JOIN dim USING (k){self.where('ev.')}{group}"

    def union_all(self) -> str:
        self.tag("union_all")
        return (f"SELECT k, name FROM ev{self.where()} UNION ALL "
                f"SELECT k, name FROM dim WHERE k > {self.rng.randint(0, 4)}")

    def scalar_sub(self) -> str:
        self.tag("scalar_subquery")
        inner = self.rng.choice(["count(*)", "max(id)", "sum(amt)"])
        return (f"SELECT id AS c_id, (SELECT {inner} FROM ev) AS total FROM ev"
                f" WHERE {self.predicate()}")

    def where_sub(self) -> str:
        self.tag("scalar_subquery")
        return (f"SELECT id AS c_id, amt FROM ev WHERE amt > (SELECT avg(amt) FROM ev) "
                f"AND {self.predicate()}")

    def cte(self) -> str:
        self.tag("cte")
        if self.rng.random() < 0.5:
            return (f"WITH c AS (SELECT id, k, amt FROM ev WHERE {self.predicate()}) "
                    f"SELECT c.id AS c_id, (SELECT count(*) FROM ev) AS n FROM c")
        return ("WITH c AS (SELECT k, count(*) AS n FROM ev GROUP BY k) "
                "SELECT c.k, c.n, q.cat FROM c LEFT JOIN dim AS q ON c.k = q.k")

    def having_sub(self) -> str:
        self.tag("having", "scalar_subquery")
        return (f"SELECT k, count(*) AS n FROM ev WHERE {self.predicate()} GROUP BY k "
                f"HAVING count(*) >= (SELECT count(*) FROM ev) / 20")

    def alias_list(self) -> str:
        self.tag("alias_list")
        return self.rng.choice([
            "SELECT q.name FROM dim AS q(k, cat, name)",
            "SELECT x.b, x.a FROM ev AS x(a, b) WHERE x.a < 10",
            "SELECT e.a, q.n FROM ev AS e(a, kk) JOIN dim AS q(kk, c, n) ON e.kk = q.kk",
        ])

    def self_join(self) -> str:
        self.tag("self_join")
        return (f"SELECT a.id AS c_id, b.id AS c_next FROM ev AS a JOIN ev AS b "
                f"ON b.id = a.id + 1 WHERE {self.predicate('a.')}")

    def lateral(self) -> str:
        self.tag("lateral")
        return ("SELECT e.id AS c_id, l.n FROM ev AS e, "
                "LATERAL (SELECT count(*) AS n FROM dim AS q WHERE q.k = e.k) AS l"
                f"{' WHERE ' + self.predicate('e.') if self.rng.random() < 0.5 else ''}")

    def in_sub(self) -> str:
        self.tag("in_subquery")
        return self.rng.choice([
            "SELECT id AS c_id FROM ev WHERE k IN (SELECT k FROM dim WHERE cat IS NOT NULL)",
            "SELECT id AS c_id FROM ev WHERE k NOT IN (SELECT k FROM dim WHERE k > 1)",
            ("SELECT id AS c_id FROM ev AS e WHERE EXISTS (SELECT 1 FROM dim AS q "
             "WHERE q.k = e.k AND q.name = e.name)")])

    def window(self) -> str:
        self.tag("window")
        fn = self.pick([("sum(amt) OVER (PARTITION BY k)", None),
                        ("row_number() OVER (ORDER BY id)", "row_number"),
                        ("count(*) OVER (PARTITION BY flag)", None),
                        ("max(name) OVER (PARTITION BY k ORDER BY id)", None)])
        return f"SELECT id AS c_id, {fn} AS w FROM ev{self.where()}"

    def dim_values(self) -> str:
        self.tag("join")
        expr = self.pick([("q.code = 'ab'", "char_n"), ("length(q.code)", "char_n"),
                          ("q.code || 'x'", "char_n"), ("q.code", "char_n"),
                          ("q.ratio", "numeric_unconstrained"),
                          ("q.ratio * 3", "numeric_unconstrained"),
                          ("CAST(q.code AS varchar)", "char_n")])
        return (f"SELECT e.id AS c_id, {expr} AS v FROM ev AS e JOIN dim AS q ON e.k = q.k"
                f"{' WHERE ' + self.predicate('e.') if self.rng.random() < 0.5 else ''}")

    def moments(self) -> str:
        cols = [f"{self.ts_expr()} AS t{i}" for i in range(self.rng.randint(1, 2))]
        return f"SELECT id AS c_id, {', '.join(cols)} FROM ev{self.where()}"
