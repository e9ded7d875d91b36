"""Running batches: the runtime, the scheduler, transactions, the executor and group commit,
the one ingest path, back-pressure, GC, recovery, the lifecycle of an engine, stops and halts,
the consumer port. Imports ``sstore.base``, ``sstore.dataflow`` and ``sstore.storage`` only
(test_layers); the ``Engine`` (``sstore.engine``) sits on top of it.
"""
