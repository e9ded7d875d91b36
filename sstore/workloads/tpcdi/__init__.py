"""TPC-DI on sstore: the DimTrade workload (the S-Store paper's headline ETL benchmark).

TPC's own data generator (DIGen) may not be redistributed, so ``generator`` writes source files
with the same names, layouts and rules; the pipelines that load them live beside it.
"""
