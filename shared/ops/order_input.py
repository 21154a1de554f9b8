"""Orders as the shop gives and reads them: input checked for the API and the CLI, rows as JSON."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import asyncpg

from shared.queries.orders import NewOrder

# Matched whole (fullmatch): "$" alone would let a trailing newline through.
_AMOUNT = re.compile(r"[0-9]{1,15}(\.[0-9]{1,2})?")
_CURRENCY = re.compile(r"[A-Z]{3}")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_MAX_ID = 255


def text_problem(value: str) -> str | None:
    """Why `value` can never be stored as an order's text, nor found by it (an id in a path);
    None if it can."""
    if "\x00" in value:
        # PostgreSQL's text refuses NUL: the query would fail rather than find nothing.
        return "must not contain NUL characters"
    return None


class OrderValidationError(ValueError):
    """One message per bad field, so the caller can fix them all at once."""

    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in fields.items()))
        self.fields = fields


def parse_new_order(data: Mapping[str, Any]) -> NewOrder:
    errors: dict[str, str] = {}

    def text(name: str) -> str:
        value = data.get(name)
        if not isinstance(value, str) or not value.strip():
            errors[name] = "required, a non-empty string"
            return ""
        if len(value) > _MAX_ID:
            errors[name] = f"at most {_MAX_ID} characters"
        elif problem := text_problem(value):
            errors[name] = problem
        return value.strip()

    order_id, payment_id, user_id = text("order_id"), text("payment_id"), text("user_id")
    email = text("email")
    if email and "email" not in errors and not _EMAIL.fullmatch(email):
        errors["email"] = "not an email address"
    raw_amount = data.get("amount")
    amount = Decimal(0)
    if not isinstance(raw_amount, str) or not _AMOUNT.fullmatch(raw_amount):
        errors["amount"] = 'a decimal string with at most 2 decimals, e.g. "100.00"'
    else:
        amount = Decimal(raw_amount)  # the pattern admits only plain decimals
        if amount <= 0:
            errors["amount"] = "must be greater than 0"
    currency = data.get("currency")
    if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency):
        errors["currency"] = "a 3-letter ISO 4217 code in capitals, e.g. USD"
        currency = ""
    if errors:
        raise OrderValidationError(errors)
    return NewOrder(order_id, payment_id, user_id, email, amount, currency)


def order_json(row: asyncpg.Record) -> dict[str, Any]:
    """The order as the API shows it (SPEC section 7)."""
    return {
        "order_id": row["order_id"],
        "payment_id": row["payment_id"],
        "user_id": row["user_id"],
        "email": row["email"],
        "amount": f"{row['amount']:.2f}",
        "currency": row["currency"],
        "status": row["status"],
        "refunded_amount": f"{row['refunded_amount']:.2f}",
        "updated_at": row["updated_at"].isoformat(),
    }
