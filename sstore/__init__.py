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
    "Engine": "sstore.engine", "Ingested": "sstore.ingest",
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


if TYPE_CHECKING:  # the names for type checkers: "X as X" re-exports each (PEP 484)
    from sstore.backpressure import Bound as Bound
    from sstore.coalesce import Coalesced as Coalesced
    from sstore.coalesce import Coalescer as Coalescer
    from sstore.coalesce import CoalescerFailed as CoalescerFailed
    from sstore.engine import Engine as Engine
    from sstore.errors import (
        BackpressureError as BackpressureError,
    )
    from sstore.errors import (
        BatchIdTakenError as BatchIdTakenError,
    )
    from sstore.errors import (
        ConsumerStalledError as ConsumerStalledError,
    )
    from sstore.errors import (
        DeclarationError as DeclarationError,
    )
    from sstore.errors import (
        IngestTimeoutError as IngestTimeoutError,
    )
    from sstore.errors import (
        InputLogError as InputLogError,
    )
    from sstore.errors import (
        NondeterministicError as NondeterministicError,
    )
    from sstore.errors import (
        OutOfOrderBatchError as OutOfOrderBatchError,
    )
    from sstore.errors import (
        ProcedureError as ProcedureError,
    )
    from sstore.errors import (
        ProgramChangedError as ProgramChangedError,
    )
    from sstore.errors import (
        ReplayMismatchError as ReplayMismatchError,
    )
    from sstore.errors import (
        ResendMismatchError as ResendMismatchError,
    )
    from sstore.errors import (
        SchemaError as SchemaError,
    )
    from sstore.errors import (
        SStoreError as SStoreError,
    )
    from sstore.errors import (
        TerminalError as TerminalError,
    )
    from sstore.errors import (
        TransactionStateError as TransactionStateError,
    )
    from sstore.errors import (
        TransientError as TransientError,
    )
    from sstore.errors import (
        UnknownStreamError as UnknownStreamError,
    )
    from sstore.graph import ErrorPolicy as ErrorPolicy
    from sstore.ingest import Ingested as Ingested
    from sstore.runtime import CommitEvent as CommitEvent
    from sstore.subscriptions import Subscription as Subscription
    from sstore.transaction import Transaction as Transaction
    from sstore.transaction import TxState as TxState
