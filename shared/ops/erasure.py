"""Erasure of a person's data (GDPR article 17): the person's email addresses leave every
table that holds them, while amounts, currencies, states, transitions, ledger entries and the
audit trail stay as they are (docs/runbook.md, "Erasing a person's data").

A person is named by an address (`--email`), by the shop's user id (`--user`) or by one of
their orders (`--order`); the last two stand for the addresses of that user's or that order's
orders, and each of those addresses is erased wherever it is held: in every order registered
with it so far (not in one registered later: that is a new person's data), in the sent-email
records, and inside the raw bodies and headers of the inbox, the parked events and the outbox
(as stored bytes: the provider's signature over an inbox body no longer verifies after this),
and of the inbox's archives (shared/ops/archive.py: each archive holding the address is
written again as a new file, verified and recorded; the caller removes the old file after
the commit).
The address becomes MARKER; orders.erased_at says when. The user id is kept: it is the shop's
pseudonymous key (the ledger's too), which identifies nobody without the shop's own records.

All of it is one transaction, under the payments' locks the orders worker and the email worker
take (shared/queries/parked.py, shared/queries/emails.py): a payment being processed finishes
first or waits, and the email worker, reading erased_at under its lock, records the emails of
an erased order as skipped instead of sending them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from shared.db import Executor
from shared.ops import archive
from shared.queries import emails as emails_sql
from shared.queries import erasure as erasure_sql
from shared.queries import parked as parked_sql

MARKER = "erased@invalid"  # RFC 2606: the `.invalid` top-level domain never delivers
MAX_ADDRESS_CHARS = 320
MAX_ID_CHARS = 255
# Tables whose rows an erasure may change, in the order it changes them (its answer's keys).
# inbox_archives: the archived events changed (in rewritten archive files).
TABLES = ("orders", "emails_sent", "inbox", "parked_events", "outbox", "inbox_archives")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")


class By(StrEnum):
    EMAIL = "email"
    USER = "user"
    ORDER = "order"


class ErasureInputError(ValueError):
    """Not exactly one well-formed selector."""


class PersonNotFoundError(LookupError):
    """No order of that user id or with that order id (an address is never 'unknown': one
    found nowhere is an erasure with nothing to change)."""


@dataclass(frozen=True, slots=True)
class Selector:
    by: By
    value: str

    def target(self) -> str:
        """The audit row's target: never the address itself."""
        return "email" if self.by is By.EMAIL else f"{self.by.value}:{self.value}"


def parse_selector(email: object, user: object, order: object) -> Selector:
    """Exactly one of them, a string: ErasureInputError otherwise. An address is compared
    without regard to case and surrounding spaces."""
    given = [(by, v) for by, v in ((By.EMAIL, email), (By.USER, user), (By.ORDER, order)) if v]
    if len(given) != 1:
        raise ErasureInputError("give exactly one of email, user_id, order_id")
    [(by, value)] = given
    if not isinstance(value, str):
        raise ErasureInputError(f"{by.value} must be a string")
    if by is By.EMAIL:
        address = value.strip().lower()
        local, at, domain = address.rpartition("@")
        if not at or not local or not domain or len(address) > MAX_ADDRESS_CHARS:
            raise ErasureInputError("email is not an address")
        if _CONTROL.search(address):
            raise ErasureInputError("email holds spaces or control characters")
        if address == MARKER:
            raise ErasureInputError(f"{MARKER} is the erasure marker, not an address")
        return Selector(by, address)
    if len(value) > MAX_ID_CHARS or _CONTROL.search(value):
        raise ErasureInputError(f"{by.value} id is not an id")
    return Selector(by, value)


@dataclass(slots=True)
class Erased:
    """What one erasure changed: the orders it erased now, those erased before, the rows
    changed per table (all zero: nothing was left to erase)."""

    selector: Selector
    orders: list[str] = field(default_factory=list)
    already_erased: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))
    # Archive files an erasure replaced: removed once its transaction committed.
    replaced_files: list[Path] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return sum(self.rows.values())

    def as_json(self) -> dict[str, Any]:
        """The one answer of every edge; it never holds the address."""
        return {
            "by": self.selector.by.value,
            "erased": self.changed > 0,
            "rows_changed": self.changed,
            "rows": dict(self.rows),
            "orders": self.orders,
            "already_erased": self.already_erased,
            "marker": MARKER,
        }


async def erase(conn: Executor, selector: Selector, archive_dir: Path | None = None) -> Erased:
    """Erase the selected person's addresses; run it in a transaction (the caller's, which
    also holds the audit row), then remove `replaced_files`. PersonNotFoundError for an
    unknown user or order id; archive.ArchivesUnreachableError or ArchiveCorruptError when
    archives are recorded that can't be rewritten (nothing is erased then)."""
    erased = Erased(selector)
    addresses, payment_ids = await _addresses(conn, selector, erased)
    if not addresses:
        return erased
    payment_ids = sorted(set(payment_ids) | set(await erasure_sql.payments_with(conn, addresses)))
    # The orders worker's lock (so no payment of the person is mid-transition) and the email
    # worker's (so no email of theirs is being claimed with the address): each as a statement
    # of its own, before the writes they protect, keys in order (no deadlock).
    await parked_sql.lock_payments(conn, payment_ids)
    await emails_sql.lock_payment_emails(conn, payment_ids)
    erased.orders = await erasure_sql.erase_orders(conn, payment_ids, addresses, MARKER)
    erased.rows["orders"] = len(erased.orders)
    erased.rows["emails_sent"] = await erasure_sql.erase_recipients(conn, addresses, MARKER)
    for table, has_headers in erasure_sql.RAW_TABLES:
        erased.rows[table] = await _rewrite(conn, table, has_headers, addresses)
    redact = _Redaction(addresses)
    erased.rows["inbox_archives"], erased.replaced_files = await archive.rewrite_archives(
        conn, archive_dir, redact.archived_event
    )
    return erased


async def _addresses(
    conn: Executor, selector: Selector, erased: Erased
) -> tuple[list[str], list[str]]:
    """The addresses to erase (lower case) and the payments of the selected orders."""
    if selector.by is By.EMAIL:
        return [selector.value], []
    column: Literal["user_id", "order_id"] = "user_id" if selector.by is By.USER else "order_id"
    rows = await erasure_sql.orders_of(conn, column, selector.value)
    if not rows:
        raise PersonNotFoundError(f"no order with {selector.by.value} id {selector.value}")
    erased.already_erased = sorted(r["order_id"] for r in rows if r["erased_at"] is not None)
    live = [r for r in rows if r["erased_at"] is None]
    return sorted({r["email"].strip().lower() for r in live}), [r["payment_id"] for r in live]


class _Redaction:
    """The addresses replaced by MARKER in raw bytes (ASCII letters compared without case)
    and in the strings of a JSON value."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self._patterns = [re.compile(re.escape(a), re.IGNORECASE) for a in addresses]
        self._raw = [re.compile(re.escape(a.encode()), re.IGNORECASE) for a in addresses]

    def body(self, body: bytes) -> bytes:
        for pattern in self._raw:
            body = pattern.sub(MARKER.encode(), body)
        return body

    def headers(self, headers: Any) -> Any:
        return _scrub(headers, self._patterns)

    def archived_event(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """The archived event redacted as its inbox row would be; None if it holds no
        address."""
        body, headers = self.body(event["body"]), self.headers(event["headers"])
        if body == event["body"] and headers == event["headers"]:
            return None
        return {**event, "body": body, "headers": headers}


async def _rewrite(conn: Executor, table: str, has_headers: bool, addresses: list[str]) -> int:
    """Replace the addresses inside the raw bodies (bytes; ASCII letters compared without
    case) and header values of the table's rows that hold them; the rows changed."""
    redact = _Redaction(addresses)
    changed = 0
    for row in await erasure_sql.rows_holding(conn, table, has_headers, addresses):
        body = redact.body(row["body"])
        headers = redact.headers(row["headers"]) if has_headers else None
        if body == row["body"] and headers == row["headers"]:
            continue
        await erasure_sql.rewrite_row(conn, table, row["id"], body, headers)
        changed += 1
    return changed


def _scrub(value: Any, patterns: Sequence[re.Pattern[str]]) -> Any:
    """A JSON value with every address inside its strings (keys too) replaced by MARKER."""
    if isinstance(value, str):
        for pattern in patterns:
            value = pattern.sub(MARKER, value)
        return value
    if isinstance(value, dict):
        return {_scrub(k, patterns): _scrub(v, patterns) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, patterns) for v in value]
    return value
