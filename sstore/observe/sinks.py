"""What a sink shows the engine's metrics: ``SinkSnapshot`` and ``ObservableSink``.

They live in the core (``sstore.execution.sink_view``), which backpressure reads too; this module
keeps the names where sinks written against ``sstore.observe`` import them.
"""

from sstore.execution.sink_view import ObservableSink, SinkSnapshot

__all__ = ["ObservableSink", "SinkSnapshot"]
