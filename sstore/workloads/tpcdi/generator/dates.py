"""The generator's clock: batch dates, time windows and the date/time text formats.

Times are whole seconds since 1970-01-01 00:00:00 as plain ints or int64 arrays (no time
zones: TPC-DI timestamps are naive). Days are ``seconds // 86400``. Keeping one integer time
axis makes lifecycle arithmetic vectorizable and comparisons exact.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

SECONDS_PER_DAY = 86_400
_EPOCH = dt.datetime(1970, 1, 1)

#: BatchDate of each batch (DIGen's default run). Batch1 holds history up to the end of its day.
BATCH_DATES: Mapping[int, dt.date] = MappingProxyType({
    1: dt.date(2017, 7, 7), 2: dt.date(2017, 7, 8), 3: dt.date(2017, 7, 9),
})
BATCHES: tuple[int, ...] = (1, 2, 3)
INCREMENTAL_BATCHES: tuple[int, ...] = (2, 3)

#: Date.txt covers these days (DimDate); Batch1's audit FirstDay is the first one.
DATE_TABLE_FIRST = dt.date(1950, 1, 1)
DATE_TABLE_LAST = dt.date(2020, 12, 31)

#: Batch1 trades are created from here to the end of Batch1 (five years, about 1,830 days).
TRADES_FIRST = dt.datetime(2012, 7, 7)
#: CustomerMgmt.xml actions span these ten years.
ACTIONS_FIRST = dt.datetime(2007, 7, 7)

#: FINWIRE quarters: 1967Q1 .. 2017Q3 (203 files), as DIGen writes them: the last quarter
#: runs only to the end of Batch1 (2017-07-07). DIGen's audit says FWQuarters 202: the
#: quarters after the first, each of which gets the same number of CMP records.
FINWIRE_FIRST_YEAR = 1967
FINWIRE_QUARTERS = 203


def seconds(moment: dt.datetime | dt.date) -> int:
    """Seconds since the epoch of a naive datetime (a date means its midnight)."""
    if not isinstance(moment, dt.datetime):
        moment = dt.datetime(moment.year, moment.month, moment.day)
    return int((moment - _EPOCH).total_seconds())


def day_number(day: dt.date) -> int:
    """Days since the epoch."""
    return (day - _EPOCH.date()).days


def date_of_day(day: int) -> dt.date:
    """The calendar date of a day number."""
    return _EPOCH.date() + dt.timedelta(days=int(day))


def batch_start(batch: int) -> int:
    """First second of an incremental batch's day (for Batch1: the first trade time)."""
    return seconds(TRADES_FIRST) if batch == 1 else seconds(BATCH_DATES[batch])


def batch_end(batch: int) -> int:
    """First second after a batch (exclusive end of its day)."""
    return seconds(BATCH_DATES[batch]) + SECONDS_PER_DAY


def batch_of(times: np.ndarray) -> np.ndarray:
    """The batch (1, 2, 3) each time falls in, 0 for times after Batch3; -1 stays -1."""
    out = np.zeros(times.shape, dtype=np.int8)
    out[times < batch_end(3)] = 3
    out[times < batch_end(2)] = 2
    out[times < batch_end(1)] = 1
    out[times < 0] = -1
    return out


def quarter_start(index: int) -> int:
    """First second of FINWIRE quarter ``index`` (0 = 1967Q1)."""
    year, q = divmod(index, 4)
    return seconds(dt.date(FINWIRE_FIRST_YEAR + year, 3 * q + 1, 1))


def quarter_end(index: int) -> int:
    """First second after FINWIRE quarter ``index``: the next quarter's start, except for the
    last file, which ends with Batch1's day."""
    return min(quarter_start(index + 1), batch_end(1))


def quarter_name(index: int) -> str:
    """``1967Q1`` style name of FINWIRE quarter ``index``."""
    year, q = divmod(index, 4)
    return f"{FINWIRE_FIRST_YEAR + year}Q{q + 1}"


def quarter_of(moment: int) -> int:
    """FINWIRE quarter index that contains a time."""
    day = date_of_day(moment // SECONDS_PER_DAY)
    return (day.year - FINWIRE_FIRST_YEAR) * 4 + (day.month - 1) // 3


def _iso(times: np.ndarray) -> np.ndarray:
    return np.datetime_as_string(np.asarray(times, dtype=np.int64).astype("datetime64[s]"),
                                 unit="s")


def format_datetimes(times: np.ndarray) -> list[str]:
    """``YYYY-MM-DD HH:MM:SS`` for each time (vectorized: trades have hundreds of thousands)."""
    return [s.replace("T", " ") for s in _iso(times).tolist()]


def format_datetime(moment: int) -> str:
    """``YYYY-MM-DD HH:MM:SS``."""
    return (_EPOCH + dt.timedelta(seconds=moment)).strftime("%Y-%m-%d %H:%M:%S")


def format_action_ts(moment: int) -> str:
    """CustomerMgmt.xml ActionTS: ``YYYY-MM-DDTHH:MM:SS``."""
    return (_EPOCH + dt.timedelta(seconds=moment)).strftime("%Y-%m-%dT%H:%M:%S")


def format_pts(moment: int) -> str:
    """FINWIRE posting time: ``YYYYMMDD-HHMMSS``."""
    return (_EPOCH + dt.timedelta(seconds=moment)).strftime("%Y%m%d-%H%M%S")


def format_compact_date(day: dt.date) -> str:
    """``YYYYMMDD`` (FINWIRE dates)."""
    return day.strftime("%Y%m%d")
