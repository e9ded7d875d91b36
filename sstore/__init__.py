"""sstore: a transactional streaming ETL engine over a polystore (S-Store in front of BigDAWG).

Streams are cut into atomic batches; each stored procedure run on a batch is one ACID
transaction over DuckDB state; results move exactly once into PostgreSQL.
"""

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
                           OutOfOrderBatchError,
                           ProcedureError,
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

__version__ = "0.1.0"

__all__ = [
    "BackpressureError", "BatchIdTakenError", "Bound", "Coalesced", "Coalescer",
    "CoalescerFailed", "CommitEvent", "ConsumerStalledError",
    "DeclarationError", "Engine", "ErrorPolicy", "IngestTimeoutError", "Ingested", "InputLogError",
    "OutOfOrderBatchError", "ProcedureError", "ResendMismatchError", "SStoreError", "SchemaError",
    "Subscription", "TerminalError", "Transaction", "TransactionStateError", "TransientError",
    "TxState", "UnknownStreamError", "__version__",
]
