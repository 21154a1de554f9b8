-- The audit trail: every operator action (DLQ requeue and purge, order registration), who did
-- it (a token's name, or cli:<OS user>) and from where. Written after the action succeeded;
-- read newest first by id (`GET /api/audit`, `payhooks audit`).
CREATE TABLE operator_actions (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor text NOT NULL,
    source text NOT NULL CHECK (source IN ('api', 'cli')),
    action text NOT NULL,
    target text NOT NULL,
    filter jsonb NOT NULL DEFAULT '{}',
    ids text[] NOT NULL DEFAULT '{}',
    count integer NOT NULL
);
