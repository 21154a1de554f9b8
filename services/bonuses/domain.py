"""Bonus rules as data: which ledger entries a payment's order status calls for. No I/O.

The ledger converges on the order's *current* status rather than replaying transitions in
arrival order, so retries and reordering between `order.*` messages can't leave a refunded
payment with a bonus or a paid one without it:

* PAID or SETTLED: a `grant` (once ever); if it was clawed back, a `restore` (once ever).
* REFUNDED: if granted and not clawed back, a `clawback` (once ever).
* anything else: nothing.

Net per payment = grant - clawback + restore = BONUS_POINTS while PAID/SETTLED, else 0. The
one case the (payment, kind) key can't follow is a second refund after a reversal: the
clawback is already used, so the net stays BONUS_POINTS (logged; an operator decides).
"""

from __future__ import annotations

from collections.abc import Set
from enum import StrEnum

_EARNING = frozenset({"PAID", "SETTLED"})


class EntryKind(StrEnum):
    GRANT = "grant"
    CLAWBACK = "clawback"
    RESTORE = "restore"


SIGN = {EntryKind.GRANT: 1, EntryKind.CLAWBACK: -1, EntryKind.RESTORE: 1}


def entries_due(order_status: str, existing: Set[EntryKind]) -> list[EntryKind]:
    """The entries to add so the ledger matches `order_status`."""
    if order_status in _EARNING:
        if EntryKind.GRANT not in existing:
            return [EntryKind.GRANT]
        if EntryKind.CLAWBACK in existing and EntryKind.RESTORE not in existing:
            return [EntryKind.RESTORE]
        return []
    refunded = order_status == "REFUNDED"
    if refunded and EntryKind.GRANT in existing and EntryKind.CLAWBACK not in existing:
        return [EntryKind.CLAWBACK]
    return []


def balance(entries: Set[EntryKind], points: int) -> int:
    return sum(SIGN[kind] * points for kind in entries)
