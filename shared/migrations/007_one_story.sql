-- One story per payment (SPEC 5). Each ledger entry is tied to the order transition that
-- caused it and unique on it, so the ledger follows the order's history: a refund after a
-- reversal claws back again. One grant per payment stays a constraint of its own.
ALTER TABLE bonus_ledger ADD COLUMN transition_id bigint REFERENCES order_transitions (id);

-- Entries written under the old (payment, kind) rule: tied to the transition the history
-- gives them (the first PAID/SETTLED, the first REFUNDED after it, the first way back after
-- that), which is where the new rule puts them, so it adds nothing twice. An entry with no
-- such transition (none exist unless rows were edited by hand) keeps a NULL.
UPDATE bonus_ledger b SET transition_id = (
    SELECT min(t.id) FROM order_transitions t
    WHERE t.payment_id = b.payment_id AND t.to_status IN ('PAID', 'SETTLED'))
WHERE b.kind = 'grant';
UPDATE bonus_ledger b SET transition_id = (
    SELECT min(t.id) FROM order_transitions t, bonus_ledger g
    WHERE t.payment_id = b.payment_id AND t.to_status NOT IN ('PAID', 'SETTLED')
      AND g.payment_id = b.payment_id AND g.kind = 'grant' AND t.id > g.transition_id)
WHERE b.kind = 'clawback';
UPDATE bonus_ledger b SET transition_id = (
    SELECT min(t.id) FROM order_transitions t, bonus_ledger c
    WHERE t.payment_id = b.payment_id AND t.to_status IN ('PAID', 'SETTLED')
      AND c.payment_id = b.payment_id AND c.kind = 'clawback' AND t.id > c.transition_id)
WHERE b.kind = 'restore';

ALTER TABLE bonus_ledger DROP CONSTRAINT bonus_ledger_payment_kind_key;
CREATE UNIQUE INDEX bonus_ledger_transition_key ON bonus_ledger (transition_id);
CREATE UNIQUE INDEX bonus_ledger_one_grant_key ON bonus_ledger (payment_id) WHERE kind = 'grant';
CREATE INDEX bonus_ledger_payment_idx ON bonus_ledger (payment_id);

-- A success email the refund email overtook is not sent: it is recorded as skipped, with no
-- sent_at, so the (payment, template) key still holds it once.
ALTER TABLE emails_sent ALTER COLUMN sent_at DROP NOT NULL;
ALTER TABLE emails_sent ADD COLUMN skipped boolean NOT NULL DEFAULT false;
ALTER TABLE emails_sent ADD CONSTRAINT emails_sent_skipped_unsent CHECK (skipped = (sent_at IS NULL));
