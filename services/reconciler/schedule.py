"""How the provider-call budget is shared between the schedule's classes (SPEC 6).

The reconciler asks about one claim of orders at a time, as many as the provider's rate limit
allows in a second, so that an order that falls due is never more than about a second behind
the ones already in hand. Undecided money (flagged orders, then PENDING and AMOUNT_MISMATCH)
takes up to nine tenths of each claim; PAID orders waiting for their settlement, then the
rechecks of final states, take what is left, and at least that tenth when they have due
orders, so a flood of abandoned carts slows them down but never stops them. Whatever a class
leaves unused goes to the others. Each class is taken most overdue first.
"""

from __future__ import annotations

import math
from typing import Any

import asyncpg

from shared.queries import schedule as schedule_sql
from shared.queries.schedule import MONEY, RECHECK, SETTLEMENT, UNDECIDED, Timing

FIRST: tuple[int, ...] = (UNDECIDED, MONEY)
REST: tuple[int, ...] = (SETTLEMENT, RECHECK)


def claim_size(rate_per_s: float) -> int:
    """One second of questions at the provider's rate limit."""
    return max(1, math.ceil(rate_per_s))


def reserved_for_rest(size: int) -> int:
    """The part of a claim of `size` that undecided money leaves to the other classes."""
    return size // 10


async def claim(pool: asyncpg.Pool[Any], size: int, timing: Timing) -> list[asyncpg.Record]:
    """Up to `size` due orders, shared between the classes as the module says."""
    claimed: list[asyncpg.Record] = []
    first_share = size - reserved_for_rest(size)
    for check_class in FIRST:
        claimed += await schedule_sql.claim_due(
            pool, check_class, first_share - len(claimed), timing
        )
    for check_class in REST:
        claimed += await schedule_sql.claim_due(pool, check_class, size - len(claimed), timing)
    for check_class in FIRST:  # what the other classes left
        claimed += await schedule_sql.claim_due(pool, check_class, size - len(claimed), timing)
    return claimed
