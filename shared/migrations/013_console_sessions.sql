-- The operator console's sessions (services/api/console/). The cookie holds a random value;
-- only its SHA-256 is stored, so a copy of this table signs nobody in. A session names the
-- token it was opened with by the token's SHA-256: rotating or removing that token in
-- ADMIN_TOKENS ends its sessions at their next request. Sessions end 8 hours after sign-in
-- whatever happens; sign-out deletes the row.
CREATE TABLE console_sessions (
    id_hash bytea PRIMARY KEY,
    actor text NOT NULL,
    token_fingerprint bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX console_sessions_expires_idx ON console_sessions (expires_at);

-- Actions taken in the console are recorded as such.
ALTER TABLE operator_actions DROP CONSTRAINT operator_actions_source_check;
ALTER TABLE operator_actions ADD CONSTRAINT operator_actions_source_check
    CHECK (source IN ('api', 'cli', 'console'));
