"""Every DML statement payhooks runs, one module per table, each statement next to the small
typed function that runs it. The DDL (tables, the unique keys behind dedup and idempotency)
is in shared/migrations/."""


def without_flush_wait(statement: str) -> str:
    """`statement` (one ending in its WHERE clause) as its own transaction whose commit
    doesn't wait for the WAL flush: set_config(..., true) holds until that commit, one round
    trip where BEGIN, SET LOCAL, the statement and COMMIT take four. For marks whose loss in a
    crash only sends something again (pgbench, 300 such DELETEs: 3-55 WAL syncs against 300)."""
    return (
        "WITH lazily AS (SELECT set_config('synchronous_commit', 'off', true)) "
        + statement
        + " AND (SELECT true FROM lazily)"
    )
