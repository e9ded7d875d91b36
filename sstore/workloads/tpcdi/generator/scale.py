"""How many of everything a scale factor asks for.

TPC-DI scales linearly: 130,000 Batch1 trades, 5,000 HR rows and 5,000 customer actions,
500 companies and 800 securities per unit of SF. Trades scale exactly (the audit and the
scaling tests rely on it). The dimensions get small floors instead, so that SF 0.01 still
has enough companies, accounts and changes for every case the DimTrade rules distinguish.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_SCALE_FACTOR = 0.01
TRADES_PER_SF = 130_000
#: DIGen's TSUpdateCount (its Generator_audit.csv says 1828.0): Batch1 covers this many
#: trading days, so an incremental batch (one day) creates 130,000 x SF / 1,828 new trades
#: (rounded up, as DIGen's TSTradesPerDay is: 214 at SF 3).
TRADE_DAYS = 1_828
#: Floor of new trades per incremental batch, so that small SFs still exercise CDC inserts.
MIN_INCREMENTAL_TRADES = 5


def _round(x: float) -> int:
    """Round half up (``round`` rounds half to even, which surprises in row counts)."""
    return math.floor(x + 0.5)


@dataclass(frozen=True)
class Sizes:
    """Row counts for one scale factor; see the module docstring for the floors."""

    scale_factor: float
    trades_batch1: int
    trades_per_incremental_batch: int
    hr_rows: int
    companies: int
    securities: int
    customer_actions: int
    new_customers: int          # per incremental batch (Customer.txt I rows)
    updated_customers: int      # per incremental batch (U rows, still ACTV)
    inactivated_customers: int  # per incremental batch (U rows, INAC)
    added_accounts: int         # per incremental batch, for existing customers (I rows)
    updated_accounts: int       # per incremental batch (U rows, still ACTV)
    closed_accounts: int        # per incremental batch (U rows, INAC)

    @classmethod
    def for_scale_factor(cls, scale_factor: float) -> Sizes:
        """The sizes for ``scale_factor`` (>= 0.01)."""
        if not scale_factor >= MIN_SCALE_FACTOR:  # also rejects NaN
            raise ValueError(f"scale factor must be >= {MIN_SCALE_FACTOR}, got {scale_factor}")
        sf = float(scale_factor)
        trades = _round(TRADES_PER_SF * sf)
        # DIGen's CScaling/AScaling: 5 Customer.txt and 10 Account.txt rows per batch per SF,
        # 70% inserts, 20% updates, the rest inactivations (DIGen SF 3: 11/3/1 and 21/6/3).
        # A new customer's first account is one of the account inserts.
        customer_rows, account_rows = _round(5 * sf), _round(10 * sf)
        new_customers = max(2, _round(0.7 * customer_rows))
        updated_customers = max(1, _round(0.2 * customer_rows))
        account_inserts, updated_accounts = _round(0.7 * account_rows), _round(0.2 * account_rows)
        return cls(
            scale_factor=sf,
            trades_batch1=trades,
            trades_per_incremental_batch=max(MIN_INCREMENTAL_TRADES,
                                             math.ceil(trades / TRADE_DAYS - 1e-9)),
            hr_rows=max(30, _round(5_000 * sf)),
            companies=max(12, _round(500 * sf)),
            securities=max(20, _round(800 * sf)),
            customer_actions=max(100, _round(5_000 * sf)),
            new_customers=new_customers,
            updated_customers=updated_customers,
            inactivated_customers=max(1, customer_rows - new_customers - updated_customers),
            added_accounts=max(1, account_inserts - new_customers),
            updated_accounts=max(1, updated_accounts),
            closed_accounts=max(1, account_rows - account_inserts - updated_accounts),
        )
