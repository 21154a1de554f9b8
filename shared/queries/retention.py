"""Deleting what is past the retention period (the reconciler's housekeeping)."""

from __future__ import annotations

from shared.db import Executor


async def delete_old(conn: Executor, table: str, retention_s: float, limit: int) -> int:
    """Delete up to `limit` rows past the retention; never an unpublished outbox row, nor a
    parked event still waiting or released and not yet published. (The inbox goes a day's
    partition at a time, archived first: shared/ops/archive.py.)"""
    statements = {
        "outbox": "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE created_at <"
        " now() - make_interval(secs => $1) AND published_at IS NOT NULL LIMIT $2)",
        "processed_events": "DELETE FROM processed_events WHERE (worker, event_id) IN (SELECT"
        " worker, event_id FROM processed_events WHERE processed_at <"
        " now() - make_interval(secs => $1) LIMIT $2)",
        "parked_events": "DELETE FROM parked_events WHERE id IN (SELECT id FROM parked_events"
        " WHERE parked_at < now() - make_interval(secs => $1)"
        " AND (published_at IS NOT NULL OR dead_lettered_at IS NOT NULL) LIMIT $2)",
        "refused_webhooks": "DELETE FROM refused_webhooks WHERE id IN (SELECT id FROM"
        " refused_webhooks WHERE last_at < now() - make_interval(secs => $1) LIMIT $2)",
    }
    result = await conn.execute(statements[table], retention_s, limit)
    return int(result.split()[-1])
