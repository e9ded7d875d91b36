-- TPC-DI data warehouse tables for DimTrade and the dimensions it looks up (TPC-DI v1.1.0,
-- clause 3.2), plus the Audit table of Appendix A and our rejects table.
--
-- Re-runnable: every statement is CREATE ... IF NOT EXISTS. The schema name is the psql
-- variable :"schema", so this file runs as is with
--     psql -v schema=tpcdi -f schemas/tpcdi.sql
-- and sstore.workloads.tpcdi.warehouse.create_warehouse substitutes a quoted identifier.
--
-- Types: surrogate keys (SK_*) and natural ids bigint; prices numeric(8,2), fees, commissions
-- and taxes numeric(10,2); CHAR(n) of the specification is varchar(n) (no blank padding);
-- flags boolean. Surrogate keys are assigned by the ETL, so no identity columns. There are no
-- foreign keys on purpose: the audit (sstore.workloads.tpcdi.audit) reports dangling keys
-- instead of a loader failing half-way through a batch.

CREATE SCHEMA IF NOT EXISTS :"schema";

-- Reference tables ---------------------------------------------------------------------------

CREATE TABLE IF NOT EXISTS :"schema".dimdate (
    sk_dateid         bigint PRIMARY KEY,          -- yyyymmdd
    datevalue         date NOT NULL UNIQUE,
    datedesc          varchar(20),
    calendaryearid    integer,
    calendaryeardesc  varchar(20),
    calendarqtrid     integer,
    calendarqtrdesc   varchar(20),
    calendarmonthid   integer,
    calendarmonthdesc varchar(20),
    calendarweekid    integer,
    calendarweekdesc  varchar(20),
    dayofweeknum      integer,
    dayofweekdesc     varchar(10),
    fiscalyearid      integer,
    fiscalyeardesc    varchar(20),
    fiscalqtrid       integer,
    fiscalqtrdesc     varchar(20),
    holidayflag       boolean
);

CREATE TABLE IF NOT EXISTS :"schema".dimtime (
    sk_timeid         bigint PRIMARY KEY,          -- hhmmss
    timevalue         time NOT NULL UNIQUE,
    hourid            integer,
    hourdesc          varchar(20),
    minuteid          integer,
    minutedesc        varchar(20),
    secondid          integer,
    seconddesc        varchar(20),
    markethoursflag   boolean,
    officehoursflag   boolean
);

CREATE TABLE IF NOT EXISTS :"schema".statustype (
    st_id             varchar(4) PRIMARY KEY,
    st_name           varchar(10) NOT NULL
);

CREATE TABLE IF NOT EXISTS :"schema".tradetype (
    tt_id             varchar(3) PRIMARY KEY,
    tt_name           varchar(12) NOT NULL,
    tt_is_sell        boolean NOT NULL,            -- NUM(1) 0/1 in the specification
    tt_is_mrkt        boolean NOT NULL
);

CREATE TABLE IF NOT EXISTS :"schema".industry (
    in_id             varchar(2) PRIMARY KEY,
    in_name           varchar(50) NOT NULL,
    in_sc_id          varchar(4) NOT NULL
);

CREATE TABLE IF NOT EXISTS :"schema".taxrate (
    tx_id             varchar(4) PRIMARY KEY,
    tx_name           varchar(50) NOT NULL,
    tx_rate           numeric(6,5) NOT NULL
);

-- Dimensions (all but DimBroker change as type 2: EffectiveDate, EndDate, IsCurrent). NOT NULL
-- only on keys, status and the version columns; descriptive fields may be missing in a source.

CREATE TABLE IF NOT EXISTS :"schema".dimbroker (
    sk_brokerid       bigint PRIMARY KEY,
    brokerid          bigint NOT NULL,
    managerid         bigint,
    firstname         varchar(50),
    lastname          varchar(50),
    middleinitial     varchar(1),
    branch            varchar(50),
    office            varchar(50),
    phone             varchar(14),
    iscurrent         boolean NOT NULL,
    batchid           integer NOT NULL,
    effectivedate     date NOT NULL,
    enddate           date NOT NULL
);
CREATE INDEX IF NOT EXISTS dimbroker_brokerid ON :"schema".dimbroker (brokerid);

CREATE TABLE IF NOT EXISTS :"schema".dimcompany (
    sk_companyid      bigint PRIMARY KEY,
    companyid         bigint NOT NULL,             -- the CIK
    status            varchar(10) NOT NULL,
    name              varchar(60) NOT NULL,
    industry          varchar(50),
    sprating          varchar(4),
    islowgrade        boolean,
    ceo               varchar(100),
    addressline1      varchar(80),
    addressline2      varchar(80),
    postalcode        varchar(12),
    city              varchar(25),
    stateprov         varchar(20),
    country           varchar(24),
    description       varchar(150),
    foundingdate      date,
    iscurrent         boolean NOT NULL,
    batchid           integer NOT NULL,
    effectivedate     date NOT NULL,
    enddate           date NOT NULL
);
CREATE INDEX IF NOT EXISTS dimcompany_companyid ON :"schema".dimcompany (companyid, effectivedate);
CREATE INDEX IF NOT EXISTS dimcompany_name ON :"schema".dimcompany (name, effectivedate);

CREATE TABLE IF NOT EXISTS :"schema".dimsecurity (
    sk_securityid     bigint PRIMARY KEY,
    symbol            varchar(15) NOT NULL,
    issue             varchar(6),
    status            varchar(10) NOT NULL,
    name              varchar(70),
    exchangeid        varchar(6),
    sk_companyid      bigint NOT NULL,
    sharesoutstanding bigint,
    firsttrade        date,
    firsttradeonexchange date,
    dividend          numeric(10,2),
    iscurrent         boolean NOT NULL,
    batchid           integer NOT NULL,
    effectivedate     date NOT NULL,
    enddate           date NOT NULL
);
CREATE INDEX IF NOT EXISTS dimsecurity_symbol ON :"schema".dimsecurity (symbol, effectivedate);

CREATE TABLE IF NOT EXISTS :"schema".dimcustomer (
    sk_customerid     bigint PRIMARY KEY,
    customerid        bigint NOT NULL,
    taxid             varchar(20),
    status            varchar(10) NOT NULL,
    lastname          varchar(30),
    firstname         varchar(30),
    middleinitial     varchar(1),
    gender            varchar(1),
    tier              smallint,
    dob               date,
    addressline1      varchar(80),
    addressline2      varchar(80),
    postalcode        varchar(12),
    city              varchar(25),
    stateprov         varchar(20),
    country           varchar(24),
    phone1            varchar(30),
    phone2            varchar(30),
    phone3            varchar(30),
    email1            varchar(50),
    email2            varchar(50),
    nationaltaxratedesc varchar(50),
    nationaltaxrate   numeric(6,5),
    localtaxratedesc  varchar(50),
    localtaxrate      numeric(6,5),
    agencyid          varchar(30),
    creditrating      integer,
    networth          bigint,
    marketingnameplate varchar(100),
    iscurrent         boolean NOT NULL,
    batchid           integer NOT NULL,
    effectivedate     date NOT NULL,
    enddate           date NOT NULL
);
CREATE INDEX IF NOT EXISTS dimcustomer_customerid
    ON :"schema".dimcustomer (customerid, effectivedate);

CREATE TABLE IF NOT EXISTS :"schema".dimaccount (
    sk_accountid      bigint PRIMARY KEY,
    accountid         bigint NOT NULL,
    sk_brokerid       bigint NOT NULL,
    sk_customerid     bigint NOT NULL,
    status            varchar(10) NOT NULL,
    accountdesc       varchar(50),
    taxstatus         smallint,                    -- 0, 1 or 2
    iscurrent         boolean NOT NULL,
    batchid           integer NOT NULL,
    effectivedate     date NOT NULL,
    enddate           date NOT NULL
);
CREATE INDEX IF NOT EXISTS dimaccount_accountid ON :"schema".dimaccount (accountid, effectivedate);

-- DimTrade: one row per trade. Lookup keys may be NULL here so that a trade whose lookup
-- failed is still stored and then reported by the audit ("every SK joins").

CREATE TABLE IF NOT EXISTS :"schema".dimtrade (
    tradeid           bigint PRIMARY KEY,
    sk_brokerid       bigint,
    sk_createdateid   bigint NOT NULL,
    sk_createtimeid   bigint NOT NULL,
    sk_closedateid    bigint,
    sk_closetimeid    bigint,
    status            varchar(10) NOT NULL,
    type              varchar(12) NOT NULL,
    cashflag          boolean NOT NULL,
    sk_securityid     bigint,
    sk_companyid      bigint,
    quantity          integer NOT NULL,
    bidprice          numeric(8,2) NOT NULL,
    sk_customerid     bigint,
    sk_accountid      bigint,
    executedby        varchar(64),
    tradeprice        numeric(8,2),
    fee               numeric(10,2),
    commission        numeric(10,2),
    tax               numeric(10,2),
    batchid           integer NOT NULL
);
CREATE INDEX IF NOT EXISTS dimtrade_batchid ON :"schema".dimtrade (batchid);

-- Messages of the ETL (alerts, validation counts, phase completion records).

CREATE TABLE IF NOT EXISTS :"schema".dimessages (
    messagedateandtime timestamp NOT NULL,
    batchid           integer NOT NULL,
    messagesource     varchar(30),
    messagetext       varchar(50) NOT NULL,
    messagetype       varchar(12) NOT NULL,
    messagedata       varchar(100)
);
CREATE INDEX IF NOT EXISTS dimessages_batch_source
    ON :"schema".dimessages (batchid, messagesource, messagetype);

-- The audit data of the generator (the *_audit.csv files), as Appendix A expects it.
-- DValue is plain numeric: DIGen writes values such as 31557600000 that overflow NUM(15,5).

CREATE TABLE IF NOT EXISTS :"schema".audit (
    dataset           varchar(20) NOT NULL,
    batchid           integer NOT NULL,
    date              date,
    attribute         varchar(50) NOT NULL,
    value             bigint,
    dvalue            numeric
);

-- Source lines a reader refused (wrong field count, unparsable number or date, missing key).

CREATE TABLE IF NOT EXISTS :"schema".rejects (
    reject_id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source_file       text NOT NULL,
    batch_id          integer,
    line_number       bigint,
    raw_line          text,
    reason            text NOT NULL,
    rejected_at       timestamptz NOT NULL DEFAULT now()
);
