-- The reconciler asks about orders in every state (SPEC 6): a SETTLED order can still be
-- refunded, a CANCELLED one still paid, and their webhooks lost. Its schedule has classes,
-- asked in this order (services/reconciler/schedule.py):
--   0 undecided   an event the model could not decide (D11)
--   1 money       PENDING, AMOUNT_MISMATCH
--   2 settlement  PAID, waiting for its settlement
--   3 recheck     SETTLED, REFUNDED, CANCELLED
-- Each claim walks one class's due orders in due order on one of these two indexes: orders
-- rescheduled by an earlier question (next_check_at), and orders changed since their last
-- question (next_check_at NULL: due RECONCILE_AFTER after updated_at).
CREATE FUNCTION payhooks_check_class(status text, undecided_since timestamptz)
RETURNS smallint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (CASE
        WHEN undecided_since IS NOT NULL THEN 0
        WHEN status IN ('PENDING', 'AMOUNT_MISMATCH') THEN 1
        WHEN status = 'PAID' THEN 2
        ELSE 3 END)::smallint
$$;

DROP INDEX IF EXISTS orders_check_due_idx;
DROP INDEX IF EXISTS orders_check_new_idx;
CREATE INDEX orders_check_due_idx
    ON orders (payhooks_check_class(status, undecided_since), next_check_at)
    WHERE next_check_at IS NOT NULL;
CREATE INDEX orders_check_new_idx
    ON orders (payhooks_check_class(status, undecided_since), updated_at)
    WHERE next_check_at IS NULL;

-- Orders rescheduled before this migration and past the 30-day horizon since: never again
-- (each question from now on sets 'infinity' once the horizon is reached).
UPDATE orders SET next_check_at = 'infinity'
WHERE next_check_at IS NOT NULL AND updated_at < now() - interval '30 days'
  AND undecided_since IS NULL;
