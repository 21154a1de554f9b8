"""Bonus rules as data: the ledger entries an order's transition history calls for (a grant on
the first move into PAID/SETTLED, a clawback on each move out, a restore on each move back).
No I/O."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from shared.vocabulary import EARNING


class EntryKind(StrEnum):
    GRANT = "grant"
    CLAWBACK = "clawback"
    RESTORE = "restore"


SIGN = {EntryKind.GRANT: 1, EntryKind.CLAWBACK: -1, EntryKind.RESTORE: 1}


@dataclass(frozen=True, slots=True)
class Transition:
    id: int
    to_status: str
    event_id: str  # the provider event that caused it


@dataclass(frozen=True, slots=True)
class Entry:
    kind: EntryKind
    transition: Transition


def entries_for(history: Iterable[Transition]) -> list[Entry]:
    """The ledger of an order whose transitions, oldest first, are `history`. Each entry
    belongs to the transition that caused it, so replaying the history committed so far adds
    exactly the entries still missing: net BONUS_POINTS while PAID/SETTLED, else 0."""
    entries = []
    granted = holding = False
    for transition in history:
        earning = transition.to_status in EARNING
        if earning and not holding:
            entries.append(Entry(EntryKind.RESTORE if granted else EntryKind.GRANT, transition))
            granted = holding = True
        elif holding and not earning:
            entries.append(Entry(EntryKind.CLAWBACK, transition))
            holding = False
    return entries
