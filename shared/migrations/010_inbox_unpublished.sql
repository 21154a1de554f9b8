-- What the sweeper looks for (stored, publish never confirmed) moves to a narrow table of its
-- own: a row is inserted beside each new inbox row and deleted at the confirm, so an inbox
-- row is written once and never rewritten. Marking `inbox.published_at` wrote a second
-- version of every row (body included) and a second entry in each of its indexes, which
-- doubled the inbox and its unique index and slowed each run of the hot path's INSERT more
-- than the last. Dead rows of this table are few and small, and autovacuum clears them.
-- No foreign key to inbox: its check locks the inbox row just inserted, a third of the
-- batch INSERT's time (measured); retention never deletes a row that is still here.
CREATE TABLE inbox_unpublished (
    id          bigint      PRIMARY KEY,  -- inbox.id
    received_at timestamptz NOT NULL
);
INSERT INTO inbox_unpublished (id, received_at)
    SELECT id, received_at FROM inbox WHERE published_at IS NULL;
ALTER TABLE inbox_unpublished SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);
DROP INDEX IF EXISTS inbox_unpublished_idx;
ALTER TABLE inbox DROP COLUMN published_at;
