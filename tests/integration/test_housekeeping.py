"""Retention housekeeping: old rows go in small batches, never an unpublished one (the
inbox's days, archived first: tests/integration/test_archive.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from services.reconciler.jobs import housekeeping_once
from shared.config import Settings
from shared.db import create_pool
from shared.metrics import ReconcilerMetrics


async def test_rows_past_retention_are_deleted_but_never_unpublished_ones(
    settings: Settings, db: Any, tmp_path: Path
) -> None:
    async def inbox(event_id: str, age_days: int, published: bool) -> None:
        await db.execute(
            "WITH i AS (INSERT INTO inbox (provider, event_id, event_type, body, headers,"
            " received_at) VALUES ('xhub', $1, 'payment.status_changed', '{}', '{}',"
            " now() - make_interval(days => $2)) RETURNING id, received_at),"
            " k AS (INSERT INTO inbox_keys (provider, event_id, id, received_at)"
            " SELECT 'xhub', $1, id, received_at FROM i)"
            " INSERT INTO inbox_unpublished (id, received_at)"
            " SELECT id, received_at FROM i WHERE NOT $3",
            event_id,
            age_days,
            published,
        )

    await inbox("old_published", 40, True)
    await inbox("old_unpublished", 41, False)  # the sweeper still owes it a publish
    await inbox("recent", 10, True)
    # A key whose row went long ago, past the retention and the retry horizon: deleted.
    await db.execute(
        "INSERT INTO inbox_keys (provider, event_id, id, received_at)"
        " VALUES ('xhub', 'gone_long_ago', -1, now() - interval '70 days')"
    )
    await db.execute(
        "INSERT INTO processed_events (worker, event_id, outcome, processed_at) VALUES"
        " ('orders', 'old', 'ok', now() - interval '40 days'),"
        " ('orders', 'recent', 'ok', now() - interval '10 days')"
    )
    await db.execute(
        "INSERT INTO outbox (message_id, routing_key, body, created_at, published_at) VALUES"
        " ('old_sent', 'order.paid', '{}', now() - interval '40 days', now()),"
        " ('old_unsent', 'order.paid', '{}', now() - interval '40 days', NULL)"
    )
    await db.execute(
        "INSERT INTO parked_events (event_id, payment_id, event_type, routing_key, body,"
        " parked_at, released_at, published_at, dead_lettered_at) VALUES"
        " ('old_released', 'p1', 'e', 'e', '', now() - interval '40 days', now(), now(), NULL),"
        " ('old_dead', 'p2', 'e', 'e', '', now() - interval '40 days', NULL, NULL, now()),"
        " ('old_waiting', 'p3', 'e', 'e', '', now() - interval '40 days', NULL, NULL, NULL),"
        " ('old_unsent', 'p4', 'e', 'e', '', now() - interval '40 days', now(), NULL, NULL)"
    )
    pool = await create_pool(settings.database_url)
    registry = CollectorRegistry()
    try:
        deleted = await housekeeping_once(
            pool,
            retention_days=35,
            archive_dir=tmp_path,
            metrics=ReconcilerMetrics.create(registry),
        )
    finally:
        await pool.close()

    assert deleted == {
        "inbox": 1,  # archived with its day's partition; the older day waits for its publish
        "inbox_keys": 1,
        "outbox": 1,
        "processed_events": 1,
        "parked_events": 2,
        "refused_webhooks": 0,
    }
    assert sorted(r["event_id"] for r in await db.fetch("SELECT event_id FROM inbox")) == [
        "old_unpublished",
        "recent",
    ]
    assert sorted(r["event_id"] for r in await db.fetch("SELECT event_id FROM inbox_keys")) == [
        "old_published",  # kept beyond its row: the provider may still retry it
        "old_unpublished",
        "recent",
    ]
    assert [r["event_id"] for r in await db.fetch("SELECT event_id FROM processed_events")] == [
        "recent"
    ]
    assert [r["message_id"] for r in await db.fetch("SELECT message_id FROM outbox")] == [
        "old_unsent"
    ]
    # Still waiting for its order, or released and owed a publish: kept.
    parked = await db.fetch("SELECT event_id FROM parked_events ORDER BY event_id")
    assert [r["event_id"] for r in parked] == ["old_unsent", "old_waiting"]
