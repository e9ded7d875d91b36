"""Reference files: StatusType, TradeType, Date, Time, Industry, TaxRate (Batch1) and the
BatchDate.txt of every batch.

None of these depend on the seed or the scale factor: they are the same in every run, as
DIGen's static files are. Date.txt follows the DimDate rules of the layouts document (US week
numbers, fiscal year = date + 183 days, holiday flags); DimTrade's date and time keys are
looked up in these two files.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

from .dates import BATCH_DATES, DATE_TABLE_FIRST, DATE_TABLE_LAST
from .reference_data import INDUSTRIES, STATUS_TYPES, TAX_RATES, TRADE_TYPES
from .report import FileReport
from .writer import pipe, write_lines

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_FISCAL_SHIFT = dt.timedelta(days=183)


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _week_start(day: dt.date) -> dt.date:
    """The Sunday that starts ``day``'s US week."""
    return day - dt.timedelta(days=day.isoweekday() % 7)


def us_week(day: dt.date) -> int:
    """US week number: weeks start on Sunday, week 1 holds 1 January; a late-December week
    that already holds the next 1 January is week 1 of the same calendar year."""
    start = _week_start(day)
    if start + dt.timedelta(days=6) >= dt.date(day.year + 1, 1, 1):
        return 1
    return (start - _week_start(dt.date(day.year, 1, 1))).days // 7 + 1


def date_row(day: dt.date) -> str:
    """One Date.txt line (18 fields)."""
    year, month = day.year, day.month
    quarter = (month - 1) // 3 + 1
    week = us_week(day)
    fiscal = day + _FISCAL_SHIFT
    fiscal_quarter = (fiscal.month - 1) // 3 + 1
    holiday = (day.day == 1 and month <= 9) or (month == 12 and day.day == 25)
    return pipe((
        day.strftime("%Y%m%d"), day.isoformat(), f"{_MONTHS[month - 1]} {day.day}, {year}",
        year, year, f"{year}{quarter}", f"{year} Q{quarter}",
        f"{year}{month}", f"{year} {_MONTHS[month - 1]}",
        f"{year}{week}", f"{year}-W{week}",
        day.isoweekday(), _DAYS[day.isoweekday() - 1],
        fiscal.year, fiscal.year, f"{fiscal.year}{fiscal_quarter}",
        f"{fiscal.year} Q{fiscal_quarter}", _flag(holiday),
    ))


def _date_rows() -> Iterator[str]:
    day = DATE_TABLE_FIRST
    one = dt.timedelta(days=1)
    while day <= DATE_TABLE_LAST:
        yield date_row(day)
        day += one


def _time_rows() -> Iterator[str]:
    for hour in range(24):
        for minute in range(60):
            for second in range(60):
                hhmmss = hour * 10_000 + minute * 100 + second
                h, m, s = f"{hour:02d}", f"{minute:02d}", f"{second:02d}"
                yield (f"{h}{m}{s}|{h}:{m}:{s}|{h}|{h}|{m}|{h}:{m}|{s}|{h}:{m}:{s}|"
                       f"{_flag(93_000 <= hhmmss <= 160_000)}|"
                       f"{_flag(80_000 <= hhmmss <= 170_000)}")


def write_reference(root: Path) -> list[FileReport]:
    """Write the reference files of Batch1 and BatchDate.txt of every batch."""
    files = [
        write_lines(root, "Batch1/StatusType.txt", (pipe(row) for row in STATUS_TYPES)),
        write_lines(root, "Batch1/TradeType.txt", (pipe(row) for row in TRADE_TYPES)),
        write_lines(root, "Batch1/Date.txt", _date_rows()),
        write_lines(root, "Batch1/Time.txt", _time_rows()),
        write_lines(root, "Batch1/Industry.txt", (pipe(row) for row in INDUSTRIES)),
        write_lines(root, "Batch1/TaxRate.txt", (pipe(row) for row in TAX_RATES)),
    ]
    for batch, day in BATCH_DATES.items():
        files.append(write_lines(root, f"Batch{batch}/BatchDate.txt", [day.isoformat()]))
    return files
