"""X-Hub's breaker-release burst (seed 000): while a merchant's circuit breaker is open every
delivery to it is held, and once a probe passes "the queue is processed whole", at once. What
the backlog is at most, and what a run of it showed (docs/ingest-burst.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from services.sim.deliverer import DeliveryRecord, Result

# The largest backlog the simulator releases at once: a merchant's webhooks for as long as its
# breaker holds them. After an outage of ours the breaker pauses 5 minutes, doubling per failed
# probe up to 30, and the backlog is everything sent meanwhile: 10,000 is 30 minutes at
# 5.5 webhooks/s (a payment makes 1-3), or a longer outage at a lower rate. The sizing rule is
# the shop's peak webhooks/s times the longest outage plus 30 minutes (docs/ingest-burst.md).
LARGEST_BACKLOG = 10_000
BUDGET_S = 10.0  # X-Hub waits this long for an answer (seed 000's checklist)


@dataclass(frozen=True, slots=True)
class BurstFigures:
    """What the deliveries a closing breaker released got, each timed from its release."""

    released: int
    statuses: Counter[str]  # of their first attempt after the release ("none": no answer)
    max_latency_s: float  # release to answer, the slowest
    failed: int  # deliveries (released or not) that ended FAILED

    @property
    def all_answered_200_in_budget(self) -> bool:
        return (
            self.released > 0
            and self.statuses == Counter({"200": self.released})
            and self.max_latency_s < BUDGET_S
        )

    def render(self) -> str:
        statuses = ", ".join(f"{k} x{n}" for k, n in sorted(self.statuses.items()))
        return (
            f"burst: {self.released} deliveries released at once by the breaker; first answers"
            f" {statuses or 'none'}; slowest {self.max_latency_s:.2f} s after the release"
            f" (budget {BUDGET_S:g} s); FAILED {self.failed}"
        )


def figures(records: Sequence[DeliveryRecord]) -> BurstFigures:
    """The released deliveries' first answers after their release, from their records."""
    statuses: Counter[str] = Counter()
    slowest = 0.0
    released = 0
    for record in records:
        if record.released_at is None:
            continue
        released += 1
        after = [
            (at, code)
            for at, code in zip(record.answered_at, record.http_statuses, strict=True)
            if at >= record.released_at
        ]
        if not after:
            statuses["none"] += 1
            continue
        at, code = after[0]
        statuses[str(code) if code is not None else "none"] += 1
        slowest = max(slowest, at - record.released_at)
    failed = sum(1 for r in records if r.result is Result.FAILED)
    return BurstFigures(released, statuses, slowest, failed)
