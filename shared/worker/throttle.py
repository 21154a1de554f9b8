"""The token bucket of a worker's rate cap, as arithmetic: the bucket itself is a row that
every replica takes from with one UPDATE (shared/queries/worker_controls.py, the SQL function
worker_bucket_tokens in 017_worker_controls.sql does the same sums); this says how much a
take gets and how long to wait for the next token."""

from __future__ import annotations

from shared.queries.worker_controls import MAX_RATE, MIN_RATE

# The shortest and longest wait before asking the bucket again: never a busy loop, and a cap
# that was raised or lifted is seen within a second anyway (the controls' NOTIFY wakes it).
MIN_WAIT_S = 0.01
MAX_WAIT_S = 1.0


def capacity(per_second: float) -> float:
    """At most one second's worth, and at least one token (a cap under 1/s still lets one
    message through now and then)."""
    return max(per_second, 1.0)


def tokens_at(tokens: float, per_second: float, elapsed_s: float) -> float:
    """What the bucket holds `elapsed_s` after it held `tokens` (a negative elapsed time, a
    replica whose clock read came before another's take, adds nothing)."""
    return min(capacity(per_second), tokens + per_second * max(0.0, elapsed_s))


def take(tokens: float, wanted: int) -> tuple[int, float]:
    """Whole tokens granted out of `wanted`, and what is left."""
    granted = max(0, min(wanted, int(tokens)))
    return granted, tokens - granted


def wait_s(tokens_left: float, per_second: float) -> float:
    """How long until the bucket holds a whole token again."""
    if tokens_left >= 1.0:
        return MIN_WAIT_S
    return min(MAX_WAIT_S, max(MIN_WAIT_S, (1.0 - tokens_left) / per_second))


def valid_rate(per_second: float) -> bool:
    return MIN_RATE <= per_second <= MAX_RATE
