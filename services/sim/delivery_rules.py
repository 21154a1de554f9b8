"""X-Hub's delivery contract (seed 000, "Доставка уведомлений") as pure rules, on a clock the
caller passes in (a simulator or a test compresses hours into nothing). The R-tags name the
decisions where the seed is silent (docs/simulator.md)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

MINUTE: Final = 60.0
HOUR: Final = 60 * MINUTE
DAY: Final = 24 * HOUR

FAST_ATTEMPTS: Final = 10
# Pause before attempt n (n >= 2) is 2^(n-2) s, i.e. the seed's 2^(attempt-1) after a failed
# attempt: 1, 2, 4 ... 256 s, summing to 511 s (~8.5 min).
FAST_DELAYS_S: Final[tuple[float, ...]] = tuple(float(2**k) for k in range(FAST_ATTEMPTS - 1))
# The slow ladder's five steps (pause before the next attempt), ~41 h in all.
SLOW_DELAYS_S: Final[tuple[float, ...]] = (15 * MINUTE, HOUR, 4 * HOUR, 12 * HOUR, 24 * HOUR)
SLOW_CEILING_S: Final = 48 * HOUR  # from the slow ladder's first step
AGE_CEILING_S: Final = 30 * DAY  # from the delivery's creation

BREAKER_WINDOW_S: Final = 5 * MINUTE
BREAKER_MIN_DELIVERIES: Final = 5
BREAKER_FAILURE_PCT: Final = 80
BREAKER_PAUSE_S: Final = 5 * MINUTE
BREAKER_MAX_PAUSE_S: Final = 30 * MINUTE
HOLD_RETRY_S: Final = 30.0  # "the others wait ~30 seconds and try again" while it is open

_MONEY_STATUSES: Final[dict[str, frozenset[str]]] = {
    "payment.status_changed": frozenset({"paid", "settled", "refunded"}),
    "withdrawal.status_changed": frozenset({"completed"}),
    "exchange.status_changed": frozenset({"completed"}),
}
_MONEY_EVENTS: Final = frozenset({"refund.completed", "refund.reversed"})


def is_money_event(event_type: str, status: str | None) -> bool:
    """True for the seed's money events, which get the slow ladder on a 4xx.

    payment.status_changed paid/settled/refunded, withdrawal/exchange.status_changed completed,
    refund.completed and refund.reversed. Everything else (amount_mismatch, expired, cancelled,
    failed, refund.rejected, refund.failed, ...) is non-money. Status compares lower-case.
    """
    if event_type in _MONEY_EVENTS:
        return True
    statuses = _MONEY_STATUSES.get(event_type)
    return statuses is not None and status is not None and status.lower() in statuses


class Outcome(StrEnum):
    DELIVERED = "delivered"  # 2xx
    RETRY_FAST = "retry_fast"  # 5xx, 429, network error, timeout
    CLIENT_ERROR = "client_error"  # any other 4xx (and 3xx, R1)


def classify(status_code: int | None) -> Outcome:
    """Map an HTTP answer (None: network error or timeout) to the ladder it feeds."""
    if status_code is None or not 200 <= status_code <= 599:
        return Outcome.RETRY_FAST  # R1
    if status_code <= 299:
        return Outcome.DELIVERED
    if status_code == 429 or status_code >= 500:
        return Outcome.RETRY_FAST
    return Outcome.CLIENT_ERROR


class Action(StrEnum):
    RETRY = "retry"
    DELIVERED = "delivered"
    FAILED = "failed"


class FailReason(StrEnum):
    CLIENT_ERROR = "client_error"  # a 4xx to a non-money event: no retries at all
    FAST_LADDER_EXHAUSTED = "fast_ladder_exhausted"
    SLOW_LADDER_EXHAUSTED = "slow_ladder_exhausted"
    SLOW_CEILING = "slow_ceiling"  # 48 h after the slow ladder's first step
    AGE_CEILING = "age_ceiling"  # 30 days after creation


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryState:
    """One delivery's ladder bookkeeping; `next_action` returns the next one."""

    created_at: float
    money: bool
    attempts: int = 0  # every attempt made, whatever its outcome
    fast_failures: int = 0  # attempts that ended RETRY_FAST (<= FAST_ATTEMPTS)
    slow_steps: int = 0  # slow pauses taken (<= len(SLOW_DELAYS_S))
    slow_started_at: float | None = None  # time of the first 4xx on a money event

    def deadline(self) -> tuple[float, FailReason]:
        """The latest time an attempt may start, and the ceiling that sets it (R4)."""
        age = (self.created_at + AGE_CEILING_S, FailReason.AGE_CEILING)
        if self.slow_started_at is None:
            return age
        return min((self.slow_started_at + SLOW_CEILING_S, FailReason.SLOW_CEILING), age)


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    action: Action
    state: DeliveryState
    at: float | None = None  # when to attempt again (RETRY only)
    reason: FailReason | None = None  # why it failed (FAILED only)


def expired(state: DeliveryState, now: float) -> FailReason | None:
    """The ceiling `now` is past, if any: check before an attempt delayed by the breaker."""
    limit, reason = state.deadline()
    return reason if now > limit else None


def next_action(state: DeliveryState, outcome: Outcome, now: float) -> Decision:
    """What to do after an attempt that ended at `now` with `outcome`.

    Fast ladder (5xx/429/network): 10 attempts, pauses 1, 2, 4 ... 256 s, then FAILED.
    Slow ladder (4xx on a money event): pauses 15 min, 1 h, 4 h, 12 h, 24 h from its first step,
    48 h hard ceiling from that step, then FAILED. A non-money 4xx fails at once. The ladders'
    budgets are independent (R3); the 30-day age ceiling caps everything (R4).
    """
    state = replace(state, attempts=state.attempts + 1)
    if outcome is Outcome.DELIVERED:
        return Decision(action=Action.DELIVERED, state=state)
    if outcome is Outcome.RETRY_FAST:
        state = replace(state, fast_failures=state.fast_failures + 1)
        if state.fast_failures >= FAST_ATTEMPTS:
            return _failed(state, FailReason.FAST_LADDER_EXHAUSTED)
        at = now + FAST_DELAYS_S[state.fast_failures - 1]
    else:
        if not state.money:
            return _failed(state, FailReason.CLIENT_ERROR)
        started = now if state.slow_started_at is None else state.slow_started_at
        state = replace(state, slow_steps=state.slow_steps + 1, slow_started_at=started)
        if state.slow_steps > len(SLOW_DELAYS_S):
            return _failed(state, FailReason.SLOW_LADDER_EXHAUSTED)
        at = now + SLOW_DELAYS_S[state.slow_steps - 1]
    reason = expired(state, at)
    if reason is not None:
        return _failed(state, reason)  # R4: it could never be attempted in time
    return Decision(action=Action.RETRY, state=state, at=at)


def _failed(state: DeliveryState, reason: FailReason) -> Decision:
    return Decision(action=Action.FAILED, state=state, reason=reason)


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """The per-merchant breaker: a small state machine over (now, outcome) events.

    CLOSED -> OPEN: >= 5 deliveries in a sliding 5-minute window, >= 80 % of them failed.
    OPEN -> HALF_OPEN: the pause (5 min, doubling per failed probe, capped at 30 min) is over;
    exactly one probe is allowed per cycle. Probe success -> CLOSED, counters reset; probe
    failure -> OPEN with the pause doubled. 4xx answers are invisible to it (R5).
    """

    __slots__ = ("_failures", "_opened_at", "_pause_s", "_probe_granted", "_state", "_window")

    def __init__(self) -> None:
        self._state = BreakerState.CLOSED
        self._window: deque[tuple[float, bool]] = deque()  # (recorded at, failed)
        # The window's failures, kept as it slides: a breaker-release backlog puts thousands
        # of deliveries in one window, and counting them at every answer was quadratic
        # (10,000 answers: seconds of the simulator's CPU, taken from the system it drives).
        self._failures = 0
        self._pause_s = BREAKER_PAUSE_S
        self._opened_at = 0.0
        self._probe_granted = False

    @property
    def state(self) -> BreakerState:
        return self._state

    @property
    def pause_s(self) -> float:
        """The pause in force while open, else the one the next opening would use."""
        return self._pause_s

    @property
    def reopens_at(self) -> float | None:
        """When an OPEN breaker next grants a probe; None unless OPEN."""
        return self._opened_at + self._pause_s if self._state is BreakerState.OPEN else None

    def allow(self, now: float) -> bool:
        """May a delivery be attempted now? In HALF_OPEN, True once: that attempt is the probe."""
        if self._state is BreakerState.OPEN and now >= self._opened_at + self._pause_s:
            self._state = BreakerState.HALF_OPEN
            self._probe_granted = False
        if self._state is BreakerState.HALF_OPEN:
            if self._probe_granted:
                return False
            self._probe_granted = True
            return True
        return self._state is BreakerState.CLOSED

    def trip(self, now: float) -> None:
        """Open now, as after an outage of the endpoint (>= 5 deliveries, >= 80 % failed)."""
        self._open(now, self._pause_s)

    def record(self, now: float, outcome: Outcome) -> None:
        """Feed the outcome of an attempt that finished at `now`."""
        if outcome is Outcome.CLIENT_ERROR:
            if self._state is BreakerState.HALF_OPEN:
                self._probe_granted = False  # R5: the probe decided nothing; grant another
            return
        failed = outcome is Outcome.RETRY_FAST
        if self._state is BreakerState.OPEN:
            return  # R7
        if self._state is BreakerState.HALF_OPEN:
            if failed:
                self._open(now, min(self._pause_s * 2, BREAKER_MAX_PAUSE_S))
            else:
                self._state = BreakerState.CLOSED
                self._pause_s = BREAKER_PAUSE_S
            return
        self._window.append((now, failed))
        self._failures += failed
        while self._window and now - self._window[0][0] >= BREAKER_WINDOW_S:
            self._failures -= self._window.popleft()[1]  # R6
        deliveries = len(self._window)
        tripped = 100 * self._failures >= BREAKER_FAILURE_PCT * deliveries
        if deliveries >= BREAKER_MIN_DELIVERIES and tripped:
            self._open(now, self._pause_s)

    def _open(self, now: float, pause_s: float) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = now
        self._pause_s = pause_s
        self._window.clear()
        self._failures = 0
        self._probe_granted = False
