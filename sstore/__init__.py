"""sstore: a transactional streaming ETL engine over a polystore (S-Store in front of BigDAWG).

Streams are cut into atomic batches; each stored procedure run on a batch is one ACID
transaction over DuckDB state; results move exactly once into PostgreSQL.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it. Loaded on first use (PEP 562), so that
#: ``import sstore`` costs nothing: the ``sstore`` command decides its process's allocator
#: (``sstore.allocator``) before DuckDB and Arrow are loaded.
_EXPORTS = {
    "Bound": "sstore.backpressure",
    "Coalesced": "sstore.coalesce", "Coalescer": "sstore.coalesce",
    "CoalescerFailed": "sstore.coalesce",
    "Engine": "sstore.engine", "Ingested": "sstore.engine",
    **{name: "sstore.errors" for name in (
        "BackpressureError", "BatchIdTakenError", "ConsumerStalledError", "DeclarationError",
        "IngestTimeoutError", "InputLogError", "NondeterministicError", "OutOfOrderBatchError",
        "ProcedureError", "ProgramChangedError", "ReplayMismatchError", "ResendMismatchError",
        "SchemaError", "SStoreError", "TerminalError",
        "TransactionStateError", "TransientError", "UnknownStreamError")},
    "ErrorPolicy": "sstore.graph",
    "CommitEvent": "sstore.runtime",
    "Subscription": "sstore.subscriptions",
    "Transaction": "sstore.transaction", "TxState": "sstore.transaction",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:
    from sstore.backpressure import Bound
    from sstore.coalesce import Coalesced, Coalescer, CoalescerFailed
    from sstore.engine import Engine, Ingested
    from sstore.errors import (
        BackpressureError,
        BatchIdTakenError,
        ConsumerStalledError,
        DeclarationError,
        IngestTimeoutError,
        InputLogError,
        NondeterministicError,
        OutOfOrderBatchError,
        ProcedureError,
        ProgramChangedError,
        ReplayMismatchError,
        ResendMismatchError,
        SchemaError,
        SStoreError,
        TerminalError,
        TransactionStateError,
        TransientError,
        UnknownStreamError,
    )
    from sstore.graph import ErrorPolicy
    from sstore.runtime import CommitEvent
    from sstore.subscriptions import Subscription
    from sstore.transaction import Transaction, TxState
