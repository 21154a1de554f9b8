-- The reconciler also re-asks about PAID orders (a lost `settled` or `refunded` webhook):
-- this partial index keeps that scan off the rest of the table.
CREATE INDEX orders_paid_idx ON orders (updated_at) WHERE status = 'PAID';
