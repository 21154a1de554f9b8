"""The workers an operator can pause or throttle, and the checks of what they type: a worker's
name (its metrics' `worker` label; `emails`, its queue's name, also names the email worker),
a pause's reason, a cap in messages per second."""

from __future__ import annotations

import math

from shared.ops.order_input import text_problem
from shared.queries import audit
from shared.queries.worker_controls import MAX_RATE, MIN_RATE

WORKERS = ("orders", "bonuses", "email")
_ALIASES = {"emails": "email"}
MAX_REASON_CHARS = 500

# The audit trail's actions.
PAUSE = audit.WORKER_PAUSE
RESUME = audit.WORKER_RESUME
THROTTLE = audit.WORKER_THROTTLE
UNTHROTTLE = audit.WORKER_UNTHROTTLE


class WorkerInputError(ValueError):
    """What is wrong with an operator's input, said so that the edge can show it as is."""


def worker_name(raw: str) -> str | None:
    """The worker `raw` names, or None if none."""
    name = _ALIASES.get(raw, raw)
    return name if name in WORKERS else None


def parse_reason(raw: object) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise WorkerInputError("reason is required: say why the worker is paused")
    reason = raw.strip()
    if len(reason) > MAX_REASON_CHARS:
        raise WorkerInputError(f"reason must be at most {MAX_REASON_CHARS} characters")
    if (why := text_problem(reason)) is not None:
        raise WorkerInputError(f"reason {why}")
    return reason


def parse_rate(raw: object) -> float:
    """A cap in messages per second: a number (or its text) within the bounds."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise WorkerInputError("per_second must be a number")
    try:
        rate = float(raw)
    except ValueError:
        raise WorkerInputError("per_second must be a number") from None
    if not math.isfinite(rate) or not MIN_RATE <= rate <= MAX_RATE:
        raise WorkerInputError(f"per_second must be from {MIN_RATE:g} to {MAX_RATE:g}")
    return rate
