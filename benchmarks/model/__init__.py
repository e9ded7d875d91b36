"""A model that checks every path (issue 34): a plain-Python model of what every stream, table
and warehouse target of one small, fixed dataflow must hold, and a hypothesis state machine
that drives the real system (engine, Coalescer, sinks, ``sstore migrate``, restarts, SIGKILLs
at crash points) through random programs and compares it with the model after every step.

- ``dataflow``: the dataflow (declared the same way by the machine and its crash child) and
  what each of its outputs must hold for a batch (pure functions).
- ``expected``: the model's state (committed batches, progress, tables, the target) and the
  comparison with the real system's.
- ``system``: the real system: the engine in either durability mode, the PostgreSQL target.
- ``child``: the crash child, SIGKILLed at a named crash point (``sstore.faults``).
- ``machine``: the rules (one per operation, misuse and fault) and the switches.
- ``run``: runs the machine for a time budget and reports (``python -m benchmarks.chaos
  --model``); ``tests/test_model.py`` runs a CI budget.
"""
