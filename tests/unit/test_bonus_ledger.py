"""The bonus ledger's rule (shared/bonus_rules.py): the entries a history calls for."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.bonus_rules import SIGN, EntryKind, Transition, entries_for
from shared.order_machine import TRANSITIONS
from shared.vocabulary import EARNING, OrderStatus

G, C, R = EntryKind.GRANT, EntryKind.CLAWBACK, EntryKind.RESTORE


def history(*statuses: str) -> list[Transition]:
    return [Transition(n, status, f"ev{n}") for n, status in enumerate(statuses, 1)]


def kinds(*statuses: str) -> list[EntryKind]:
    return [e.kind for e in entries_for(history(*statuses))]


def test_paid_then_settled_grants_once() -> None:
    assert kinds("PAID", "SETTLED") == [G]


def test_a_refund_claws_the_grant_back_on_the_refund_transition() -> None:
    entries = entries_for(history("PAID", "REFUNDED"))
    assert [(e.kind, e.transition.id) for e in entries] == [(G, 1), (C, 2)]


def test_refund_reversal_refund_nets_zero_with_an_entry_per_transition() -> None:
    assert kinds("PAID", "REFUNDED", "PAID", "REFUNDED") == [G, C, R, C]
    assert kinds("SETTLED", "REFUNDED", "PAID", "REFUNDED", "PAID") == [G, C, R, C, R]


def test_a_refund_before_any_payment_earns_nothing_until_the_order_is_paid() -> None:
    assert kinds("REFUNDED") == []
    assert kinds("CANCELLED", "AMOUNT_MISMATCH") == []
    assert kinds("REFUNDED", "PAID") == [G]  # a reversal of a refund the order saw first


# Histories the orders worker can make: forward moves (TRANSITIONS) and REFUNDED -> PAID.
def _moves(status: OrderStatus) -> list[OrderStatus]:
    moves = sorted(TRANSITIONS[status])
    return [OrderStatus.PAID] if status is OrderStatus.REFUNDED else moves


@st.composite
def histories(draw: st.DrawFn) -> list[Transition]:
    status, statuses = OrderStatus.PENDING, []
    for _ in range(draw(st.integers(0, 8))):
        moves = _moves(status)
        status = draw(st.sampled_from(moves))
        statuses.append(status.value)
    return history(*statuses)


@given(histories())
def test_net_bonus_is_the_points_while_paid_or_settled_and_zero_otherwise(
    transitions: list[Transition],
) -> None:
    entries = entries_for(transitions)
    final = transitions[-1].to_status if transitions else "PENDING"
    assert sum(SIGN[e.kind] for e in entries) == (1 if final in EARNING else 0)
    assert [e.kind for e in entries].count(G) <= 1
    assert len({e.transition.id for e in entries}) == len(entries)  # one entry per transition


@given(histories())
def test_replaying_any_prefix_of_the_history_adds_only_what_the_whole_history_has(
    transitions: list[Transition],
) -> None:
    # What makes arrival order irrelevant: the entries of a prefix are a prefix of the entries.
    whole = entries_for(transitions)
    for n in range(len(transitions) + 1):
        seen = {t.id for t in transitions[:n]}
        assert entries_for(transitions[:n]) == [e for e in whole if e.transition.id in seen]
