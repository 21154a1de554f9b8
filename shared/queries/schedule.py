"""The reconciler's schedule: which orders are due for a question to the provider, claimed a
class at a time (migration 014), and when each is due again.

An order is due RECONCILE_AFTER after its last change (`next_check_at` NULL: the orders
worker clears it with every change), then at the `next_check_at` each question sets:
- flagged undecided: RECONCILE_INTERVAL later during the flag's first day, then as long again
  as the order has been unchanged; whatever its age (the PayhooksOrderUndecided alert ages it);
- PENDING and AMOUNT_MISMATCH: a quarter of the time the order has been unchanged, at least
  RECONCILE_INTERVAL (asked at 15 min, 19, 24, 30, ... with the defaults: about 35 questions
  in 30 days for a cart nobody pays, and a late payment whose webhook was lost is found
  within a quarter of the order's age);
- every other state: as long again as the order has been unchanged, at least
  RECONCILE_INTERVAL (15 min, 30, 1 h, 2 h, ... : about a dozen questions in 30 days);
never past RECONCILE_HORIZON after the last change; the question at the horizon is the last
('infinity'). A flagged order is due at once (flag_undecided sets `next_check_at` to now).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import asyncpg

from shared.db import Executor
from shared.vocabulary import RECONCILE_CLASSES

# The classes of migration 014's payhooks_check_class, in the order they are asked.
UNDECIDED, MONEY, SETTLEMENT, RECHECK = 0, 1, 2, 3
CLASS_NAMES: Final = RECONCILE_CLASSES


@dataclass(frozen=True, slots=True)
class Timing:
    after_s: float  # RECONCILE_AFTER
    interval_s: float  # RECONCILE_INTERVAL
    horizon_s: float  # RECONCILE_HORIZON

    @property
    def lease_s(self) -> float:
        """How long a claimed order is the claimer's: longer than a question can take (the
        provider client's 30 s deadline), so only an unfinished one comes back."""
        return max(60.0, 2 * self.interval_s)


_CLASS = "payhooks_check_class(status, undecided_since)"
_AFTER = "make_interval(secs => $2)"
_HORIZON = "make_interval(secs => $4)"

# When an order is due again once the provider has answered about it (the module's rules).
_NEXT = f"""(
    CASE
    WHEN o.undecided_since > now() - interval '1 day' THEN now() + make_interval(secs => $5)
    WHEN o.undecided_since IS NOT NULL
         THEN now() + greatest(make_interval(secs => $5), now() - o.updated_at)
    WHEN o.updated_at + {_HORIZON} <= now() THEN 'infinity'
    ELSE least(o.updated_at + {_HORIZON}, now() + greatest(
        make_interval(secs => $5),
        (now() - o.updated_at)
            * CASE WHEN o.status IN ('PENDING', 'AMOUNT_MISMATCH') THEN 0.25 ELSE 1 END))
    END
)"""

# Due orders of class $1, at most $3, the most overdue first; leased for $6 seconds in the same
# statement, so other reconcilers skip them (SKIP LOCKED, and the recheck of the due condition
# on a row another claim has just moved on), and a question that never ends (a crash, the
# broker or the database gone half-way) is asked again once the lease runs out. `next_due` is
# when it is due after an answer (schedule_next). `checked_at` is when the answer was sought.
_CLAIM = f"""
WITH rescheduled AS (
    SELECT payment_id, next_check_at AS due_at FROM orders
    WHERE {_CLASS} = $1 AND next_check_at <= now()
    ORDER BY next_check_at LIMIT $3
    FOR UPDATE SKIP LOCKED
), changed AS (
    SELECT payment_id, updated_at + {_AFTER} AS due_at FROM orders
    WHERE {_CLASS} = $1 AND next_check_at IS NULL AND updated_at <= now() - {_AFTER}
      {{horizon}}
    ORDER BY updated_at LIMIT $3
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT payment_id, due_at
    FROM (SELECT * FROM rescheduled UNION ALL SELECT * FROM changed) d
    ORDER BY due_at LIMIT $3
), claimed AS (
UPDATE orders o SET
    reconciled_at = now(),
    next_check_at = now() + make_interval(secs => $6)
FROM picked WHERE o.payment_id = picked.payment_id
RETURNING o.payment_id, o.status, o.amount, o.currency, o.refunded_amount, o.refunded_at,
          o.refund_ids, o.reversed_refund_ids, o.updated_at, o.undecided_since,
          o.reconciled_at AS checked_at, {_CLASS} AS check_class, picked.due_at,
          o.next_check_at AS lease_until, {_NEXT} AS next_due
)
SELECT * FROM claimed ORDER BY due_at
"""
# A flagged order is asked about however old its last change; the others only within the
# horizon (the range keeps the scan to the orders changed within it).
_CLAIM_BY_CLASS: Final = {
    k: _CLAIM.format(horizon="" if k == UNDECIDED else f"AND updated_at > now() - {_HORIZON}")
    for k in range(len(CLASS_NAMES))
}


async def claim_due(
    conn: Executor, check_class: int, limit: int, timing: Timing
) -> list[asyncpg.Record]:
    """At most `limit` due orders of one class, the most overdue first, each leased."""
    if limit <= 0:
        return []
    return await conn.fetch(
        _CLAIM_BY_CLASS[check_class],
        check_class,
        timing.after_s,
        limit,
        timing.horizon_s,
        timing.interval_s,
        timing.lease_s,
    )


async def schedule_next(conn: Executor, answered: Sequence[asyncpg.Record]) -> None:
    """Claimed orders the provider has answered about: due again at their `next_due`, unless
    something changed the order's schedule since the claim (a change: due RECONCILE_AFTER
    after it; a flag: due at once)."""
    await conn.execute(
        "UPDATE orders o SET next_check_at = t.next_due"
        " FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[])"
        " AS t(payment_id, next_due, lease_until)"
        " WHERE o.payment_id = t.payment_id AND o.next_check_at = t.lease_until",
        [r["payment_id"] for r in answered],
        [r["next_due"] for r in answered],
        [r["lease_until"] for r in answered],
    )


async def reschedule_now(conn: Executor, payment_ids: Sequence[str]) -> None:
    """Claimed orders the reconciler did not get to ask about (the provider was failing):
    due again at the next pass."""
    await conn.execute(
        "UPDATE orders SET next_check_at = now() WHERE payment_id = ANY($1::text[])",
        list(payment_ids),
    )


_BACKLOG = f"""
SELECT {_CLASS} AS check_class, count(*) AS due,
       coalesce(extract(epoch FROM now() - min(due_at)), 0) AS overdue_s
FROM (
    SELECT status, undecided_since, next_check_at AS due_at FROM orders
    WHERE next_check_at <= now()
    UNION ALL
    SELECT status, undecided_since, updated_at + {_AFTER} FROM orders
    WHERE next_check_at IS NULL AND updated_at <= now() - {_AFTER}
      AND (updated_at > now() - make_interval(secs => $1) OR undecided_since IS NOT NULL)
) due GROUP BY 1
"""


@dataclass(frozen=True, slots=True)
class ClassBacklog:
    due: int
    overdue_s: float  # how long the most overdue order of the class has been due


async def backlog(conn: Executor, timing: Timing) -> dict[str, ClassBacklog]:
    """Each class's due orders: how many, and how long the most overdue has waited."""
    rows = await conn.fetch(_BACKLOG, timing.horizon_s, timing.after_s)
    found = {r["check_class"]: ClassBacklog(int(r["due"]), float(r["overdue_s"])) for r in rows}
    return {name: found.get(k, ClassBacklog(0, 0.0)) for k, name in enumerate(CLASS_NAMES)}
