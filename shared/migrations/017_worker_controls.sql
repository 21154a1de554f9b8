-- What operators set on a worker (orders, bonuses, email), shared by every replica of it:
-- a pause (who, why, since when) and a rate cap in messages per second. The cap is a token
-- bucket in the same row: each batch takes its tokens with one atomic UPDATE
-- (shared/queries/worker_controls.py), so replicas share one cap. Every change NOTIFYs
-- payhooks_worker_controls; replicas also re-read their row every second.
CREATE TABLE worker_controls (
    worker        text PRIMARY KEY,
    paused_at     timestamptz,
    paused_by     text,
    paused_reason text,
    per_second    double precision CHECK (per_second > 0),
    throttled_at  timestamptz,
    throttled_by  text,
    -- The bucket: tokens left at refilled_at; it holds at most greatest(per_second, 1).
    tokens        double precision NOT NULL DEFAULT 0,
    refilled_at   timestamptz NOT NULL DEFAULT now(),
    -- What the last take granted (RETURNING shows the row after the UPDATE).
    granted       integer NOT NULL DEFAULT 0,
    CONSTRAINT worker_controls_pause_whole CHECK (
        (paused_at IS NULL) = (paused_by IS NULL) AND (paused_at IS NULL) = (paused_reason IS NULL)
    ),
    CONSTRAINT worker_controls_throttle_whole CHECK (
        (per_second IS NULL) = (throttled_at IS NULL) AND (per_second IS NULL) = (throttled_by IS NULL)
    )
);

-- The tokens a bucket holds at `at`: refilled at per_second since refilled_at, up to its
-- capacity (shared/worker/throttle.py is the same arithmetic, unit-tested).
CREATE FUNCTION worker_bucket_tokens(
    tokens double precision, per_second double precision, refilled_at timestamptz, at timestamptz
) RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT least(
        greatest(per_second, 1.0),
        tokens + per_second * greatest(0.0, extract(epoch FROM at - refilled_at)::double precision)
    )
$$;
