-- TPC-C ORDERS (TPC-C v5.11, clause 1.3.1), the table of the paper's UNION experiment
-- (Figure 5b): recent orders still in the streaming engine, the rest in PostgreSQL.
--
-- One definition for both engines: PostgreSQL runs it as is; the streaming engine (DuckDB)
-- gets it through sqlglot (sstore.workloads.tpcc.orders.create_orders). Re-runnable.

CREATE TABLE IF NOT EXISTS orders (
    o_id          integer   NOT NULL,
    o_d_id        smallint  NOT NULL,
    o_w_id        integer   NOT NULL,
    o_c_id        integer   NOT NULL,
    o_entry_d     timestamp NOT NULL,
    o_carrier_id  smallint,            -- NULL until the order is delivered
    o_ol_cnt      smallint  NOT NULL,
    o_all_local   smallint  NOT NULL,
    PRIMARY KEY (o_w_id, o_d_id, o_id)
);
