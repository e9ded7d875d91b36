"""A model that checks every path (issue 34): a plain-Python model of what every stream, table
and warehouse target of one small, fixed dataflow must hold, and a hypothesis state machine
that drives the real system (engine, Coalescer, one-shot and continuous sinks, ``sstore
migrate``, restarts, SIGKILLs and stops by signal at crash points, a private PostgreSQL stopped
and started) through random programs and compares it with the model after every step.

- ``dataflow``: the dataflow (declared the same way by the machine and its crash child) and
  what each of its outputs must hold for a batch (pure functions).
- ``expected``: the model's state (committed batches, progress, tables, the target) and the
  comparison with the real system's.
- ``system``: the real system: the engine in either durability mode, the PostgreSQL target.
- ``child``: the crash child, SIGKILLed (or stopped by SIGTERM / SIGINT) at a named crash
  point (``sstore.base.faults``).
- ``machine``: the rules of the engine (one per operation and misuse); its mixins
  ``warehouse`` (sinks, ``sstore migrate``, the target by hand), ``outages`` (PostgreSQL
  restarts) and ``processes`` (SIGKILL, SIGTERM, SIGINT of a child); ``context``: the
  switches and counters.
- ``run``: runs the machine for a time budget on a private PostgreSQL and reports
  (``python -m benchmarks.chaos --model``); ``tests/benchmarks/test_model.py`` runs a CI budget.
"""
