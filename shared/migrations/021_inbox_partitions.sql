-- The inbox partitioned by day (UTC) on received_at, so retention drops a whole day at once
-- (no per-row DELETE, no bloat) after writing it to an archive (shared/ops/archive.py).
-- Daily: 36-40 live partitions at RETENTION_DAYS 35 (few enough for PostgreSQL's planner),
-- one archive file per day (a week's would be seven times larger to write, verify and, for
-- an erasure, rewrite), and rows outlive RETENTION_DAYS by at most a day.
--
-- Dedup moves to `inbox_keys`: a unique index of a partitioned table must hold the partition
-- key, and (provider, event_id, received_at) would not reject a copy received on another day.
-- Ingest inserts the key and the row in one statement (shared/queries/inbox.py); the key also
-- outlives the row's partition (shared/queries/partitions.py KEYS_KEPT), so a late retry of
-- an expired event is still a duplicate. id and received_at find the row and its partition.
--
-- Lock cost: the copy of the old table runs under its ACCESS EXCLUSIVE lock, taken by the
-- rename: ingest answers 503 (the providers retry) and views wait until it commits. Measured
-- on a 2-core test machine: 12 s for 400,000 rows of 1 KB bodies (docs/retention.md); on a
-- large inbox, migrate in a quiet hour.
CREATE TABLE inbox_keys (
    provider     text        NOT NULL,
    event_id     text        NOT NULL,
    id           bigint      NOT NULL,  -- inbox.id
    received_at  timestamptz NOT NULL,  -- inbox.received_at: the row's partition
    -- Copies after the first, and when the latest came: counted on the key (its ON CONFLICT
    -- waits for a concurrent insert and sees it; an UPDATE of the row would miss it), so an
    -- archived event's late copies are counted too, and the inbox row is written once.
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    duplicates   integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (provider, event_id)
);
-- Deleting keys past their time scans by age; BRIN costs next to nothing on the hot path.
CREATE INDEX inbox_keys_received_brin ON inbox_keys USING brin (received_at);

ALTER TABLE inbox RENAME TO inbox_unpartitioned;
ALTER SEQUENCE inbox_id_seq OWNED BY NONE;

CREATE TABLE inbox (
    id            bigint      NOT NULL DEFAULT nextval('inbox_id_seq'),
    provider      text        NOT NULL,
    event_id      text        NOT NULL,
    event_type    text        NOT NULL,
    payment_id    text,
    body          bytea       NOT NULL,
    headers       jsonb       NOT NULL,
    received_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT inbox_pk PRIMARY KEY (id, received_at)
) PARTITION BY RANGE (received_at);
ALTER SEQUENCE inbox_id_seq OWNED BY inbox.id;
-- Rows of a day with no partition yet (the reconciler creates them days ahead): an insert
-- never fails for want of one. payhooks_inbox_partition moves them out when it creates theirs.
CREATE TABLE inbox_default PARTITION OF inbox DEFAULT;

-- The day's partition, `inbox_pYYYYMMDD` holding [day, day + 1) UTC, created if missing. It is
-- made apart and attached (SHARE UPDATE EXCLUSIVE on inbox: ingest's inserts go on), never
-- with CREATE ... PARTITION OF (ACCESS EXCLUSIVE on inbox). Rows of its day in the default
-- partition move into it first.
CREATE FUNCTION payhooks_inbox_partition(day date) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    part text := 'inbox_p' || to_char(day, 'YYYYMMDD');
    lo timestamptz := day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    -- Replicas of the reconciler may both try: one at a time ("payi").
    PERFORM pg_advisory_xact_lock(1885432169);
    IF EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent = 'inbox'::regclass AND c.relname = part) THEN
        RETURN part;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE inbox INCLUDING DEFAULTS)', part);
    EXECUTE format('WITH moved AS (DELETE FROM inbox_default WHERE received_at >= $1'
                   ' AND received_at < $2 RETURNING *) INSERT INTO %I SELECT * FROM moved', part)
        USING lo, hi;
    EXECUTE format('ALTER TABLE inbox ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   part, lo, hi);
    RETURN part;
END $$;

-- Detach and drop one day's partition (the archive's transaction, shared/ops/archive.py).
CREATE FUNCTION payhooks_drop_inbox_partition(day date) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    part text := 'inbox_p' || to_char(day, 'YYYYMMDD');
BEGIN
    EXECUTE format('ALTER TABLE inbox DETACH PARTITION %I', part);
    EXECUTE format('DROP TABLE %I', part);
END $$;

-- A partition for each day of the old rows, today and the next three days.
SELECT payhooks_inbox_partition(d::date)
FROM generate_series(
    date_trunc('day', least((SELECT min(received_at) FROM inbox_unpartitioned), now())
                      AT TIME ZONE 'UTC'),
    date_trunc('day', now() AT TIME ZONE 'UTC') + interval '3 days',
    interval '1 day'
) AS d;

INSERT INTO inbox (id, provider, event_id, event_type, payment_id, body, headers, received_at)
    SELECT id, provider, event_id, event_type, payment_id, body, headers, received_at
    FROM inbox_unpartitioned;
INSERT INTO inbox_keys (provider, event_id, id, received_at, last_seen_at, duplicates)
    SELECT provider, event_id, id, received_at, last_seen_at, duplicates
    FROM inbox_unpartitioned;
DROP TABLE inbox_unpartitioned;

-- The views' indexes (011), now one per partition. No index on (provider, event_id): a lookup
-- by event goes through inbox_keys to (id, received_at), the primary key.
CREATE INDEX inbox_received_idx ON inbox (received_at DESC, id DESC);
CREATE INDEX inbox_event_type_received_idx ON inbox (event_type, received_at DESC, id DESC);
CREATE INDEX inbox_payment_received_idx ON inbox (payment_id, received_at DESC, id DESC)
    WHERE payment_id IS NOT NULL;

-- Each archive written before a partition was dropped (or rewritten by an erasure): the file in
-- ARCHIVE_DIR, the day it holds [range_from, range_to), its rows and the SHA-256 of the file.
CREATE TABLE inbox_archives (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    file_name    text        NOT NULL UNIQUE,
    range_from   timestamptz NOT NULL,
    range_to     timestamptz NOT NULL,
    rows         bigint      NOT NULL,
    sha256       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    rewritten_at timestamptz,  -- by an erasure (the file then has a new name and checksum)
    CONSTRAINT inbox_archives_day UNIQUE (range_from)
);
