-- Erasure of a person's data (`payhooks erase`, POST /api/erasures; docs/runbook.md "Erasing a
-- person's data"). An erased order keeps its money, states and transitions; its email becomes
-- the marker `erased@invalid` and `erased_at` says when. The email worker reads `erased_at`
-- under the payment's email lock and records the email it would have sent as skipped, with
-- `skip_reason` 'erased' (the older skip, a success email the refund email overtook, is
-- 'after_refund'; earlier skipped rows were all of that kind).
ALTER TABLE orders ADD COLUMN erased_at timestamptz;
ALTER TABLE emails_sent ADD COLUMN skip_reason text;
UPDATE emails_sent SET skip_reason = 'after_refund' WHERE skipped;
