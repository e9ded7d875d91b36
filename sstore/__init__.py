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
#: (``sstore.base.allocator``) before DuckDB and Arrow are loaded.
_EXPORTS = {
    "Bound": "sstore.execution.backpressure",
    "Coalesced": "sstore.coalesce", "Coalescer": "sstore.coalesce",
    "CoalescerFailed": "sstore.coalesce",
    "Engine": "sstore.engine", "Ingested": "sstore.execution.ingest",
    **{name: "sstore.base.errors" for name in (
        "BackpressureError", "BatchIdTakenError", "ConsumerStalledError", "DeclarationError",
        "IngestTimeoutError", "InputLogError", "NondeterministicError", "OutOfOrderBatchError",
        "ProcedureError", "ProgramChangedError", "ReplayMismatchError", "ResendMismatchError",
        "SchemaError", "SStoreError", "TerminalError",
        "TransactionStateError", "TransientError", "UnknownStreamError")},
    "ErrorPolicy": "sstore.dataflow.graph",
    "CommitEvent": "sstore.execution.runtime",
    "Subscription": "sstore.storage.subscriptions",
    "Transaction": "sstore.execution.transaction", "TxState": "sstore.execution.transaction",
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


if TYPE_CHECKING:  # the names for type checkers: "X as X" re-exports each (PEP 484)
    from sstore.base.errors import (
        BackpressureError as BackpressureError,
    )
    from sstore.base.errors import (
        BatchIdTakenError as BatchIdTakenError,
    )
    from sstore.base.errors import (
        ConsumerStalledError as ConsumerStalledError,
    )
    from sstore.base.errors import (
        DeclarationError as DeclarationError,
    )
    from sstore.base.errors import (
        IngestTimeoutError as IngestTimeoutError,
    )
    from sstore.base.errors import (
        InputLogError as InputLogError,
    )
    from sstore.base.errors import (
        NondeterministicError as NondeterministicError,
    )
    from sstore.base.errors import (
        OutOfOrderBatchError as OutOfOrderBatchError,
    )
    from sstore.base.errors import (
        ProcedureError as ProcedureError,
    )
    from sstore.base.errors import (
        ProgramChangedError as ProgramChangedError,
    )
    from sstore.base.errors import (
        ReplayMismatchError as ReplayMismatchError,
    )
    from sstore.base.errors import (
        ResendMismatchError as ResendMismatchError,
    )
    from sstore.base.errors import (
        SchemaError as SchemaError,
    )
    from sstore.base.errors import (
        SStoreError as SStoreError,
    )
    from sstore.base.errors import (
        TerminalError as TerminalError,
    )
    from sstore.base.errors import (
        TransactionStateError as TransactionStateError,
    )
    from sstore.base.errors import (
        TransientError as TransientError,
    )
    from sstore.base.errors import (
        UnknownStreamError as UnknownStreamError,
    )
    from sstore.coalesce import Coalesced as Coalesced
    from sstore.coalesce import Coalescer as Coalescer
    from sstore.coalesce import CoalescerFailed as CoalescerFailed
    from sstore.dataflow.graph import ErrorPolicy as ErrorPolicy
    from sstore.engine import Engine as Engine
    from sstore.execution.backpressure import Bound as Bound
    from sstore.execution.ingest import Ingested as Ingested
    from sstore.execution.runtime import CommitEvent as CommitEvent
    from sstore.execution.transaction import Transaction as Transaction
    from sstore.execution.transaction import TxState as TxState
    from sstore.storage.subscriptions import Subscription as Subscription
