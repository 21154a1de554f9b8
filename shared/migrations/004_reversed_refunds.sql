-- Refunds the provider reversed. A reversal can overtake its refund; remembering it makes
-- the late refund.completed of the same refund change nothing (services/orders/domain.py D7).
ALTER TABLE orders ADD COLUMN reversed_refund_ids text[] NOT NULL DEFAULT '{}';
