"""What the merchant is missing (`payhooks missing`, GET /api/missing, the console's page):
the payments the reconciler could not decide and the event ids ingest refused (401, 5xx)
that never came in since, in a time window: the list to send the provider's support to ask
for redelivery."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final

from shared.db import Executor
from shared.ops import dlq
from shared.ops.order_input import text_problem
from shared.queries import refused as refused_sql

DEFAULT_WINDOW: Final = dt.timedelta(days=35)  # X-Hub retries for 30 days, the inbox keeps 35
MAX_LIMIT: Final = 10_000
DEFAULT_LIMIT: Final = 1000


class BadWindowError(ValueError):
    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name} {why}")
        self.name = name
        self.why = why


@dataclass(frozen=True, slots=True)
class Window:
    since: dt.datetime
    until: dt.datetime
    limit: int

    @classmethod
    def parse(
        cls,
        since: str | None,
        until: str | None,
        limit: str | int | None = None,
        *,
        now: dt.datetime | None = None,
    ) -> Window:
        """From the edges' text (ISO 8601; absent: the last 35 days up to now)."""
        now = now or dt.datetime.now(dt.UTC)
        end = _time("until", until) if until else now
        start = _time("since", since) if since else end - DEFAULT_WINDOW
        if start > end:
            raise BadWindowError("since", "must not be after until")
        count = DEFAULT_LIMIT
        if limit is not None:
            try:
                count = int(limit)
            except ValueError:
                count = 0
            if not 1 <= count <= MAX_LIMIT:
                raise BadWindowError("limit", f"must be a whole number from 1 to {MAX_LIMIT}")
        return cls(start, end, count)


def _time(name: str, text: str) -> dt.datetime:
    if text_problem(text) is None and (at := dlq.parse_time(text)) is not None:
        try:
            return at.astimezone(dt.UTC)
        except OverflowError:
            pass
    raise BadWindowError(name, "must be an ISO 8601 time, e.g. 2026-11-30T10:00:00Z")


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


async def missing(db: Executor, window: Window) -> dict[str, Any]:
    """The one answer of every edge."""
    undecided = await refused_sql.undecided_between(db, window.since, window.until, window.limit)
    refused = await refused_sql.refused_between(db, window.since, window.until, window.limit)
    return {
        "since": window.since.isoformat(),
        "until": window.until.isoformat(),
        "undecided": [
            {
                "payment_id": r["payment_id"],
                "order_id": r["order_id"],
                "status": r["status"],
                "since": _iso(r["undecided_since"]),
                "last_at": _iso(r["undecided_at"]),
                "reason": r["undecided_reason"],
            }
            for r in undecided
        ],
        "refused": [
            {
                "provider": r["provider"],
                "event_id": r["event_id"],
                "status": r["status"],
                "outcome": r["outcome"],
                "first_at": _iso(r["first_at"]),
                "last_at": _iso(r["last_at"]),
                "refusals": r["refusals"],
            }
            for r in refused
        ],
    }
