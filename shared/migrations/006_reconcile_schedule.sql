-- When the reconciler may ask about an order next (NULL: not asked since it was registered).
-- Each claim pushes it forward, so the due ones come first and a backlog of orders that
-- never resolve can't starve newer ones; the claim walks only what is due.
ALTER TABLE orders ADD COLUMN next_check_at timestamptz;
CREATE INDEX orders_check_due_idx ON orders (next_check_at)
    WHERE status IN ('PENDING', 'AMOUNT_MISMATCH', 'PAID');
CREATE INDEX orders_check_new_idx ON orders (updated_at)
    WHERE next_check_at IS NULL AND status IN ('PENDING', 'AMOUNT_MISMATCH', 'PAID');
-- Superseded by the two above.
DROP INDEX IF EXISTS orders_stale_idx;
DROP INDEX IF EXISTS orders_paid_idx;
