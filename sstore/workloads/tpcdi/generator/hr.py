"""HR.csv: employees, of whom those with job code 314 are the brokers (DimBroker).

Accounts name their broker (CA_B_ID) and trades their executing broker (T_EXEC_NAME) from the
broker ids returned here, so a DimTrade broker lookup can always succeed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .people import person, us_phone
from .rand import Draw
from .report import FileReport
from .scale import Sizes
from .writer import write_lines

BROKER_JOB_CODE = "314"
_OTHER_JOB_CODES = ("647", "47", "364", "48", "393", "266", "534", "658", "262")
_MIN_BROKERS = 3


@dataclass(frozen=True)
class Employee:
    """One HR.csv row (empty strings are NULL fields)."""

    employee_id: int
    manager_id: int
    first_name: str
    last_name: str
    middle_initial: str
    job_code: str
    branch: str
    office: str
    phone: str

    def line(self) -> str:
        return ",".join((str(self.employee_id), str(self.manager_id), self.first_name,
                         self.last_name, self.middle_initial, self.job_code, self.branch,
                         self.office, self.phone))


@dataclass(frozen=True)
class Brokers:
    """What the rest of the generator needs from HR: the broker EmployeeIDs (sorted)."""

    ids: np.ndarray
    file: FileReport


def _job_code(draw: Draw) -> str:
    u = draw.uniform()
    if u < 0.05:
        return ""
    if u < 0.35:
        return BROKER_JOB_CODE
    return draw.pick(_OTHER_JOB_CODES)


def employees(sizes: Sizes, draw: Draw) -> list[Employee]:
    """``sizes.hr_rows`` employees with ids 0.. (about 30% brokers, at least three)."""
    n = sizes.hr_rows
    managers = max(1, n // 10)
    codes = [_job_code(draw) for _ in range(n)]
    missing = _MIN_BROKERS - codes.count(BROKER_JOB_CODE)
    for i in range(n):  # tiny HR tables: promote the first non-brokers until there are enough
        if missing <= 0:
            break
        if codes[i] != BROKER_JOB_CODE:
            codes[i] = BROKER_JOB_CODE
            missing -= 1
    rows: list[Employee] = []
    for i in range(n):
        first, last, middle = person(draw)
        branch = draw.text(20, 30) if draw.chance(0.95) else ""
        office = f"OFFICE{draw.digits(4)}" if draw.chance(0.95) else ""
        phone = us_phone(draw) if draw.chance(0.95) else ""
        rows.append(Employee(i, draw.integer(1, managers), first, last, middle, codes[i],
                             branch, office, phone))
    return rows


def write_hr(root: Path, sizes: Sizes, draw: Draw) -> Brokers:
    """Write Batch1/HR.csv and return the broker ids."""
    rows = employees(sizes, draw)
    report = write_lines(root, "Batch1/HR.csv", (row.line() for row in rows))
    ids = np.array([r.employee_id for r in rows if r.job_code == BROKER_JOB_CODE],
                   dtype=np.int64)
    return Brokers(ids, report)
