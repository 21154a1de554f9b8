"""X-Hub events as the order state machine reads them: the payload parsed and checked (D9),
and the payload built (the reconciler's synthetic events, the simulator, tests)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

from shared.errors import PermanentError
from shared.providers.xhub import REFUND_COMPLETED, REFUND_REVERSED, STATUS_CHANGED

CHECKED_STATUSES: Final = frozenset({"paid", "settled"})  # compared with the order's money


class InvalidEventError(PermanentError):
    """A webhook body the orders worker can never apply, however often it is retried."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderEvent:
    event_type: str
    status: str | None = None
    payment_id: str
    amount: Decimal | None = None
    currency: str | None = None
    occurred_at: datetime | None = None  # the payload's created_at
    refund_id: str | None = None
    # Set only by the reconciler (its answer to GET /payments/:id was sought then, D11): from
    # its message's headers, never from a body a webhook could carry (shared/messages.py).
    checked_at: datetime | None = None

    def __post_init__(self) -> None:
        # A ProviderEvent that exists is complete enough for decide (D9).
        if not self.event_type or not self.payment_id:
            raise InvalidEventError("event and payment_id are required")
        if self.event_type.startswith("refund.") and not self.refund_id:
            raise InvalidEventError(f"{self.event_type} without refund_id")
        if self.event_type.endswith(".status_changed") and not self.status:
            raise InvalidEventError(f"{self.event_type} without status")
        money_needed = self.event_type in (REFUND_COMPLETED, REFUND_REVERSED) or (
            self.event_type == STATUS_CHANGED and self.status in CHECKED_STATUSES
        )
        if money_needed and (self.amount is None or not self.currency):
            raise InvalidEventError(f"{self.event_type} {self.status} without amount or currency")
        if self.amount is not None and not (self.amount.is_finite() and self.amount >= 0):
            raise InvalidEventError("amount must be a finite non-negative decimal")
        for moment in (self.occurred_at, self.checked_at):
            if moment is not None and moment.utcoffset() is None:
                raise InvalidEventError("event times must be timezone-aware")


_AMOUNT = re.compile(r"[0-9]+(\.[0-9]+)?")


def parse_event(payload: Mapping[str, Any], *, checked_at: datetime | None = None) -> ProviderEvent:
    """The webhook JSON (SPEC section 3) as a ProviderEvent; InvalidEventError if it never fits.
    `checked_at`: the reconciler's, from its message's headers (a body's is never read)."""
    status = _text(payload, "status")
    return ProviderEvent(
        event_type=_text(payload, "event") or "",
        status=status.lower() if status else None,
        payment_id=_text(payload, "payment_id") or "",
        amount=_amount(payload.get("amount")),
        currency=_text(payload, "currency"),
        occurred_at=_time(payload.get("created_at")),
        refund_id=_text(payload, "refund_id"),
        checked_at=checked_at,
    )


def _text(payload: Mapping[str, Any], key: str) -> str | None:
    value = payload.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidEventError(f"{key} must be a string")
    return value


def _amount(value: Any) -> Decimal | None:
    if value is None:
        return None
    # Money never passes through a binary float: only the contract's decimal string (D9).
    if not isinstance(value, str) or not _AMOUNT.fullmatch(value):
        raise InvalidEventError("amount must be a decimal string such as '100.00'")
    return Decimal(value)


def _time(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidEventError("times must be ISO 8601 strings")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as e:
        raise InvalidEventError("times must be ISO 8601") from e
    return parsed if parsed.utcoffset() is not None else parsed.replace(tzinfo=UTC)  # D9


def status_changed(
    payment_id: str, status: str, amount: str, currency: str, created_at: str, **extra: Any
) -> dict[str, Any]:
    """A `payment.status_changed` payload as X-Hub sends it (`extra`: more fields)."""
    return {
        "event": STATUS_CHANGED,
        "payment_id": payment_id,
        "status": status,
        "amount": amount,
        "currency": currency,
        "created_at": created_at,
        **extra,
    }
