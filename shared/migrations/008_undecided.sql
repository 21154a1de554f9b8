-- Orders the model could not decide (services/orders/domain.py D11): the reconciler asks the
-- provider about them at once. undecided_since is the first such event (what the alert ages),
-- undecided_at the latest (an answer sought before it can't clear the flag).
ALTER TABLE orders ADD COLUMN undecided_since timestamptz;
ALTER TABLE orders ADD COLUMN undecided_at timestamptz;
ALTER TABLE orders ADD COLUMN undecided_reason text;
CREATE INDEX orders_undecided_idx ON orders (undecided_since) WHERE undecided_since IS NOT NULL;

-- The reconciler also asks about REFUNDED orders (a lost refund.reversed): the scan's
-- partial indexes take them in.
DROP INDEX IF EXISTS orders_check_due_idx;
DROP INDEX IF EXISTS orders_check_new_idx;
CREATE INDEX orders_check_due_idx ON orders (next_check_at)
    WHERE status IN ('PENDING', 'AMOUNT_MISMATCH', 'PAID', 'REFUNDED');
CREATE INDEX orders_check_new_idx ON orders (updated_at)
    WHERE next_check_at IS NULL AND status IN ('PENDING', 'AMOUNT_MISMATCH', 'PAID', 'REFUNDED');
