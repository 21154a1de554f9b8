"""An operator's resolution as values (shared/resolution.py), the window of `payhooks missing`
(shared/ops/missing.py) and ingest's buffer of refused ids (services/ingest/refusals.py)."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pytest

from services.ingest.refusals import MAX_ID_CHARS, Refusals, keepable_id
from shared.amqp.topology import BINDINGS, _topic_matches
from shared.ops.missing import DEFAULT_WINDOW, BadWindowError, Window
from shared.order_machine import OrderState
from shared.queries.resolution import ORDERS_EVENTS_SQL
from shared.resolution import (
    MAX_REASON_CHARS,
    ResolveInputError,
    ResolveRefusedError,
    allowed,
    parse_request,
    plan,
)
from shared.vocabulary import OrderStatus as S

NOW = dt.datetime(2026, 12, 6, 3, 0, tzinfo=dt.UTC)


def state(status: S, **changes: object) -> OrderState:
    return OrderState(status=status, amount=Decimal("100.00"), currency="USD", **changes)  # type: ignore[arg-type]


def test_a_request_names_its_status_in_any_case_and_needs_a_reason() -> None:
    asked = parse_request(" paid ", "  bank statement  ")
    assert (asked.to, asked.reason, asked.force) == (S.PAID, "bank statement", False)
    with pytest.raises(ResolveInputError) as caught:
        parse_request("NOPE", "", "yes")
    assert set(caught.value.fields) == {"to", "reason", "force"}
    with pytest.raises(ResolveInputError):
        parse_request("PAID", "x" * (MAX_REASON_CHARS + 1))
    with pytest.raises(ResolveInputError):
        parse_request("PAID", "a\x00b")
    with pytest.raises(ResolveInputError):
        parse_request(None, "why")


def test_a_move_the_machine_makes_is_not_forced_and_its_transition_is_the_machines() -> None:
    new, moved = plan(state(S.PENDING), parse_request("PAID", "r"), NOW)
    assert new.status is S.PAID
    assert new.changed_at == NOW
    assert (moved.name, moved.from_status, moved.to_status) == ("order.paid", S.PENDING, S.PAID)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (S.PAID, S.CANCELLED),  # money beats non-money
        (S.REFUNDED, S.PAID),  # only a dated refund.reversed goes back
        (S.SETTLED, S.PAID),
        (S.CANCELLED, S.PENDING),
    ],
)
def test_a_move_the_machine_forbids_needs_force(current: S, target: S) -> None:
    assert not allowed(current, target)
    with pytest.raises(ResolveRefusedError) as caught:
        plan(state(current), parse_request(target, "r"), NOW)
    assert caught.value.code == "forbidden_move"
    new, moved = plan(state(current), parse_request(target, "r", True), NOW)
    assert new.status is target
    assert moved.name == f"order.{target.lower()}"


def test_a_move_to_where_the_order_is_is_refused_even_forced() -> None:
    with pytest.raises(ResolveRefusedError) as caught:
        plan(state(S.PAID), parse_request("PAID", "r", True), NOW)
    assert caught.value.code == "no_change"


def test_into_refunded_the_whole_amount_is_refunded_and_out_of_it_none() -> None:
    refunded, _ = plan(state(S.PAID), parse_request("REFUNDED", "r"), NOW)
    assert (refunded.refunded_amount, refunded.refunded_at) == (Decimal("100.00"), NOW)
    back, _ = plan(refunded, parse_request("PAID", "r", True), NOW)
    assert (back.refunded_amount, back.refunded_at) == (Decimal(0), None)


@pytest.mark.parametrize(
    "event_type",
    [
        "payment.status_changed",
        "refund.completed",
        "refund.reversed",
        "refund.a.b",
        "withdrawal.status_changed",
        "refund",
        "payment.status_changedx",
    ],
)
def test_the_in_flight_query_takes_the_events_the_orders_queue_consumes(event_type: str) -> None:
    # ORDERS_EVENTS_SQL as Python: `=` and PostgreSQL's `~` (an unanchored search).
    equals = re.findall(r"event_type = '([^']+)'", ORDERS_EVENTS_SQL)
    patterns = re.findall(r"event_type ~ '([^']+)'", ORDERS_EVENTS_SQL)
    in_sql = event_type in equals or any(re.search(p, event_type) for p in patterns)
    consumed = any(_topic_matches(p, event_type) for p in BINDINGS["orders"])
    assert in_sql == consumed


def test_the_missing_window_defaults_to_the_last_35_days_and_refuses_what_is_no_window() -> None:
    window = Window.parse(None, None, now=NOW)
    assert (window.since, window.until) == (NOW - DEFAULT_WINDOW, NOW)
    given = Window.parse("2026-01-01T00:00:00", "2026-01-02T00:00:00+01:00", "5")
    assert given.since == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert given.until == dt.datetime(2026, 1, 1, 23, tzinfo=dt.UTC)
    assert given.limit == 5
    for since, until, limit, name in [
        ("yesterday", None, None, "since"),
        (None, "2026-13-01", None, "until"),
        ("2026-02-01T00:00:00Z", "2026-01-01T00:00:00Z", None, "since"),
        (None, None, "0", "limit"),
        (None, None, "ten", "limit"),
        ("a\x00", None, None, "since"),
    ]:
        with pytest.raises(BadWindowError) as caught:
            Window.parse(since, until, limit, now=NOW)
        assert caught.value.name == name


def test_only_an_id_that_can_be_one_is_kept() -> None:
    assert keepable_id("evt_1") == "evt_1"
    assert keepable_id("x" * MAX_ID_CHARS) == "x" * MAX_ID_CHARS
    for bad in (None, "", "x" * (MAX_ID_CHARS + 1), "a\nb", "a\x00b"):
        assert keepable_id(bad) is None


def test_the_buffer_of_refusals_is_bounded_and_counts_copies_once_per_id() -> None:
    refusals = Refusals("xhub", max_buffered=2)
    refusals.note("a", 401, "invalid_signature")
    refusals.note("a", 401, "stale")
    refusals.note("a", 503, "unavailable")
    refusals.note("b", 503, "unavailable")
    refusals.note(None, 503, "unavailable")
    assert len(refusals) == 2
    assert refusals.dropped == 2  # "b" past the bound, and the id that was none
