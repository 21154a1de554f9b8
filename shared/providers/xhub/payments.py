"""The provider's payment as `GET /payments/{id}` answers it, read strictly: an answer we
cannot use is a ProviderResponseError, never a guess."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

# Defined with the seam (every provider's API answers in these); named here as before.
from shared.providers.base import ProviderPayment as ProviderPayment
from shared.providers.base import ProviderResponseError as ProviderResponseError


def parse_payment(body: bytes, payment_id: str) -> ProviderPayment:
    def bad(why: str) -> ProviderResponseError:
        return ProviderResponseError(f"provider answer for payment {payment_id!r} {why}")

    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise bad("is not JSON") from None
    if not isinstance(data, dict):
        raise bad("is not a JSON object")
    missing = [
        key
        for key in ("payment_id", "status", "amount", "currency", "updated_at")
        if key not in data
    ]
    if missing:
        raise bad(f"lacks {', '.join(missing)}")
    if data["payment_id"] != payment_id:
        raise bad("names another payment")
    for key in ("status", "currency", "updated_at"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise bad(f"has no usable {key}")
    raw_amount = data["amount"]
    if isinstance(raw_amount, bool) or not isinstance(raw_amount, str | int | float):
        raise bad("has a non-numeric amount")
    try:
        amount = Decimal(str(raw_amount))
    except InvalidOperation:
        raise bad("has a non-numeric amount") from None
    if not amount.is_finite():
        raise bad("has a non-numeric amount")
    try:
        updated_at = datetime.fromisoformat(data["updated_at"])
    except ValueError:
        raise bad("has an updated_at that is not ISO 8601") from None
    if updated_at.tzinfo is None:
        raise bad("has an updated_at without a timezone")
    return ProviderPayment(
        payment_id=payment_id,
        status=data["status"],
        amount=amount,
        currency=data["currency"],
        updated_at=updated_at,
    )
