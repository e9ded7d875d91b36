"""The base of the core: errors, retries, SQL and DuckDB helpers, rows and values, fingerprints,
fault points, durable file replacement. Imports nothing else of sstore (test_layers).
"""
