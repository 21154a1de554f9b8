-- Finding events without reading the inbox (`GET /api/events`, `payhooks event list`): each
-- filter walks an index in the listing's order, newest first, and a page ends after LIMIT rows;
-- the (received_at, id) keyset of the cursor is an index condition. Two more index entries per
-- new row on ingest's hot path (the payment one replaces an older index), the price of never
-- reading the whole table. Retention keeps its BRIN index. Building them holds ingest's
-- inserts (answered 503, X-Hub retries): on a large inbox, migrate in a quiet hour.
CREATE INDEX inbox_received_idx ON inbox (received_at DESC, id DESC);
CREATE INDEX inbox_event_type_received_idx ON inbox (event_type, received_at DESC, id DESC);
-- Replaces the index on payment_id alone: it serves the payment view's lookup too.
CREATE INDEX inbox_payment_received_idx ON inbox (payment_id, received_at DESC, id DESC)
    WHERE payment_id IS NOT NULL;
DROP INDEX IF EXISTS inbox_payment_id_idx;
