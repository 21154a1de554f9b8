"""Every DML statement payhooks runs, one module per table, each statement next to the small
typed function that runs it. The DDL (tables, the unique keys behind dedup and idempotency)
is in shared/migrations/."""
