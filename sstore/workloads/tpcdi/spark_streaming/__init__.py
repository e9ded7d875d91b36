"""DimTrade on Spark Structured Streaming: ``sstore tpcdi run --mode spark-streaming``.

The same five steps as the engine's dataflow, as Spark SQL over micro-batches, with the rules
of ``dimtrade_rules`` / ``dimtrade_spark_rules`` (shared with the engine and the bulk
pipeline). Modules: ``parse`` (step 1, the event lines), ``query`` (the streaming query and
its exactly-once foreachBatch sink), ``run`` (the product mode: dimensions, Batch1-3 fed as
files), ``board`` (waiting for one micro-batch, for the closed-loop benchmark).
"""
