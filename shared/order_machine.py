"""The order state machine: a provider event and an order's state in, a decision out. No I/O.

The D-tags name the decisions where the SPEC is silent (docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, Final, Protocol

from shared.providers.xhub import (
    REFUND_COMPLETED,
    REFUND_FAILED,
    REFUND_REJECTED,
    REFUND_REVERSED,
    STATUS_CHANGED,
)
from shared.providers.xhub.events import CHECKED_STATUSES, InvalidEventError, ProviderEvent
from shared.vocabulary import OrderStatus


class Reason(StrEnum):
    """Why `decide` answered as it did: machine-readable, for logs and metrics labels."""

    TRANSITIONED = "transitioned"
    AMOUNT_MISMATCH = "amount_mismatch"
    AMOUNT_MISMATCH_IGNORED = "amount_mismatch_ignored"
    IGNORED_BACKWARDS = "ignored_backwards"
    NO_STATE_CHANGE = "no_state_change"
    IGNORED_STATUS = "ignored_status"
    IGNORED_EVENT = "ignored_event"
    PARTIAL_REFUND = "partial_refund"
    REFUND_RECORDED = "refund_recorded"
    REFUND_ALREADY_COUNTED = "refund_already_counted"
    CURRENCY_MISMATCH = "currency_mismatch"
    REFUND_REVERSED = "refund_reversed"
    PARTIAL_REFUND_REVERSED = "partial_refund_reversed"
    REVERSAL_BEFORE_REFUND = "reversal_before_refund"
    REFUND_NOT_COUNTED = "refund_not_counted"
    REFUND_ALREADY_REVERSED = "refund_already_reversed"
    REFUND_FAILED = "refund_failed"
    REFUND_REJECTED = "refund_rejected"
    REVERSED_AT_PROVIDER = "reversed_at_provider"
    REFUNDED_BEFORE_REVERSAL = "refunded_before_reversal"


# Events the model cannot decide: the order stays as it is and the provider is asked (D11).
UNDECIDED: Final = frozenset(
    {Reason.REVERSAL_BEFORE_REFUND, Reason.AMOUNT_MISMATCH_IGNORED, Reason.CURRENCY_MISMATCH}
)


S = OrderStatus

# The forward moves (SPEC 5). The one way back, REFUNDED -> PAID, belongs to refund.reversed
# alone and is handled there.
TRANSITIONS: Final[dict[OrderStatus, frozenset[OrderStatus]]] = {
    S.PENDING: frozenset({S.PAID, S.SETTLED, S.REFUNDED, S.CANCELLED, S.AMOUNT_MISMATCH}),
    S.CANCELLED: frozenset({S.PAID, S.SETTLED, S.REFUNDED, S.AMOUNT_MISMATCH}),
    S.AMOUNT_MISMATCH: frozenset({S.PAID, S.SETTLED, S.REFUNDED}),
    S.PAID: frozenset({S.SETTLED, S.REFUNDED}),
    S.SETTLED: frozenset({S.REFUNDED}),
    S.REFUNDED: frozenset(),
}
# Money always beats non-money: a non-money status may only leave PENDING (D1).
NON_MONEY_SOURCES: Final = frozenset({S.PENDING})

STATUS_TARGETS: Final[Mapping[str, OrderStatus]] = {
    "paid": S.PAID,
    "settled": S.SETTLED,
    "refunded": S.REFUNDED,
    "expired": S.CANCELLED,
    "cancelled": S.CANCELLED,
    "failed": S.CANCELLED,
    "amount_mismatch": S.AMOUNT_MISMATCH,
}
MONEY_STATUSES: Final = frozenset({"paid", "settled", "refunded"})
REFUND_FAILURES: Final[Mapping[str, Reason]] = {
    REFUND_FAILED: Reason.REFUND_FAILED,
    REFUND_REJECTED: Reason.REFUND_REJECTED,
}


class Row(Protocol):
    """A database row by column name (asyncpg.Record, a dict); keeps this module free of I/O."""

    def __getitem__(self, column: str, /) -> Any: ...


@dataclass(frozen=True, slots=True)
class OrderState:
    status: OrderStatus
    amount: Decimal
    currency: str
    refunded_amount: Decimal = Decimal(0)
    refunded_at: datetime | None = None  # provider time of the refund that made it REFUNDED
    refund_ids: frozenset[str] = field(default_factory=frozenset)  # refunds already counted
    reversed_refund_ids: frozenset[str] = field(default_factory=frozenset)  # never count (D7)
    changed_at: datetime | None = None  # when we last changed the order (our clock)

    @classmethod
    def from_row(cls, row: Row) -> OrderState:
        """From an `orders` row (lock_orders, or the reconciler's claim_due)."""
        return cls(
            status=OrderStatus(row["status"]),
            amount=row["amount"],
            currency=row["currency"],
            refunded_amount=row["refunded_amount"],
            refunded_at=row["refunded_at"],
            refund_ids=frozenset(row["refund_ids"]),
            reversed_refund_ids=frozenset(row["reversed_refund_ids"]),
            changed_at=row["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class DomainEvent:
    name: str  # "order.<to_status lower>", the routing key bonuses and emails bind to
    from_status: OrderStatus
    to_status: OrderStatus


@dataclass(frozen=True, slots=True)
class Decision:
    new_state: OrderState | None  # None: nothing to write
    events: tuple[DomainEvent, ...]  # the transitions actually made
    reason: Reason


def decide(state: OrderState, event: ProviderEvent) -> Decision:
    """What `event` does to an order in `state`: the new state to save and events to publish."""
    if event.event_type == STATUS_CHANGED:
        return _status_changed(state, event)
    if event.event_type == REFUND_COMPLETED:
        return _refund_completed(state, event)
    if event.event_type == REFUND_REVERSED:
        return _refund_reversed(state, event)
    if event.event_type in REFUND_FAILURES:
        return _unchanged(REFUND_FAILURES[event.event_type])  # D10
    return _unchanged(Reason.IGNORED_EVENT)


def _target(state: OrderState, event: ProviderEvent) -> OrderStatus | None:
    """The status a status_changed event names for this order (AMOUNT_MISMATCH when its money
    differs, D1); None for pending or a status we do not know."""
    status = event.status or ""
    if status in CHECKED_STATUSES and not _money_matches(state, event):
        return S.AMOUNT_MISMATCH
    return STATUS_TARGETS.get(status)


def _status_changed(state: OrderState, event: ProviderEvent) -> Decision:
    status = event.status or ""
    target = _target(state, event)
    if target is None:
        return _unchanged(Reason.IGNORED_STATUS)  # pending, or a status we do not know
    mismatch = target is S.AMOUNT_MISMATCH and status in CHECKED_STATUSES
    if target == state.status:
        return _unchanged(Reason.NO_STATE_CHANGE)
    if _refund_before_reversal(state, event, target):
        return _unchanged(Reason.REFUNDED_BEFORE_REVERSAL)
    if _reversed_at_provider(state, event, target):
        back = replace(state, status=target, refunded_amount=Decimal(0), refunded_at=None)
        return _moved(state, back, Reason.REVERSED_AT_PROVIDER)  # D11
    money = status in MONEY_STATUSES
    if target not in TRANSITIONS[state.status] or not (money or state.status in NON_MONEY_SOURCES):
        return _unchanged(Reason.AMOUNT_MISMATCH_IGNORED if mismatch else Reason.IGNORED_BACKWARDS)
    new_state = replace(state, status=target)
    if target is S.REFUNDED:  # the provider says the whole payment went back
        new_state = replace(new_state, refunded_amount=state.amount, refunded_at=event.occurred_at)
    return _moved(state, new_state, Reason.AMOUNT_MISMATCH if mismatch else Reason.TRANSITIONED)


def _refund_completed(state: OrderState, event: ProviderEvent) -> Decision:
    refund_id, amount = _refund_of(event)
    if refund_id in state.refund_ids:
        return _unchanged(Reason.REFUND_ALREADY_COUNTED)
    if refund_id in state.reversed_refund_ids:
        return _unchanged(Reason.REFUND_ALREADY_REVERSED)  # D7
    if not _same_currency(state, event):
        return _unchanged(Reason.CURRENCY_MISMATCH)  # D8
    total = state.refunded_amount + amount
    counted = replace(
        state, refunded_amount=min(total, state.amount), refund_ids=state.refund_ids | {refund_id}
    )  # D4
    if state.status is S.REFUNDED:
        return Decision(counted, (), Reason.REFUND_RECORDED)  # D5
    if total >= state.amount and S.REFUNDED in TRANSITIONS[state.status]:
        refunded = replace(counted, status=S.REFUNDED, refunded_at=event.occurred_at)
        return _moved(state, refunded, Reason.TRANSITIONED)
    return Decision(counted, (), Reason.PARTIAL_REFUND)


def _refund_reversed(state: OrderState, event: ProviderEvent) -> Decision:
    refund_id, amount = _refund_of(event)
    if not _same_currency(state, event):
        return _unchanged(Reason.CURRENCY_MISMATCH)  # D8
    remaining = max(state.refunded_amount - amount, Decimal(0))  # D4
    uncounted = replace(
        state,
        refunded_amount=remaining,
        refund_ids=state.refund_ids - {refund_id},
        reversed_refund_ids=state.reversed_refund_ids | {refund_id},
    )
    if state.status is S.REFUNDED:
        if not _after(event.occurred_at, state.refunded_at):
            return _unchanged(Reason.REVERSAL_BEFORE_REFUND)  # D6
        # The only backward move (SPEC 5): the money came back to the merchant.
        paid = replace(uncounted, status=S.PAID, refunded_at=None)
        return _moved(state, paid, Reason.REFUND_REVERSED)
    if refund_id in state.refund_ids:
        return Decision(uncounted, (), Reason.PARTIAL_REFUND_REVERSED)
    if refund_id in state.reversed_refund_ids:
        return _unchanged(Reason.REFUND_NOT_COUNTED)  # a duplicate of a recorded reversal
    remembered = replace(state, reversed_refund_ids=state.reversed_refund_ids | {refund_id})
    return Decision(remembered, (), Reason.REFUND_NOT_COUNTED)  # D7


def _reversed_at_provider(state: OrderState, event: ProviderEvent, target: OrderStatus) -> bool:
    """The provider's answer says a REFUNDED order is paid again, and can be believed (D11)."""
    return (
        event.checked_at is not None
        and state.status is S.REFUNDED
        and target in (S.PAID, S.SETTLED)
        and _after(event.occurred_at, state.refunded_at)
        and _after(event.checked_at, state.changed_at)
    )


def _refund_before_reversal(state: OrderState, event: ProviderEvent, target: OrderStatus) -> bool:
    """The provider's answer says refunded about an order whose refund was reversed, and its
    status dates from before our last change: it may be the reversed refund still showing
    (whether a provider's status follows reversals is not in its contract), not a new one.
    A refund after the reversal is believed (D11)."""
    return (
        event.checked_at is not None
        and target is S.REFUNDED
        and bool(state.reversed_refund_ids)
        and not _after(event.occurred_at, state.changed_at)
    )


def _after(moment: datetime | None, than: datetime | None) -> bool:
    return moment is not None and than is not None and moment > than


def agrees(state: OrderState, event: ProviderEvent) -> bool:
    """Whether the provider's status (a checked event) is the order's own: nothing to ask."""
    return _target(state, event) == state.status


def _money_matches(state: OrderState, event: ProviderEvent) -> bool:
    return event.amount == state.amount and _same_currency(state, event)  # D3


def _same_currency(state: OrderState, event: ProviderEvent) -> bool:
    return (event.currency or "").upper() == state.currency.upper()


def _refund_of(event: ProviderEvent) -> tuple[str, Decimal]:
    if event.refund_id is None or event.amount is None:  # ProviderEvent already forbids this
        raise InvalidEventError(f"{event.event_type} without refund_id/amount")
    return event.refund_id, event.amount


def _unchanged(reason: Reason) -> Decision:
    return Decision(None, (), reason)


def _moved(old: OrderState, new: OrderState, reason: Reason) -> Decision:
    event = DomainEvent(f"order.{new.status.lower()}", old.status, new.status)
    return Decision(new, (event,), reason)
