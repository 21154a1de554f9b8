"""processed_events: which worker has applied which event (the workers' idempotency key)."""

from __future__ import annotations

from collections.abc import Sequence

from shared.db import Executor, columns


async def mark_processed(conn: Executor, worker: str, event_id: str, outcome: str) -> bool:
    """Record that `worker` handled `event_id`; False if it already had (a redelivery).

    Runs inside the effect's transaction: a concurrent copy blocks on the unique key until
    this one commits or rolls back, so only one of them ever applies the effect.
    """
    return bool(await mark_all_processed(conn, worker, [(event_id, outcome)]))


async def processed_of(conn: Executor, worker: str, event_ids: Sequence[str]) -> set[str]:
    """Which of these events `worker` has already handled (as this statement's snapshot sees)."""
    rows = await conn.fetch(
        "SELECT event_id FROM processed_events WHERE worker = $1 AND event_id = ANY($2::text[])",
        worker,
        list(event_ids),
    )
    return {r["event_id"] for r in rows}


async def mark_all_processed(
    conn: Executor, worker: str, marks: Sequence[tuple[str, str]]
) -> set[str]:
    """Record that `worker` handled these (event id, outcome)s, in one statement: the event
    ids recorded now. One left out was recorded already, by a copy that committed first (a
    copy still in progress holds this statement on the unique key until it ends)."""
    rows = await conn.fetch(
        "INSERT INTO processed_events (worker, event_id, outcome)"
        " SELECT $1, e, o FROM unnest($2::text[], $3::text[]) AS m(e, o)"
        " ON CONFLICT DO NOTHING RETURNING event_id",
        worker,
        *columns(marks, 2),
    )
    return {r["event_id"] for r in rows}
