"""DimTrade as a streaming dataflow of five stored procedures (S-Store's split), fed by trade
events and moved into the PostgreSQL warehouse by the migrator. See docs/tpcdi.md."""
