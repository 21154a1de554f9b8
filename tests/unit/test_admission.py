"""services/ingest/admission.py: the accept rate admission predicts with, on a given clock."""

from __future__ import annotations

import math

import pytest

from services.ingest.admission import AdmissionConfig, DrainRate

CONFIG = AdmissionConfig(
    assumed_rows_per_s=2000.0, sample_s=1.0, weight=0.5, stall_s=1.0, forget_after_s=60.0
)


def _drained(rate: DrainRate, rows_per_batch: int, batches: int, every_s: float, t: float) -> float:
    """`batches` batches of `rows_per_batch` ending every `every_s` from `t`, work waiting
    throughout; the time of the last."""
    for _ in range(batches):
        t += every_s
        rate.finished(rows_per_batch, t, waiting=True)
    return t


def test_before_any_measurement_the_assumed_rate_predicts() -> None:
    rate = DrainRate(CONFIG)
    assert rate.rows_per_s(0.0) == 2000.0
    assert rate.predicted_wait_s(9_999, 0.0) == pytest.approx(5.0)


def test_a_stretch_with_work_waiting_measures_rows_per_second_after_its_first_batch() -> None:
    rate = DrainRate(CONFIG)
    # The first batch's end opens the stretch (the time before it is a batch's latency).
    rate.finished(256, 10.0, waiting=True)
    _drained(rate, 256, 8, 0.125, 10.0)  # 2,048 rows in the second after it opened
    assert rate.rows_per_s(11.0) == pytest.approx(2048.0)


def test_samples_are_weighed_against_the_earlier_rate() -> None:
    rate = DrainRate(CONFIG)
    rate.finished(100, 0.0, waiting=True)
    t = _drained(rate, 100, 8, 0.125, 0.0)  # 800/s
    _drained(rate, 300, 8, 0.125, t)  # 2,400/s
    assert rate.rows_per_s(t + 1.0) == pytest.approx(1600.0)


def test_a_stretch_in_which_the_acceptor_ran_dry_measures_nothing() -> None:
    rate = DrainRate(CONFIG)
    rate.finished(256, 0.0, waiting=True)
    rate.ran_dry()  # the arrivals stopped: what follows measures them, not the acceptor
    rate.finished(4, 0.5, waiting=False)
    rate.finished(4, 5.0, waiting=True)  # the next burst's first batch opens a new stretch
    assert rate.rows_per_s(5.0) == 2000.0
    _drained(rate, 256, 8, 0.125, 5.0)
    assert rate.rows_per_s(6.0) == pytest.approx(2048.0)


def test_no_batch_ending_for_stall_s_while_work_waits_lowers_the_rate_to_what_ended() -> None:
    rate = DrainRate(CONFIG)
    rate.finished(256, 0.0, waiting=True)
    t = _drained(rate, 256, 8, 0.125, 0.0)  # 2,048/s
    rate.finished(256, t + 0.125, waiting=True)  # a batch, then nothing ends (a stall)
    assert rate.rows_per_s(t + 0.875) == pytest.approx(2048.0)  # not yet stall_s
    assert rate.rows_per_s(t + 2.0) == pytest.approx(128.0)  # 256 rows in 2 s
    rate.finished(0, t + 2.0, waiting=True)  # nothing answered since: a stalled sample
    assert rate.predicted_wait_s(0, t + 3.5) == math.inf


def test_a_measurement_older_than_forget_after_s_gives_way_to_the_assumed_rate() -> None:
    rate = DrainRate(CONFIG)
    rate.finished(10, 0.0, waiting=True)
    _drained(rate, 10, 8, 0.125, 0.0)  # 80/s: a slow moment
    rate.ran_dry()
    assert rate.rows_per_s(30.0) == pytest.approx(80.0)
    assert rate.rows_per_s(62.0) == 2000.0
