"""An operator's resolution of an order as values: which move is asked for, whether the order
machine allows it or it must be forced, and the order's state after it. No I/O
(shared/ops/operator_actions.py carries it out)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Final

from shared.order_machine import TRANSITIONS, DomainEvent, OrderState
from shared.vocabulary import OrderStatus

MAX_REASON_CHARS: Final = 1000
# An operator's transition's event id (its source_event_id, the key of its ledger entry and
# of its order.* message): never a provider's id, whose events come in through ingest.
OPERATOR_EVENT_PREFIX: Final = "operator:"


class ResolveInputError(ValueError):
    """What was asked cannot be a resolution: one message per bad field."""

    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in fields.items()))
        self.fields = fields


class ResolveRefusedError(Exception):
    """The order is as it is and stays so: a move to where it already is, or one the order
    machine forbids without --force."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Request:
    """A resolution as asked: validated, not yet checked against the order."""

    to: OrderStatus
    reason: str
    force: bool


def parse_request(to: object, reason: object, force: object = False) -> Request:
    """The fields of a resolve (CLI flags, the api's JSON, the console's form) or
    ResolveInputError naming every bad one."""
    problems: dict[str, str] = {}
    target: OrderStatus | None = None
    if not isinstance(to, str) or to.strip().upper() not in OrderStatus.__members__:
        problems["to"] = f"must be one of {', '.join(OrderStatus)}"
    else:
        target = OrderStatus(to.strip().upper())
    text = reason.strip() if isinstance(reason, str) else None
    if not text:
        problems["reason"] = "is required: say why (it goes into the audit trail)"
    elif len(text) > MAX_REASON_CHARS:
        problems["reason"] = f"at most {MAX_REASON_CHARS} characters"
    elif "\x00" in text:
        problems["reason"] = "must not contain NUL characters"
    if not isinstance(force, bool):
        problems["force"] = "must be true or false"
    if problems or target is None or text is None or not isinstance(force, bool):
        raise ResolveInputError(problems)
    return Request(target, text, force)


def allowed(current: OrderStatus, target: OrderStatus) -> bool:
    """Whether the order machine itself makes this move (SPEC 5's forward moves). The one way
    back it knows, REFUNDED -> PAID, belongs to a dated refund.reversed: an operator forces it."""
    return target in TRANSITIONS[current]


def plan(state: OrderState, request: Request, now: datetime) -> tuple[OrderState, DomainEvent]:
    """The order's state after the move and the transition to publish, or ResolveRefusedError.
    Into REFUNDED the whole amount counts as refunded; out of it, none does."""
    current = state.status
    if request.to is current:
        raise ResolveRefusedError("no_change", f"the order is {current} already")
    forced = not allowed(current, request.to)
    if forced and not request.force:
        raise ResolveRefusedError(
            "forbidden_move",
            f"the order machine never moves {current} to {request.to}; to do it anyway,"
            " resolve with force (it is recorded and shown as forced)",
        )
    new = replace(state, status=request.to, changed_at=now)
    if request.to is OrderStatus.REFUNDED:
        new = replace(new, refunded_amount=state.amount, refunded_at=now)
    elif current is OrderStatus.REFUNDED:
        new = replace(new, refunded_amount=Decimal(0), refunded_at=None)
    return new, DomainEvent(f"order.{request.to.lower()}", current, request.to)


def is_forced(current: OrderStatus, target: OrderStatus) -> bool:
    return not allowed(current, target)
