-- Events for a payment with no registered order yet (SPEC section 5): the orders worker parks
-- them here instead of cycling them through its retry ladder. Registering the order releases
-- them (released_at, in the registration's transaction) and the orders service's parked relay
-- publishes each back to the orders queue (published_at); one still parked after
-- UNKNOWN_PAYMENT_PARK_SECONDS goes to orders.dlq with reason unknown_payment
-- (dead_lettered_at). event_id is the message id, the orders worker's idempotency key: a
-- duplicate delivery parks once.
CREATE TABLE parked_events (
    id               bigserial   PRIMARY KEY,
    event_id         text        NOT NULL UNIQUE,
    provider         text,
    payment_id       text        NOT NULL,
    event_type       text        NOT NULL,
    routing_key      text        NOT NULL,
    body             bytea       NOT NULL,
    -- The message's own headers (RabbitMQ's x-* ones left out), as the worker received them.
    headers          jsonb       NOT NULL DEFAULT '{}',
    parked_at        timestamptz NOT NULL DEFAULT now(),
    released_at      timestamptz,
    published_at     timestamptz,
    dead_lettered_at timestamptz,
    CONSTRAINT parked_events_one_end CHECK (released_at IS NULL OR dead_lettered_at IS NULL)
);
CREATE INDEX parked_events_payment_idx ON parked_events (payment_id);
-- The deadline sweep and the gauge walk the events still waiting, the relay the released
-- ones not yet confirmed on the orders queue: each a partial index of those only.
CREATE INDEX parked_events_waiting_idx ON parked_events (parked_at)
    WHERE released_at IS NULL AND dead_lettered_at IS NULL;
CREATE INDEX parked_events_unpublished_idx ON parked_events (id)
    WHERE released_at IS NOT NULL AND published_at IS NULL;
