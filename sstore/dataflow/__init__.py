"""The dataflow: the graph of streams and procedures, windows, event windows, fusion, table
declarations and who may write a stream. Imports only ``sstore.base`` (test_layers).
"""
