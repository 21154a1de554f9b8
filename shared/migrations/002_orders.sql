-- Orders registered by the shop, their transitions, and the outbox that publishes them.
CREATE TABLE orders (
    order_id        text        PRIMARY KEY,
    payment_id      text        NOT NULL UNIQUE,
    user_id         text        NOT NULL,
    email           text        NOT NULL,
    amount          numeric     NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL,
    status          text        NOT NULL DEFAULT 'PENDING',
    refunded_amount numeric     NOT NULL DEFAULT 0,
    refunded_at     timestamptz,
    refund_ids      text[]      NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
-- The reconciler's stale-payment scan (issue 5) walks this index, never the whole table.
CREATE INDEX orders_status_updated_idx ON orders (status, updated_at);

CREATE TABLE order_transitions (
    id          bigserial   PRIMARY KEY,
    payment_id  text        NOT NULL,
    from_status text        NOT NULL,
    to_status   text        NOT NULL,
    event_id    text        NOT NULL,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX order_transitions_payment_idx ON order_transitions (payment_id);

-- One row per (worker, message): the worker's idempotency key, written in the same
-- transaction as the effect, so a redelivered message finds it and changes nothing.
CREATE TABLE processed_events (
    worker       text        NOT NULL,
    event_id     text        NOT NULL,
    outcome      text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (worker, event_id)
);
CREATE INDEX processed_events_processed_at_idx ON processed_events (processed_at);

-- Domain events written with the transition; the relay publishes them with confirms.
CREATE TABLE outbox (
    id           bigserial   PRIMARY KEY,
    message_id   text        NOT NULL UNIQUE,
    routing_key  text        NOT NULL,
    body         bytea       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;

-- Bonus ledger: at most one entry of each kind per payment, enforced here.
CREATE TABLE bonus_ledger (
    id         bigserial   PRIMARY KEY,
    payment_id text        NOT NULL,
    user_id    text        NOT NULL,
    kind       text        NOT NULL CHECK (kind IN ('grant', 'clawback', 'restore')),
    points     integer     NOT NULL,
    event_id   text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT bonus_ledger_payment_kind_key UNIQUE (payment_id, kind)
);
CREATE INDEX bonus_ledger_user_idx ON bonus_ledger (user_id);

-- Emails: one per (payment, template). Inserted in the transaction that wraps the SMTP send.
CREATE TABLE emails_sent (
    payment_id text        NOT NULL,
    template   text        NOT NULL,
    message_id text        NOT NULL,
    recipient  text        NOT NULL,
    event_id   text        NOT NULL,
    sent_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (payment_id, template)
);
