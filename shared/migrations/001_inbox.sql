-- Every accepted webhook, exactly as received. The unique key is the dedup: a retried or
-- concurrent copy of the same event can never make a second row.
CREATE TABLE inbox (
    id            bigserial   PRIMARY KEY,
    provider      text        NOT NULL,
    event_id      text        NOT NULL,
    event_type    text        NOT NULL,
    payment_id    text,
    body          bytea       NOT NULL,
    headers       jsonb       NOT NULL,
    received_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    duplicates    integer     NOT NULL DEFAULT 0,
    -- NULL until RabbitMQ confirmed the publish; the sweeper publishes rows left NULL.
    published_at  timestamptz,
    -- Who may publish this row right now: one request or sweeper pass holds the claim until
    -- claimed_until, so concurrent duplicates don't publish twice.
    claim_token   uuid,
    claimed_until timestamptz,
    CONSTRAINT inbox_provider_event_id_key UNIQUE (provider, event_id)
);

CREATE INDEX inbox_unpublished_idx ON inbox (received_at) WHERE published_at IS NULL;
CREATE INDEX inbox_payment_id_idx ON inbox (payment_id) WHERE payment_id IS NOT NULL;
CREATE INDEX inbox_received_at_idx ON inbox (received_at);
