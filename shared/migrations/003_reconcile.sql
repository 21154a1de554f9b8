-- When the reconciler last asked the provider about an order: replicas claim orders by
-- setting it (SKIP LOCKED), so two reconcilers never ask about the same payment at once.
ALTER TABLE orders ADD COLUMN reconciled_at timestamptz;
-- The stale-payment scan walks this partial index, never the whole table.
CREATE INDEX orders_stale_idx ON orders (updated_at) WHERE status IN ('PENDING', 'AMOUNT_MISMATCH');
