"""X-Hub's delivery contract (seed 000): both retry ladders and the per-merchant breaker."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.sim.delivery_rules import (
    AGE_CEILING_S,
    BREAKER_MAX_PAUSE_S,
    BREAKER_PAUSE_S,
    DAY,
    FAST_DELAYS_S,
    HOUR,
    MINUTE,
    SLOW_CEILING_S,
    SLOW_DELAYS_S,
    Action,
    BreakerState,
    CircuitBreaker,
    Decision,
    DeliveryState,
    FailReason,
    Outcome,
    classify,
    expired,
    is_money_event,
    next_action,
)

FAST = Outcome.RETRY_FAST
CLIENT = Outcome.CLIENT_ERROR
OK = Outcome.DELIVERED


def drive(
    outcomes: Iterable[Outcome], *, money: bool = True, start: float = 0.0, created_at: float = 0.0
) -> tuple[list[float], Decision]:
    """Follow the decisions like a deliverer with an always-closed breaker.

    Returns the start time of every attempt and the final decision.
    """
    state = DeliveryState(created_at=created_at, money=money)
    now, times = start, []
    for outcome in outcomes:
        times.append(now)
        decision = next_action(state, outcome, now)
        if decision.action is not Action.RETRY:
            return times, decision
        assert decision.at is not None
        state, now = decision.state, decision.at
    raise AssertionError("the outcomes ran out before the delivery ended")


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in pairwise(times)]


# --- money events ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event_type", "status"),
    [
        ("payment.status_changed", "paid"),
        ("payment.status_changed", "settled"),
        ("payment.status_changed", "refunded"),
        ("payment.status_changed", "PAID"),
        ("withdrawal.status_changed", "completed"),
        ("exchange.status_changed", "completed"),
        ("refund.completed", None),
        ("refund.reversed", None),
    ],
)
def test_money_events_are_the_seeds_list(event_type: str, status: str | None) -> None:
    assert is_money_event(event_type, status)


@pytest.mark.parametrize(
    ("event_type", "status"),
    [
        ("payment.status_changed", "amount_mismatch"),
        ("payment.status_changed", "expired"),
        ("payment.status_changed", "cancelled"),
        ("payment.status_changed", "failed"),
        ("payment.status_changed", "pending"),
        ("payment.status_changed", None),
        ("withdrawal.status_changed", "failed"),
        ("exchange.status_changed", "paid"),
        ("refund.rejected", None),
        ("refund.failed", None),
        ("subscription.status_changed", "paid"),
        ("kyc.status_changed", "completed"),
        ("gateway.status_changed", "completed"),
        ("payment.delivery_proof_reminder", None),
        ("something.new", "completed"),
    ],
)
def test_everything_else_is_non_money(event_type: str, status: str | None) -> None:
    assert not is_money_event(event_type, status)


# --- classify -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        (200, OK),
        (201, OK),
        (204, OK),
        (299, OK),
        (500, FAST),
        (502, FAST),
        (503, FAST),
        (599, FAST),
        (429, FAST),
        (None, FAST),
        (400, CLIENT),
        (401, CLIENT),
        (404, CLIENT),
        (409, CLIENT),
        (422, CLIENT),
        (499, CLIENT),
        (301, CLIENT),
        (302, CLIENT),
        (304, CLIENT),
        (100, FAST),
        (0, FAST),
        (600, FAST),
    ],
)
def test_classify_maps_answers_to_ladders(code: int | None, outcome: Outcome) -> None:
    assert classify(code) is outcome


# --- fast ladder ----------------------------------------------------------------------------


def test_fast_delays_are_the_seeds_table() -> None:
    assert FAST_DELAYS_S == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert sum(FAST_DELAYS_S) == 511  # "~8.5 minutes"


def test_fast_ladder_makes_exactly_ten_attempts_then_fails() -> None:
    times, decision = drive([FAST] * 20)
    assert len(times) == 10
    assert decision.state.attempts == 10
    assert gaps(times) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert times[-1] == 511
    assert decision.action is Action.FAILED
    assert decision.reason is FailReason.FAST_LADDER_EXHAUSTED


@pytest.mark.parametrize("money", [True, False])
def test_429_rides_the_fast_ladder(money: bool) -> None:
    times, decision = drive([classify(429)] * 20, money=money)
    assert len(times) == 10
    assert decision.reason is FailReason.FAST_LADDER_EXHAUSTED


def test_success_on_the_last_fast_attempt_is_delivered() -> None:
    times, decision = drive([FAST] * 9 + [OK])
    assert len(times) == 10
    assert decision.action is Action.DELIVERED
    assert decision.reason is None
    assert decision.state.attempts == 10


def test_first_attempt_success_is_delivered() -> None:
    times, decision = drive([OK])
    assert times == [0]
    assert decision.action is Action.DELIVERED


# --- 4xx ------------------------------------------------------------------------------------


def test_non_money_4xx_fails_at_once() -> None:
    times, decision = drive([CLIENT], money=False)
    assert times == [0]
    assert decision.action is Action.FAILED
    assert decision.reason is FailReason.CLIENT_ERROR


def test_non_money_4xx_after_fast_failures_fails_at_once() -> None:
    times, decision = drive([FAST, FAST, CLIENT], money=False)
    assert len(times) == 3
    assert decision.reason is FailReason.CLIENT_ERROR


def test_slow_delays_are_the_seeds_table() -> None:
    assert SLOW_DELAYS_S == (15 * MINUTE, HOUR, 4 * HOUR, 12 * HOUR, 24 * HOUR)
    assert sum(SLOW_DELAYS_S) == 41 * HOUR + 15 * MINUTE  # "≈ 41 hours"
    assert SLOW_CEILING_S == 48 * HOUR
    assert AGE_CEILING_S == 30 * DAY


def test_money_4xx_walks_the_slow_ladder_then_fails() -> None:
    times, decision = drive([CLIENT] * 10)
    assert len(times) == 6  # the first 4xx plus one retry per step
    assert gaps(times) == list(SLOW_DELAYS_S)
    assert decision.reason is FailReason.SLOW_LADDER_EXHAUSTED
    assert decision.state.fast_failures == 0


def test_slow_ladder_success_is_delivered() -> None:
    times, decision = drive([CLIENT, CLIENT, CLIENT, OK])
    assert times == [0, 15 * MINUTE, 75 * MINUTE, 315 * MINUTE]
    assert decision.action is Action.DELIVERED


def test_slow_ladder_counts_from_its_first_step_not_from_creation() -> None:
    # Undelivered for five days (no endpoint, or held by the breaker): still the full ladder.
    start = 5 * DAY
    times, decision = drive([CLIENT] * 10, start=start)
    assert len(times) == 6
    assert gaps(times) == list(SLOW_DELAYS_S)
    assert decision.state.slow_started_at == start
    assert decision.reason is FailReason.SLOW_LADDER_EXHAUSTED


def test_slow_ladder_does_not_spend_fast_attempts_and_vice_versa() -> None:
    # Nine fast failures, then the whole slow ladder, then one more fast attempt is still left.
    outcomes = [FAST] * 9 + [CLIENT] * 5 + [OK]
    times, decision = drive(outcomes)
    assert len(times) == 15
    assert decision.action is Action.DELIVERED
    assert decision.state.fast_failures == 9
    assert decision.state.slow_steps == 5


def test_fast_budget_is_cumulative_across_slow_steps() -> None:
    # A 5xx to a slow retry goes back to the fast ladder where it left off.
    outcomes = [FAST] * 9 + [CLIENT, FAST]
    times, decision = drive(outcomes)
    assert gaps(times)[-1] == 15 * MINUTE
    assert decision.reason is FailReason.FAST_LADDER_EXHAUSTED


def test_fast_retries_inside_the_slow_ladder_continue_the_fast_delays() -> None:
    times, _ = drive([FAST, CLIENT, FAST, FAST, OK])
    assert gaps(times) == [1, 15 * MINUTE, 2, 4]


def test_48_hour_ceiling_from_the_first_slow_step() -> None:
    state = next_action(DeliveryState(created_at=0, money=True), CLIENT, 10 * HOUR).state
    assert expired(state, 10 * HOUR + SLOW_CEILING_S) is None
    assert expired(state, 10 * HOUR + SLOW_CEILING_S + 1) is FailReason.SLOW_CEILING


def test_slow_retry_that_would_land_past_48_hours_fails() -> None:
    # The fifth 4xx came late (the breaker held the retries): its 24 h step would pass 48 h.
    state = DeliveryState(created_at=0, money=True, attempts=4, slow_steps=4, slow_started_at=0)
    decision = next_action(state, CLIENT, 30 * HOUR)
    assert decision.action is Action.FAILED
    assert decision.reason is FailReason.SLOW_CEILING
    assert next_action(state, CLIENT, 24 * HOUR).at == 48 * HOUR  # exactly on it is allowed


def test_30_day_ceiling_cuts_the_slow_ladder() -> None:
    start = 29.5 * DAY  # 708 h: steps at +15 m, +1 h 15 m, +5 h 15 m fit; +17 h 15 m does not
    times, decision = drive([CLIENT] * 10, start=start)
    assert gaps(times) == list(SLOW_DELAYS_S[:3])
    assert decision.reason is FailReason.AGE_CEILING


def test_30_day_ceiling_cuts_the_fast_ladder() -> None:
    times, decision = drive([FAST] * 10, start=AGE_CEILING_S - 10)
    assert gaps(times) == [1, 2, 4]
    assert decision.reason is FailReason.AGE_CEILING


def test_30_day_ceiling_from_creation() -> None:
    state = DeliveryState(created_at=100.0, money=False)
    assert expired(state, 100.0 + AGE_CEILING_S) is None
    assert expired(state, 100.0 + AGE_CEILING_S + 0.5) is FailReason.AGE_CEILING


def test_age_ceiling_wins_when_it_comes_before_the_slow_ceiling() -> None:
    state = DeliveryState(created_at=0, money=True, slow_started_at=29 * DAY)
    assert state.deadline() == (30 * DAY, FailReason.AGE_CEILING)
    state = DeliveryState(created_at=0, money=True, slow_started_at=DAY)
    assert state.deadline() == (3 * DAY, FailReason.SLOW_CEILING)


@given(st.lists(st.sampled_from(list(Outcome)), min_size=40, max_size=40), st.booleans())
def test_ladders_stay_within_their_budgets(outcomes: list[Outcome], money: bool) -> None:
    times, decision = drive(outcomes, money=money)
    assert len(times) <= 15  # 9 fast + 5 slow failures + the last one
    assert decision.state.attempts == len(times)
    assert decision.state.fast_failures <= 10
    assert decision.state.slow_steps <= len(SLOW_DELAYS_S) + 1
    assert all(g in FAST_DELAYS_S or g in SLOW_DELAYS_S for g in gaps(times))
    if not money:
        assert decision.state.slow_steps == 0


@given(st.integers(min_value=0, max_value=100))
def test_fast_ladder_never_exceeds_ten_attempts(fast_before_success: int) -> None:
    times, decision = drive([FAST] * fast_before_success + [OK], money=False)
    assert len(times) == min(fast_before_success + 1, 10)
    assert decision.action is (Action.DELIVERED if fast_before_success < 10 else Action.FAILED)


# --- circuit breaker ------------------------------------------------------------------------


def feed(breaker: CircuitBreaker, outcomes: Iterable[Outcome], *, start: float = 0.0) -> float:
    """Record outcomes one second apart; returns the time of the last one."""
    now = start
    for i, outcome in enumerate(outcomes):
        now = start + i
        breaker.record(now, outcome)
    return now


def open_breaker(start: float = 0.0) -> tuple[CircuitBreaker, float]:
    breaker = CircuitBreaker()
    return breaker, feed(breaker, [FAST] * 5, start=start)


def test_breaker_starts_closed_and_allows() -> None:
    breaker = CircuitBreaker()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.allow(0)
    assert breaker.pause_s == BREAKER_PAUSE_S == 5 * MINUTE
    assert breaker.reopens_at is None


@pytest.mark.parametrize(
    ("outcomes", "opens"),
    [
        ([FAST] * 5, True),
        ([OK] + [FAST] * 4, True),  # 4 of 5 = 80 %
        ([FAST] * 4 + [OK], True),  # order in the window does not matter (R9)
        ([FAST, OK, FAST, OK, FAST], False),  # 3 of 5 = 60 %
        ([OK, OK] + [FAST] * 3, False),  # 3 of 5 = 60 %
        ([FAST] * 4, False),  # 4 deliveries never open
        ([OK, OK] + [FAST] * 8, True),  # 8 of 10 = 80 %
        ([OK, OK, OK] + [FAST] * 8, False),  # 8 of 11 < 80 %
    ],
)
def test_breaker_opens_at_five_deliveries_and_80_percent(
    outcomes: list[Outcome], opens: bool
) -> None:
    breaker = CircuitBreaker()
    feed(breaker, outcomes)
    assert (breaker.state is BreakerState.OPEN) is opens


def test_successes_dilute_failures_until_80_percent_is_reached() -> None:
    breaker = CircuitBreaker()
    now = feed(breaker, [OK, OK, FAST, FAST, FAST, FAST, FAST, FAST])  # 6 of 8 = 75 %
    assert breaker.state is BreakerState.CLOSED
    breaker.record(now + 1, FAST)  # 7 of 9 = 77.8 %
    assert breaker.state is BreakerState.CLOSED
    breaker.record(now + 2, FAST)  # 8 of 10 = 80 %
    assert breaker.state is BreakerState.OPEN


def test_4xx_do_not_open_the_breaker_nor_count_as_deliveries() -> None:
    breaker = CircuitBreaker()
    feed(breaker, [CLIENT] * 50)
    assert breaker.state is BreakerState.CLOSED
    feed(breaker, [CLIENT] * 10 + [FAST] * 4, start=100)
    assert breaker.state is BreakerState.CLOSED  # still only 4 deliveries
    breaker.record(200, FAST)
    assert breaker.state is BreakerState.OPEN


def test_window_slides_and_old_failures_expire() -> None:
    breaker = CircuitBreaker()
    feed(breaker, [FAST] * 4)  # at 0, 1, 2, 3
    breaker.record(300, FAST)  # the one at 0 is now 5 minutes old: gone
    assert breaker.state is BreakerState.CLOSED
    breaker.record(300.5, FAST)  # 1, 2, 3, 300, 300.5
    assert breaker.state is BreakerState.OPEN


def test_window_keeps_failures_just_under_five_minutes_old() -> None:
    breaker = CircuitBreaker()
    feed(breaker, [FAST] * 4)
    breaker.record(299.9, FAST)
    assert breaker.state is BreakerState.OPEN


def test_open_breaker_refuses_until_the_pause_is_over() -> None:
    breaker, opened = open_breaker()
    assert breaker.reopens_at == opened + 5 * MINUTE
    assert not breaker.allow(opened)
    assert not breaker.allow(opened + 5 * MINUTE - 0.1)
    assert breaker.state is BreakerState.OPEN
    assert breaker.allow(opened + 5 * MINUTE)
    assert breaker.state is BreakerState.HALF_OPEN


def test_one_probe_per_cycle() -> None:
    breaker, opened = open_breaker()
    at = opened + 5 * MINUTE
    assert breaker.allow(at)
    assert not breaker.allow(at)
    assert not breaker.allow(at + 30)  # the others wait ~30 s and try again
    assert not breaker.allow(at + HOUR)  # until the probe is decided


def test_probe_success_closes_and_resets_counters() -> None:
    breaker, opened = open_breaker()
    breaker.record(opened + 1, FAST)  # fails while open: ignored, nothing carried over
    at = opened + 5 * MINUTE
    assert breaker.allow(at)
    breaker.record(at + 1, OK)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.pause_s == 5 * MINUTE
    assert breaker.allow(at + 2)
    assert breaker.allow(at + 2)
    feed(breaker, [FAST] * 4, start=at + 3)  # the window starts empty again
    assert breaker.state is BreakerState.CLOSED


def test_failed_probes_double_the_pause_up_to_30_minutes() -> None:
    breaker, now = open_breaker()
    pauses = [breaker.pause_s]
    for _ in range(5):
        now += breaker.pause_s
        assert not breaker.allow(now - 0.1)
        assert breaker.allow(now)
        breaker.record(now + 1, FAST)
        now += 1
        assert breaker.state is BreakerState.OPEN
        pauses.append(breaker.pause_s)
    assert [p / MINUTE for p in pauses] == [5, 10, 20, 30, 30, 30]


def test_after_closing_the_next_opening_pauses_five_minutes_again() -> None:
    breaker, now = open_breaker()
    for _ in range(3):
        now += breaker.pause_s
        breaker.allow(now)
        breaker.record(now, FAST)
    assert breaker.pause_s == BREAKER_MAX_PAUSE_S
    now += breaker.pause_s
    breaker.allow(now)
    breaker.record(now, OK)
    feed(breaker, [FAST] * 5, start=now + 1)
    assert breaker.state is BreakerState.OPEN
    assert breaker.pause_s == 5 * MINUTE


def test_probe_answered_4xx_decides_nothing_and_frees_the_probe() -> None:
    breaker, opened = open_breaker()
    at = opened + 5 * MINUTE
    assert breaker.allow(at)
    breaker.record(at + 1, CLIENT)
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.pause_s == 5 * MINUTE
    assert breaker.allow(at + 2)
    assert not breaker.allow(at + 2)


def test_breaker_pauses_do_not_spend_delivery_attempts() -> None:
    # The deliverer holds a due retry while the breaker is open; the state is untouched.
    breaker, opened = open_breaker()
    decision = next_action(DeliveryState(created_at=0, money=False), FAST, opened)
    now = decision.at
    assert now is not None
    while not breaker.allow(now):
        now += 30
    assert now >= opened + 5 * MINUTE
    assert next_action(decision.state, OK, now).state.attempts == 2


events = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=2 * HOUR, allow_nan=False),
        st.sampled_from([*Outcome, None]),  # None: an allow() call instead of a record
    ),
    max_size=200,
)


@given(events)
def test_breaker_invariants(steps: list[tuple[float, Outcome | None]]) -> None:
    breaker = CircuitBreaker()
    now = 0.0
    probes_this_cycle = 0
    for dt, outcome in steps:
        now += dt
        before = breaker.state
        reopens_at = breaker.reopens_at
        if outcome is None:
            allowed = breaker.allow(now)
            if before is BreakerState.OPEN and reopens_at is not None and now < reopens_at:
                assert not allowed
            if breaker.state is BreakerState.HALF_OPEN and allowed:
                probes_this_cycle += 1
                assert probes_this_cycle == 1
        else:
            breaker.record(now, outcome)
            if before is BreakerState.HALF_OPEN:
                probes_this_cycle = 0  # decided (or freed by a 4xx)
        assert BREAKER_PAUSE_S <= breaker.pause_s <= BREAKER_MAX_PAUSE_S
        if breaker.state is BreakerState.CLOSED:
            assert breaker.pause_s == BREAKER_PAUSE_S
