"""TPC-C ORDERS rows and their split between the streaming engine and PostgreSQL (the data of
the paper's UNION experiment, Figure 5b)."""
