"""processed_events: which worker has applied which event (the workers' idempotency key)."""

from __future__ import annotations

from shared.db import Executor


async def mark_processed(conn: Executor, worker: str, event_id: str, outcome: str) -> bool:
    """Record that `worker` handled `event_id`; False if it already had (a redelivery).

    Runs inside the effect's transaction: a concurrent copy blocks on the unique key until
    this one commits or rolls back, so only one of them ever applies the effect.
    """
    row = await conn.fetchval(
        "INSERT INTO processed_events (worker, event_id, outcome) VALUES ($1, $2, $3)"
        " ON CONFLICT DO NOTHING RETURNING true",
        worker,
        event_id,
        outcome,
    )
    return row is True
