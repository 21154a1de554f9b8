"""Webhooks put in the inbox as ingest stores them, for the tests of the event listings."""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson

from shared.providers.xhub import PROVIDER
from shared.queries import inbox as inbox_sql
from shared.queries import processed as processed_sql
from shared.queries.inbox import InboxEntry
from tests.integration.test_dlq import new_id

HEADERS = {"Content-Type": "application/json", "X-Webhook-Id": "set per event"}


async def store_events(
    db: Any,
    count: int = 1,
    *,
    event: str = "payment.status_changed",
    payment_id: str | None = "pay_events",
    body: bytes | None = None,
    published: bool = True,
    outcome: str | None = None,
    at: dt.datetime | None = None,
    event_ids: list[str] | None = None,
) -> list[str]:
    """`count` webhooks (or one per id of `event_ids`) stored in one statement, so with one
    received_at as in a batch of ingest's; their event ids, in the order of their row ids."""
    ids = event_ids or [new_id("evt") for _ in range(count)]
    entries = [
        InboxEntry(
            event_id,
            event,
            payment_id,
            orjson.dumps({"event": event, "payment_id": payment_id}) if body is None else body,
            {**HEADERS, "X-Webhook-Id": event_id},
        )
        for event_id in ids
    ]
    stored = await inbox_sql.store_batch(db, PROVIDER, entries)
    rows = [s.id for s in stored]
    if published:
        await inbox_sql.mark_published(db, rows)
    for event_id in ids if outcome else ():
        await processed_sql.mark_processed(db, "orders", event_id, outcome or "")
    if at is not None:
        await db.execute("UPDATE inbox SET received_at = $2 WHERE id = ANY($1)", rows, at)
        # The key names its row's partition (migration 021).
        await db.execute("UPDATE inbox_keys SET received_at = $2 WHERE id = ANY($1)", rows, at)
    return ids
