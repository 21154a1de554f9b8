-- Audited resolution of an order (`payhooks order resolve`, POST /api/payments/{id}/resolve,
-- the console's form): a transition the operator made. `source` says who moved the order
-- (a provider's event, the reconciler's synthetic one, or an operator), `actor` the operator's
-- name, `forced` a move the order machine forbids (made with --force), `reason` the
-- operator's words. Earlier rows keep the defaults: made by events. The ledger and emails
-- follow an operator's transition exactly as an event's (the same outbox, the same keys).
ALTER TABLE order_transitions ADD COLUMN source text NOT NULL DEFAULT 'event';
ALTER TABLE order_transitions ADD COLUMN actor text;
ALTER TABLE order_transitions ADD COLUMN forced boolean NOT NULL DEFAULT false;
ALTER TABLE order_transitions ADD COLUMN reason text;
-- NOT VALID: every existing row holds the defaults, which satisfy it, and checking them would
-- scan the table under this migration's exclusive lock (the orders worker waits on it); every
-- row written from now on is checked.
ALTER TABLE order_transitions ADD CONSTRAINT order_transitions_source_check
    CHECK (source IN ('event', 'operator')
           AND (source = 'operator') = (actor IS NOT NULL AND reason IS NOT NULL)
           AND (NOT forced OR source = 'operator')) NOT VALID;

-- Webhooks ingest refused with 401 (bad signature, stale) or 5xx (PostgreSQL or RabbitMQ
-- down or slow, overloaded): the event ids an operator asks the provider to deliver again
-- (`payhooks missing`, GET /api/missing). Written best-effort by ingest from a bounded
-- in-process buffer (a 503 because PostgreSQL is down is written once it answers). One row
-- per (provider, event id, status): `refusals` counts the copies refused, first/last when.
-- The id of a 401 is untrusted input: at most 255 characters are kept, never the body or
-- the signature. Retention deletes rows after RETENTION_DAYS, like the inbox.
CREATE TABLE refused_webhooks (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider    text        NOT NULL,
    event_id    text        NOT NULL CHECK (length(event_id) BETWEEN 1 AND 255),
    status      smallint    NOT NULL CHECK (status = 401 OR status BETWEEN 500 AND 599),
    outcome     text        NOT NULL,
    first_at    timestamptz NOT NULL,
    last_at     timestamptz NOT NULL,
    refusals    integer     NOT NULL DEFAULT 1,
    CONSTRAINT refused_webhooks_key UNIQUE (provider, event_id, status)
);
CREATE INDEX refused_webhooks_last_idx ON refused_webhooks (last_at);
