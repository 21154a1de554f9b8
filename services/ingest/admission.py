"""Admission to the accept path by predicted wait: the webhooks ahead of a new one, against
the rate at which the acceptor was measured to finish them with work waiting, compared with
what is left of that request's answer budget (docs/ingest-burst.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    # The rate assumed until one is measured (a process that just started, or whose last
    # measurement is older than forget_after_s). A burst reaches the acceptor faster than it
    # finishes a first batch (X-Hub's breaker-release backlog of 10,000: 9,000 waiting within
    # 0.6 s, before any batch ended), so this is what admits a first burst: half what the
    # acceptor finishes with work waiting on a 2-core machine (docs/performance.md).
    assumed_rows_per_s: float = 2000.0
    # Admitted only if its predicted answer comes this long before its deadline: the answer
    # still has to be written, and the rate may drop meanwhile.
    margin_s: float = 1.0
    # A measurement spans at least this long: many batches, and more than the moments in
    # which a burst's requests take the CPU from the batches (measured with 0.25 s: samples
    # of 900/s in a burst drained at 3,000/s, and a few of its webhooks refused for nothing).
    sample_s: float = 1.0
    # ... and weighs this much against the ones before it.
    weight: float = 0.5
    # No batch finished for this long while webhooks wait: the acceptor is stalled (a
    # database or broker that stopped answering) and the rate is what it finished since.
    stall_s: float = 1.0
    forget_after_s: float = 60.0


class DrainRate:
    """Webhooks per second the acceptor finishes while work is waiting for it.

    Measured over stretches in which webhooks waited throughout: from a batch's end to the
    end of the first batch at least sample_s later. A stretch in which the acceptor ran dry
    is dropped (it measured the arrivals, not the acceptor), and so is the time to the first
    batch's end after that (the latency of a batch, not a rate). Times are event loop
    seconds."""

    def __init__(self, config: AdmissionConfig) -> None:
        self._config = config
        self._rate = config.assumed_rows_per_s
        self._measured_at: float | None = None
        self._since: float | None = None  # the open stretch's start (a batch's end)
        self._rows = 0  # finished in the open stretch

    def finished(self, rows: int, now: float, *, waiting: bool) -> None:
        """A batch of `rows` ended (answered, whatever the answers were); `waiting`: webhooks
        still wait for a batch."""
        if not waiting:
            self._since = None
            return
        if self._since is None:
            self._since, self._rows = now, 0
            return
        self._rows += rows
        if (elapsed := now - self._since) >= self._config.sample_s:
            sample = self._rows / elapsed
            if self._measured_at is None or self._forgotten(now):
                self._rate = sample
            else:
                self._rate += self._config.weight * (sample - self._rate)
            self._measured_at = now
            self._since, self._rows = now, 0

    def ran_dry(self) -> None:
        """Nothing waits any more: the open stretch no longer measures the acceptor."""
        self._since = None

    def rows_per_s(self, now: float) -> float:
        """The rate to predict with at `now`: the measured one (or the assumed one, before a
        measurement and after a long time without one), lower while a stretch has gone on
        for stall_s without reaching it."""
        rate = self._config.assumed_rows_per_s if self._forgotten(now) else self._rate
        if self._since is not None and (elapsed := now - self._since) >= self._config.stall_s:
            rate = min(rate, self._rows / elapsed)
        return rate

    def predicted_wait_s(self, ahead: int, now: float) -> float:
        """How long until `ahead` webhooks and then one more are finished, from `now`."""
        rate = self.rows_per_s(now)
        return (ahead + 1) / rate if rate > 0 else math.inf

    def _forgotten(self, now: float) -> bool:
        return self._measured_at is None or now - self._measured_at > self._config.forget_after_s
