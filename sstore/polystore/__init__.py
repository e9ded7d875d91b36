"""The polystore: one SQL entry point over the streaming engine, PostgreSQL and Spark.

``Polystore(catalog).query(sql) -> pyarrow.Table`` takes plain SQL over catalog names or
BigDAWG's island syntax (``bdrel``, ``bdstream``, ``bdcast``). A query that touches one engine
runs there whole; otherwise the planner's rules propose plans (migrate then run, pull into the
island, Spark) and a calibrated cost model picks one. Queries only read
(``ReadOnlyQueryError`` otherwise); casts and caches are written only into sstore's own schemas
(``ProtectedObjectError``, ``CastExistsError``). See docs/polystore.md.
"""

from sstore.base.readonly import ReadOnlyQueryError
from sstore.polystore.catalog import Catalog, EngineKind, UnknownObjectError
from sstore.polystore.cost import CostModel
from sstore.polystore.plan import Plan
from sstore.polystore.polystore import Polystore
from sstore.polystore.scratch import CastExistsError, ProtectedObjectError
from sstore.polystore.sqltext import QueryError

__all__ = ["CastExistsError", "Catalog", "CostModel", "EngineKind", "Plan", "Polystore",
           "ProtectedObjectError", "QueryError", "ReadOnlyQueryError", "UnknownObjectError"]
