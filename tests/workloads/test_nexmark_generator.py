"""The Nexmark generator: the model's proportions, ids, hot keys, prices and times; the same
events for the same seed whatever the batch boundaries; the files equal the batches."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from sstore.workloads.nexmark import generator as g

N = 120_000  # a bit under two blocks: block edges are crossed


def _events(n: int = N, **kw: object) -> pa.Table:
    return g.events(0, n, g.NexmarkConfig(**kw))  # type: ignore[arg-type]


def test_proportions_are_one_three_forty_six() -> None:
    counts = dict(zip(*pc.value_counts(_events()["event_type"]).flatten(), strict=True))
    counts = {k.as_py(): v.as_py() for k, v in counts.items()}
    assert counts == {g.PERSON: N // 50, g.AUCTION: 3 * N // 50, g.BID: 46 * N // 50}


def test_same_seed_same_events_whatever_the_batches() -> None:
    whole = _events()
    cut = pa.concat_tables(list(g.batches(N, 7_777, g.NexmarkConfig())))
    assert cut.equals(whole)
    middle = g.events(65_000, 66_000, g.NexmarkConfig())  # made alone, across a block edge
    assert middle.equals(whole.slice(65_000, 1_000))
    assert not _events(seed=2).equals(whole)


def test_ids_refer_to_people_and_auctions_of_the_stream() -> None:
    con = duckdb.connect()
    events = _events()
    lead = g.events(0, N + 50 * 20, g.NexmarkConfig())  # the model's lead: ids a bit ahead
    con.register("e", events)
    con.register("later", lead)
    person_ids = con.execute("SELECT p_id FROM e WHERE event_type = 0 ORDER BY 1").fetchall()
    assert [r[0] for r in person_ids] == list(range(1000, 1000 + N // 50))
    auction_ids = con.execute("SELECT a_id FROM e WHERE event_type = 1 ORDER BY 1").fetchall()
    assert [r[0] for r in auction_ids] == list(range(1000, 1000 + 3 * N // 50))
    dangling = con.execute("""
        SELECT count(*) FILTER (WHERE b_auction NOT IN (SELECT a_id FROM later WHERE a_id
                                NOT NULL)),
               count(*) FILTER (WHERE b_bidder NOT IN (SELECT p_id FROM later WHERE p_id
                                NOT NULL)),
               count(*) FILTER (WHERE event_type = 2 AND b_auction > (SELECT max(a_id) FROM e))
        FROM e WHERE event_type = 2""").fetchone()
    assert dangling[0] == 0 and dangling[1] == 0
    assert 0 < dangling[2] < 0.01 * N  # a few bids name an auction not yet made (the lead)
    sellers = con.execute("SELECT count(*) FROM e WHERE event_type = 1 AND a_seller NOT IN "
                      "(SELECT p_id FROM later WHERE p_id NOT NULL)").fetchone()
    assert sellers == (0,)


def test_hot_auctions_bidders_sellers_and_values() -> None:
    con = duckdb.connect()
    con.register("e", _events())
    hot_bids, hot_bidders, n_bids = con.execute(
        "SELECT count(*) FILTER (WHERE (b_auction - 1000) % 100 = 0), "
        "count(*) FILTER (WHERE (b_bidder - 1000) % 100 = 1), count(*) "
        "FROM e WHERE event_type = 2").fetchone()
    assert 0.48 < hot_bids / n_bids < 0.53  # 1 - 1/2, plus the few random ones that hit
    assert 0.73 < hot_bidders / n_bids < 0.78  # 1 - 1/4
    hot_sellers, n_auctions = con.execute(
        "SELECT count(*) FILTER (WHERE (a_seller - 1000) % 100 = 0), count(*) "
        "FROM e WHERE event_type = 1").fetchone()
    assert 0.73 < hot_sellers / n_auctions < 0.78
    row = con.execute("""SELECT min(b_price), max(b_price), median(b_price),
            min(a_category), max(a_category), count(DISTINCT a_category),
            bool_and(a_expires > date_time), bool_and(a_reserve > a_initial_bid),
            count(DISTINCT p_state), count(*) FILTER (WHERE p_state = 'OR')
        FROM e""").fetchone()
    lo, hi, median, cmin, cmax, ncat, expires_later, reserve_above, states, oregon = row
    assert lo >= 1 and hi <= 100_000_000 and 50_000 < median < 200_000  # 10^3 cents median
    assert (cmin, cmax, ncat) == (10, 14, 5) and expires_later and reserve_above
    assert states == 6 and oregon > 0


def test_event_time_follows_the_rate() -> None:
    events = _events(n=20_000, rate=1_000.0)
    ts = events["date_time"].cast(pa.int64()).to_numpy()
    assert (ts[1:] >= ts[:-1]).all()
    assert ts[0] == g.BASE_TIME_MS and ts[-1] - ts[0] == 19_999  # 1,000 events per second
    fast = _events(n=20_000, rate=100_000.0)["date_time"].cast(pa.int64()).to_numpy()
    assert fast[-1] - fast[0] == 199


def test_files_hold_the_same_events(tmp_path: object) -> None:
    paths = g.write_files(str(tmp_path), 10_000, 3_000)
    assert len(paths) == 4
    convert = pacsv.ConvertOptions(column_types=g.FILE_SCHEMA, strings_can_be_null=True)
    names = pacsv.ReadOptions(column_names=g.FILE_SCHEMA.names)
    read = pa.concat_tables([pacsv.read_csv(p, read_options=names, convert_options=convert)
                             for p in paths])
    assert read.equals(g.to_file_table(g.events(0, 10_000)))
