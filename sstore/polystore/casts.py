"""Casts and procedure calls of island queries: ``bdcast(...)`` makes a table in an engine
from a query's rows, ``bdstream(CALL p(...))`` runs a streaming procedure on one row.

A part of ``Polystore`` (``sstore.polystore.polystore`` mixes it in), kept apart because
writing is one job: every other path of the polystore only reads. Everything is checked before
anything runs (``_check_before_running``), so a refused outer query never leaves an inner cast's
table behind; a cast never takes over an existing catalog object or table unless the caller
says ``replace=True``.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING

import pyarrow as pa
from sqlglot import exp

from sstore.base.readonly import UncheckableQueryError, check_query
from sstore.polystore.catalog import Catalog, EngineKind
from sstore.polystore.connectors import Connector, StreamingConnector
from sstore.polystore.scratch import (
    CastExistsError,
    ProtectedObjectError,
    cast_table,
    is_cast,
)
from sstore.polystore.sqltext import QueryError, parse
from sstore.polystore.syntax import Cast, IslandQuery


class Casts:
    """The writing half of ``Polystore`` (the attributes are the polystore's own)."""

    catalog: Catalog
    dialect: str
    _connectors: dict[str, Connector]

    if TYPE_CHECKING:  # the polystore's own: a connector by name; plan and run ``parsed``
        def connector(self, name: str) -> Connector: ...

        def _answer(self, parsed: IslandQuery) -> pa.Table: ...

    def _check_before_running(self, parsed: IslandQuery) -> None:
        """Every SQL part is a plain query and every cast has a plain name, before any cast
        runs: a refused outer query must not leave an inner cast's table behind."""
        for cast in parsed.casts:
            self._check_before_running(cast.query)
            cast_table(self.catalog.engine(self._island_engine(cast.engine)).kind, cast.name)
        if parsed.call is None:
            self._check_sql(parsed.sql)

    def _check_sql(self, sql: str) -> None:
        """``check_query``; SQL that does not parse is the ``QueryError`` that shows where."""
        try:
            check_query(sql, self.dialect)
        except UncheckableQueryError:
            parse(sql, self.dialect)
            raise

    def _run_casts(self, parsed: IslandQuery, replace: bool) -> None:
        """Each cast, innermost first: its query's rows become a new table in the target
        engine's scratch namespace, registered under the cast's name.

        1. The name must be plain (no schema) and not name a catalog object that is not an
           earlier cast (a user's table, a stream): ``ProtectedObjectError``.
        2. If the scratch table exists, only ``replace`` lets the cast replace it
           (``CastExistsError`` otherwise), checked before the query runs and again in the
           transaction that creates the table.
        3. The rows are stored (``mode="create"`` or ``"replace"``; connectors refuse any
           table outside sstore's schemas), then the name is registered."""
        for cast in parsed.casts:
            self._run_casts(cast.query, replace)
            target = self._island_engine(cast.engine)
            connector = self.connector(target)
            physical = cast_table(connector.kind, cast.name)
            self._check_cast_target(cast, target, physical, replace)
            rows = (self._call_procedure(*cast.query.call) if cast.query.call is not None
                    else self._answer(cast.query))
            connector.store(physical, rows, mode="replace" if replace else "create")
            self.catalog.register(cast.name, target, physical,
                                  {f.name: str(f.type) for f in rows.schema}, replace=True)

    def _check_cast_target(self, cast: Cast, target: str, physical: str, replace: bool) -> None:
        existing = self.catalog.find(cast.name)
        if existing is not None:
            others = [f for f in existing.fragments
                      if not is_cast(self.catalog.engine(f.engine).kind, f.physical)]
            if others:
                where = ", ".join(f"{f.engine}:{f.physical}" for f in others)
                raise ProtectedObjectError(
                    f"bdcast: {cast.name!r} already names {where} in the catalog; a cast makes "
                    f"a new object and never takes over an existing one: choose another name")
        connector = self.connector(target)
        if isinstance(connector, StreamingConnector) and connector.read_only:
            connector.check_writable(physical)  # says why, before the cast's query runs
        if not replace and connector.exists(physical):
            raise CastExistsError(
                f"bdcast: {physical} already exists in engine {target!r} (an earlier cast "
                f"named {cast.name!r}); pass replace=True (sstore query --replace) to replace "
                f"it, or choose another name")

    def _island_engine(self, name: str) -> str:
        """An engine name, or an island's name standing for its first engine."""
        kinds = {"relational": EngineKind.POSTGRES, "streaming": EngineKind.STREAMING,
                 "spark": EngineKind.SPARK}
        if name in self.catalog.engines:
            return name
        if name.lower() in kinds:
            for entry in self.catalog.engines.values():
                if entry.kind is kinds[name.lower()]:
                    return entry.name
        raise QueryError(f"bdcast: no engine or island named {name!r}")

    def _call_procedure(self, procedure: str, arguments: str) -> pa.Table:
        """``bdstream(CALL p(v, ...))``: one row as one batch into ``p``'s input stream; the
        answer is ``p``'s output for that batch."""
        for connector in self._connectors.values():
            if not isinstance(connector, StreamingConnector) or connector.engine is None:
                continue
            decl = connector.engine.graph.procedures.get(procedure)
            if decl is None:
                continue
            values = parse(f"SELECT {arguments}", self.dialect)
            row = tuple(e.to_py() if isinstance(e, (exp.Literal, exp.Null))
                        else _literal_value(e) for e in values.expressions)
            engine = connector.engine
            batch_id = int(engine.ingest(decl.inputs[0], [row]))
            engine.run_until_idle()
            for output in decl.outputs:
                latest = engine.latest(output)
                if latest is not None and latest[0] == batch_id:
                    return latest[1]
            return pa.table({"batch_id": [batch_id]})
        raise QueryError(f"no running streaming engine here has a procedure {procedure!r} "
                         f"(pass the live engine to Polystore(engines=...))")


def _literal_value(node: exp.Expression) -> object:
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
        value = node.this.to_py()
        if isinstance(value, (int, float, Decimal)):
            return -value
    raise QueryError(f"CALL takes literal values; got {node.sql()!r}")
