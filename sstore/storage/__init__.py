"""What the state file keeps: system tables, the batch ledger, stream tables, ingested ids,
checkpoints, the input log, consumers and subscriptions, stream and procedure versions, status.
Imports only ``sstore.base`` and ``sstore.dataflow`` (test_layers).
"""
