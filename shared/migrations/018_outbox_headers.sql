-- The headers an outbox row's message carries besides the schema: what the event that caused
-- the transition passes on (shared/tracing.py CARRIED: when ingest received the webhook, and
-- its trace context while tracing is on), so the `order.*` message continues the payment's
-- trace and its end-to-end latency. NULL for rows without (operators' transitions, older rows).
ALTER TABLE outbox ADD COLUMN headers jsonb;
