"""The rate cap's token bucket arithmetic (shared/worker/throttle.py): what a take gets, what
it leaves, how long until the next token."""

from __future__ import annotations

import pytest

from shared.worker import throttle


def test_an_empty_bucket_refills_at_the_rate_up_to_one_seconds_worth() -> None:
    assert throttle.tokens_at(0.0, 5.0, 0.4) == pytest.approx(2.0)
    assert throttle.tokens_at(0.0, 5.0, 3.0) == 5.0
    assert throttle.tokens_at(4.5, 5.0, 0.2) == 5.0


def test_a_cap_under_one_per_second_still_holds_one_token() -> None:
    assert throttle.capacity(0.2) == 1.0
    assert throttle.tokens_at(0.0, 0.2, 10.0) == 1.0
    assert throttle.tokens_at(0.0, 0.2, 2.5) == pytest.approx(0.5)


def test_time_that_ran_backwards_adds_nothing() -> None:
    assert throttle.tokens_at(1.5, 5.0, -2.0) == 1.5


def test_a_take_grants_whole_tokens_and_keeps_the_fraction() -> None:
    assert throttle.take(3.7, 32)[0] == 3
    assert throttle.take(3.7, 32)[1] == pytest.approx(0.7)
    assert throttle.take(3.7, 2)[1] == pytest.approx(1.7)
    assert throttle.take(0.9, 32) == (0, 0.9)


def test_the_wait_is_until_the_next_whole_token_bounded() -> None:
    assert throttle.wait_s(0.5, 5.0) == pytest.approx(0.1)
    assert throttle.wait_s(0.0, 0.1) == throttle.MAX_WAIT_S
    assert throttle.wait_s(0.999999, 5.0) == throttle.MIN_WAIT_S
    assert throttle.wait_s(2.0, 5.0) == throttle.MIN_WAIT_S


def test_takes_over_time_never_exceed_the_rate_plus_one_bucket() -> None:
    """A simulated second of takes every 10 ms (a batcher that always has work)."""
    tokens, granted = 0.0, 0
    for _ in range(1000):  # 10 s
        tokens = throttle.tokens_at(tokens, 7.0, 0.01)
        got, tokens = throttle.take(tokens, 32)
        granted += got
    assert 69 <= granted <= 70


@pytest.mark.parametrize(
    ("rate", "valid"),
    [(0.0, False), (-1.0, False), (0.01, True), (5.0, True), (100_000.0, True), (1e6, False)],
)
def test_a_cap_outside_the_bounds_is_refused(rate: float, valid: bool) -> None:
    assert throttle.valid_rate(rate) is valid
