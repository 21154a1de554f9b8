"""Order state machine: every status x every event kind, parsing, and order-independence."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.sim.summary import expected_final_status
from shared.errors import PermanentError
from shared.messages import InvalidMessageError, checked_at_of, reconciler_headers
from shared.order_machine import (
    STATUS_TARGETS,
    TRANSITIONS,
    UNDECIDED,
    Decision,
    DomainEvent,
    OrderState,
    Reason,
    agrees,
    decide,
)
from shared.providers.xhub.events import InvalidEventError, ProviderEvent, parse_event
from shared.vocabulary import OrderStatus

PEN = OrderStatus.PENDING
PAI = OrderStatus.PAID
SET = OrderStatus.SETTLED
REF = OrderStatus.REFUNDED
CAN = OrderStatus.CANCELLED
MIS = OrderStatus.AMOUNT_MISMATCH

REFUNDED_AT = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
BEFORE = REFUNDED_AT - timedelta(minutes=5)
AFTER = REFUNDED_AT + timedelta(minutes=5)
AMOUNT = Decimal("100.00")


def order(status: OrderStatus) -> OrderState:
    """An order of 100.00 USD; every one has a counted partial refund r-0 of 10.00, and the
    REFUNDED one was completed by r-1 (90.00) at REFUNDED_AT."""
    if status is REF:
        return OrderState(REF, AMOUNT, "USD", AMOUNT, REFUNDED_AT, frozenset({"r-0", "r-1"}))
    return OrderState(status, AMOUNT, "USD", Decimal("10.00"), None, frozenset({"r-0"}))


def status_event(status: str, amount: str = "100.00", currency: str = "USD") -> ProviderEvent:
    return ProviderEvent(
        event_type="payment.status_changed",
        status=status,
        payment_id="pay-1",
        amount=Decimal(amount),
        currency=currency,
        occurred_at=AFTER,
    )


def refund_event(
    kind: str, refund_id: str, amount: str, at: datetime | None = AFTER, currency: str = "USD"
) -> ProviderEvent:
    return ProviderEvent(
        event_type=f"refund.{kind}",
        payment_id="pay-1",
        amount=Decimal(amount),
        currency=currency,
        occurred_at=at,
        refund_id=refund_id,
    )


EVENTS: dict[str, ProviderEvent] = {
    "paid": status_event("paid"),
    "paid_wrong_amount": status_event("paid", amount="99.99"),
    "paid_wrong_currency": status_event("paid", currency="EUR"),
    "settled": status_event("settled"),
    "settled_wrong_amount": status_event("settled", amount="100.01"),
    "refunded": status_event("refunded"),
    "expired": status_event("expired"),
    "cancelled": status_event("cancelled"),
    "failed": status_event("failed"),
    "amount_mismatch": status_event("amount_mismatch"),
    "pending": status_event("pending"),
    "refund_full": refund_event("completed", "r-new", "100.00"),
    "refund_partial": refund_event("completed", "r-new", "20.00"),
    "refund_duplicate": refund_event("completed", "r-0", "10.00"),
    "reversed_after": refund_event("reversed", "r-1", "90.00", at=AFTER),
    "reversed_before": refund_event("reversed", "r-1", "90.00", at=BEFORE),
    "refund_rejected": refund_event("rejected", "r-new", "20.00"),
    "refund_failed": refund_event("failed", "r-new", "20.00"),
    "unknown_type": ProviderEvent(
        event_type="subscription.status_changed", status="active", payment_id="pay-1"
    ),
}

# Written out by hand from SPEC section 5 (and the module's decisions), never from TRANSITIONS.
COLUMNS = (PEN, PAI, SET, REF, CAN, MIS)
EXPECTED: dict[str, tuple[OrderStatus, ...]] = {
    #                       PENDING PAID SETTLED REFUNDED CANCELLED MISMATCH
    "paid":                 (PAI,   PAI, SET,    REF,     PAI,      PAI),
    "paid_wrong_amount":    (MIS,   PAI, SET,    REF,     MIS,      MIS),
    "paid_wrong_currency":  (MIS,   PAI, SET,    REF,     MIS,      MIS),
    "settled":              (SET,   SET, SET,    REF,     SET,      SET),
    "settled_wrong_amount": (MIS,   PAI, SET,    REF,     MIS,      MIS),
    "refunded":             (REF,   REF, REF,    REF,     REF,      REF),
    "expired":              (CAN,   PAI, SET,    REF,     CAN,      MIS),
    "cancelled":            (CAN,   PAI, SET,    REF,     CAN,      MIS),
    "failed":               (CAN,   PAI, SET,    REF,     CAN,      MIS),
    "amount_mismatch":      (MIS,   PAI, SET,    REF,     CAN,      MIS),
    "pending":              (PEN,   PAI, SET,    REF,     CAN,      MIS),
    "refund_full":          (REF,   REF, REF,    REF,     REF,      REF),
    "refund_partial":       (PEN,   PAI, SET,    REF,     CAN,      MIS),
    "refund_duplicate":     (PEN,   PAI, SET,    REF,     CAN,      MIS),
    "reversed_after":       (PEN,   PAI, SET,    PAI,     CAN,      MIS),
    "reversed_before":      (PEN,   PAI, SET,    REF,     CAN,      MIS),
    "refund_rejected":      (PEN,   PAI, SET,    REF,     CAN,      MIS),
    "refund_failed":        (PEN,   PAI, SET,    REF,     CAN,      MIS),
    "unknown_type":         (PEN,   PAI, SET,    REF,     CAN,      MIS),
}  # fmt: skip

CASES = [
    pytest.param(start, kind, expected[i], id=f"{start.lower()}-{kind}")
    for kind, expected in EXPECTED.items()
    for i, start in enumerate(COLUMNS)
]


def status_after(state: OrderState, decision: Decision) -> OrderStatus:
    return decision.new_state.status if decision.new_state is not None else state.status


def test_table_covers_every_status_and_event_kind() -> None:
    assert sorted(COLUMNS) == sorted(OrderStatus)
    assert EXPECTED.keys() == EVENTS.keys()
    assert all(len(row) == len(COLUMNS) for row in EXPECTED.values())


@pytest.mark.parametrize(("start", "kind", "expected"), CASES)
def test_event_moves_order_to_expected_status(
    start: OrderStatus, kind: str, expected: OrderStatus
) -> None:
    state = order(start)
    decision = decide(state, EVENTS[kind])

    assert status_after(state, decision) is expected
    if expected is start:
        assert decision.events == ()
    else:
        name = f"order.{expected.value.lower()}"
        assert decision.events == (DomainEvent(name, start, expected),)


@pytest.mark.parametrize(("start", "kind", "expected"), CASES)
def test_same_event_twice_changes_nothing_the_second_time(
    start: OrderStatus, kind: str, expected: OrderStatus
) -> None:
    first = decide(order(start), EVENTS[kind])
    again = decide(first.new_state or order(start), EVENTS[kind])

    assert again.new_state is None
    assert again.events == ()


def test_transitions_are_the_spec_forward_moves() -> None:
    spec = {
        PEN: {PAI, SET, REF, CAN, MIS},
        CAN: {PAI, SET, REF, MIS},
        MIS: {PAI, SET, REF},
        PAI: {SET, REF},
        SET: {REF},
        REF: set(),
    }
    assert spec == TRANSITIONS


@pytest.mark.parametrize(
    ("start", "kind", "reason"),
    [
        (PEN, "paid", Reason.TRANSITIONED),
        (PEN, "paid_wrong_amount", Reason.AMOUNT_MISMATCH),
        (CAN, "settled_wrong_amount", Reason.AMOUNT_MISMATCH),
        (PAI, "settled_wrong_amount", Reason.AMOUNT_MISMATCH_IGNORED),
        (MIS, "paid_wrong_currency", Reason.NO_STATE_CHANGE),
        (SET, "paid", Reason.IGNORED_BACKWARDS),
        (PAI, "expired", Reason.IGNORED_BACKWARDS),
        (CAN, "amount_mismatch", Reason.IGNORED_BACKWARDS),
        (PAI, "paid", Reason.NO_STATE_CHANGE),
        (PEN, "pending", Reason.IGNORED_STATUS),
        (PAI, "refund_partial", Reason.PARTIAL_REFUND),
        (PAI, "refund_full", Reason.TRANSITIONED),
        (REF, "refund_full", Reason.REFUND_RECORDED),
        (PAI, "refund_duplicate", Reason.REFUND_ALREADY_COUNTED),
        (REF, "reversed_after", Reason.REFUND_REVERSED),
        (REF, "reversed_before", Reason.REVERSAL_BEFORE_REFUND),
        (PAI, "reversed_after", Reason.REFUND_NOT_COUNTED),
        (PAI, "refund_rejected", Reason.REFUND_REJECTED),
        (REF, "refund_failed", Reason.REFUND_FAILED),
        (PAI, "unknown_type", Reason.IGNORED_EVENT),
    ],
)
def test_decision_says_why(start: OrderStatus, kind: str, reason: Reason) -> None:
    assert decide(order(start), EVENTS[kind]).reason == reason


def fresh(status: OrderStatus = PAI) -> OrderState:
    return OrderState(status, AMOUNT, "USD")


def test_refunded_status_is_a_full_refund_at_the_provider_time() -> None:
    new = decide(fresh(SET), status_event("refunded")).new_state

    assert new == OrderState(REF, AMOUNT, "USD", AMOUNT, AFTER, frozenset())


def test_partial_refunds_accumulate_until_the_full_amount_refunds_the_order() -> None:
    first = decide(fresh(), refund_event("completed", "a", "60.00", at=BEFORE))
    assert first.new_state == OrderState(
        PAI, AMOUNT, "USD", Decimal("60.00"), None, frozenset({"a"})
    )
    assert first.events == ()
    assert first.new_state is not None

    second = decide(first.new_state, refund_event("completed", "b", "40.00", at=AFTER))

    assert second.new_state == OrderState(REF, AMOUNT, "USD", AMOUNT, AFTER, frozenset({"a", "b"}))
    assert second.events == (DomainEvent("order.refunded", PAI, REF),)


def test_refund_in_another_currency_keeps_the_order() -> None:
    decision = decide(fresh(), refund_event("completed", "a", "100.00", currency="EUR"))

    assert decision == Decision(None, (), Reason.CURRENCY_MISMATCH)


def test_refund_after_refunded_status_is_recorded_without_double_counting() -> None:
    refunded = decide(fresh(), status_event("refunded")).new_state
    assert refunded is not None

    decision = decide(refunded, refund_event("completed", "a", "100.00"))

    assert decision.new_state == replace(refunded, refund_ids=frozenset({"a"}))
    assert decision.events == ()


def test_reversal_after_refund_returns_the_order_to_paid() -> None:
    refunded = OrderState(REF, AMOUNT, "USD", AMOUNT, REFUNDED_AT, frozenset({"a", "b"}))

    decision = decide(refunded, refund_event("reversed", "b", "70.00", at=AFTER))

    assert decision.new_state == OrderState(
        PAI, AMOUNT, "USD", Decimal("30.00"), None, frozenset({"a"}), frozenset({"b"})
    )
    assert decision.events == (DomainEvent("order.paid", REF, PAI),)


@pytest.mark.parametrize(
    ("refunded_at", "reversed_at"),
    [(REFUNDED_AT, REFUNDED_AT), (REFUNDED_AT, BEFORE), (REFUNDED_AT, None), (None, AFTER)],
)
def test_reversal_not_provably_after_refund_keeps_refunded(
    refunded_at: datetime | None, reversed_at: datetime | None
) -> None:
    refunded = OrderState(REF, AMOUNT, "USD", AMOUNT, refunded_at, frozenset({"a"}))

    decision = decide(refunded, refund_event("reversed", "a", "100.00", at=reversed_at))

    assert decision == Decision(None, (), Reason.REVERSAL_BEFORE_REFUND)


def test_reversed_partial_refund_is_uncounted_without_status_change() -> None:
    state = OrderState(SET, AMOUNT, "USD", Decimal("10.00"), None, frozenset({"a"}))

    decision = decide(state, refund_event("reversed", "a", "25.00"))

    assert decision == Decision(
        OrderState(SET, AMOUNT, "USD", Decimal(0), None, frozenset(), frozenset({"a"})),
        (),
        Reason.PARTIAL_REFUND_REVERSED,
    )


def test_reversal_that_overtook_its_refund_is_remembered_and_the_refund_not_counted() -> None:
    """D7: delivered reversal first, refund second, the provider's truth is still "reversed":
    the order stays PAID (no clawback, no refund email)."""
    paid = fresh(PAI)

    first = decide(paid, refund_event("reversed", "r1", "100.00", at=AFTER))
    assert first == Decision(
        replace(paid, reversed_refund_ids=frozenset({"r1"})), (), Reason.REFUND_NOT_COUNTED
    )
    assert first.new_state is not None
    second = decide(first.new_state, refund_event("completed", "r1", "100.00", at=REFUNDED_AT))

    assert second == Decision(None, (), Reason.REFUND_ALREADY_REVERSED)


def test_refund_completed_after_its_reversal_on_a_refunded_then_reversed_order() -> None:
    """paid, status refunded (t1), reversal of r1 (t2): PAID again; the late refund.completed
    of r1 (t1) must not make it REFUNDED a second time."""
    state = fresh(PAI)
    for event in (
        replace(status_event("refunded"), occurred_at=REFUNDED_AT),
        refund_event("reversed", "r1", "100.00", at=AFTER),
        refund_event("completed", "r1", "100.00", at=REFUNDED_AT),
    ):
        state = decide(state, event).new_state or state

    assert state.status is PAI
    assert state.refunded_amount == 0
    assert state.reversed_refund_ids == frozenset({"r1"})


def test_a_repeated_reversal_changes_nothing() -> None:
    state = replace(fresh(PAI), reversed_refund_ids=frozenset({"r1"}))

    decision = decide(state, refund_event("reversed", "r1", "100.00", at=AFTER))

    assert decision == Decision(None, (), Reason.REFUND_NOT_COUNTED)


def test_reversal_in_another_currency_keeps_refunded() -> None:
    refunded = OrderState(REF, AMOUNT, "USD", AMOUNT, REFUNDED_AT, frozenset({"a"}))

    decision = decide(refunded, refund_event("reversed", "a", "100.00", currency="EUR"))

    assert decision.reason == Reason.CURRENCY_MISMATCH
    assert decision.new_state is None


def test_amounts_compare_as_numbers_and_currencies_ignore_case() -> None:
    decision = decide(OrderState(PEN, Decimal("100"), "usd"), status_event("paid", "100.00"))

    assert decision.reason == Reason.TRANSITIONED
    assert status_after(fresh(PEN), decision) is PAI


# -- parse_event ---------------------------------------------------------------------------

PAYMENT: dict[str, Any] = {
    "event": "payment.status_changed",
    "payment_id": "pay-1",
    "external_id": "order-1",
    "status": "paid",
    "amount": "100.00",
    "currency": "USD",
    "created_at": "2025-03-01T12:00:00Z",
}
REFUND: dict[str, Any] = {
    "event": "refund.completed",
    "refund_id": "r-1",
    "payment_id": "pay-1",
    "amount": "25.50",
    "currency": "USD",
    "created_at": "2025-03-01T15:00:00+03:00",
}


def test_parse_payment_event() -> None:
    assert parse_event(PAYMENT) == ProviderEvent(
        event_type="payment.status_changed",
        status="paid",
        payment_id="pay-1",
        amount=Decimal("100.00"),
        currency="USD",
        occurred_at=REFUNDED_AT,
    )


def test_parse_refund_event_keeps_the_offset() -> None:
    event = parse_event(REFUND)

    assert event.refund_id == "r-1"
    assert event.amount == Decimal("25.50")
    assert event.occurred_at == datetime(2025, 3, 1, 15, 0, tzinfo=timezone(timedelta(hours=3)))
    assert event.occurred_at == REFUNDED_AT


@pytest.mark.parametrize(
    ("changes", "field", "value"),
    [
        ({"status": "PAID"}, "status", "paid"),
        ({"created_at": "2025-03-01T12:00:00"}, "occurred_at", REFUNDED_AT),
        ({"created_at": None}, "occurred_at", None),
        ({"status": "expired", "amount": None, "currency": None}, "amount", None),
        ({"event": "refund.failed", "refund_id": "r-9", "amount": None}, "refund_id", "r-9"),
        ({"event": "kyc.status_changed", "status": "approved"}, "event_type", "kyc.status_changed"),
    ],
)
def test_parse_event_optional_and_normalised_fields(
    changes: dict[str, Any], field: str, value: object
) -> None:
    payload = {k: v for k, v in (PAYMENT | changes).items() if v is not None}

    assert getattr(parse_event(payload), field) == value


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"event": None}, id="no-event"),
        pytest.param({"event": 7}, id="event-not-string"),
        pytest.param({"payment_id": None}, id="no-payment-id"),
        pytest.param({"payment_id": ""}, id="empty-payment-id"),
        pytest.param({"payment_id": 12345}, id="payment-id-not-string"),
        pytest.param({"amount": 100.0}, id="amount-float"),
        pytest.param({"amount": "abc"}, id="amount-not-decimal"),
        pytest.param({"amount": "NaN"}, id="amount-nan"),
        pytest.param({"amount": "-1.00"}, id="amount-negative"),
        pytest.param({"amount": "1e2"}, id="amount-exponent"),
        pytest.param({"amount": " 100.00"}, id="amount-whitespace"),
        pytest.param({"amount": None}, id="paid-without-amount"),
        pytest.param({"currency": None}, id="paid-without-currency"),
        pytest.param({"currency": 840}, id="currency-not-string"),
        pytest.param({"status": None}, id="status-changed-without-status"),
        pytest.param({"status": ["paid"]}, id="status-not-string"),
        pytest.param({"created_at": "yesterday"}, id="created-at-not-iso"),
        pytest.param({"created_at": 1740830400}, id="created-at-number"),
        pytest.param({"event": "refund.completed"}, id="refund-without-refund-id"),
        pytest.param({"event": "refund.failed"}, id="refund-failed-without-refund-id"),
        pytest.param(
            {"event": "refund.reversed", "refund_id": "r-1", "amount": None},
            id="reversal-without-amount",
        ),
    ],
)
def test_parse_event_rejects_bodies_that_can_never_be_valid(changes: dict[str, Any]) -> None:
    payload = {k: v for k, v in (PAYMENT | changes).items() if v is not None}

    with pytest.raises(InvalidEventError):
        parse_event(payload)


def test_invalid_event_is_permanent() -> None:
    assert issubclass(InvalidEventError, PermanentError)


# -- properties ----------------------------------------------------------------------------

RANK = {PEN: 0, CAN: 1, MIS: 1, PAI: 2, SET: 3, REF: 4}
PROPERTY_STATUSES = ("paid", "settled", "refunded", "expired")


def final_status_by_rule(statuses: Iterable[str]) -> OrderStatus:
    seen = set(statuses)
    if "refunded" in seen:
        return REF
    if "settled" in seen:
        return SET
    if "paid" in seen:
        return PAI
    return CAN if "expired" in seen else PEN


def apply_all(statuses: Iterable[str]) -> OrderStatus:
    state = fresh(PEN)
    for status in statuses:
        decision = decide(state, status_event(status))
        if decision.new_state is not None:
            assert RANK[decision.new_state.status] >= RANK[state.status]
            state = decision.new_state
    return state.status


@st.composite
def shuffled_with_duplicates(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    statuses = draw(st.lists(st.sampled_from(PROPERTY_STATUSES), max_size=12))
    return statuses, draw(st.permutations(statuses))


@given(shuffled_with_duplicates())
def test_final_status_depends_only_on_the_set_of_events(
    sequences: tuple[list[str], list[str]],
) -> None:
    statuses, shuffled = sequences

    final = apply_all(statuses)

    assert final is final_status_by_rule(statuses)
    assert apply_all(shuffled) is final
    assert expected_final_status(statuses) is final


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ((), PEN),
        (("pending", "failed"), CAN),
        (("amount_mismatch", "amount_mismatch"), MIS),
        (("cancelled", "paid"), PAI),
        (("amount_mismatch", "settled", "expired"), SET),
    ],
)
def test_expected_final_status(statuses: tuple[str, ...], expected: OrderStatus) -> None:
    assert expected_final_status(statuses) is expected
    assert apply_all(statuses) is expected


def test_expected_final_status_refuses_an_order_dependent_set() -> None:
    with pytest.raises(ValueError, match="order"):
        expected_final_status(["expired", "amount_mismatch"])


refund_steps = st.tuples(
    st.sampled_from(("completed", "reversed")),
    st.sampled_from(("a", "b", "c")),
    st.decimals(min_value=0, max_value=150, places=2),
    st.sampled_from((BEFORE, AFTER, None)),
)


@given(st.sampled_from(COLUMNS), st.lists(refund_steps, max_size=10))
def test_refunded_amount_stays_between_zero_and_the_order_amount(
    start: OrderStatus, steps: list[tuple[str, str, Decimal, datetime | None]]
) -> None:
    state = order(start)
    for kind, refund_id, amount, at in steps:
        decision = decide(state, refund_event(kind, refund_id, str(amount), at=at))
        state = decision.new_state or state
        assert Decimal(0) <= state.refunded_amount <= state.amount
        assert state.status is REF or state.refunded_at is None


# --- D11: what the model can't decide, the provider's answer decides ---------------------

CHANGED_AT = REFUNDED_AT + timedelta(minutes=1)  # when we made the order REFUNDED (our clock)


def answer(
    status: str, updated_at: datetime, checked_at: datetime | None, amount: str = "100.00"
) -> ProviderEvent:
    """The provider's GET /payments/:id as the reconciler feeds it back: seen at checked_at."""
    return replace(status_event(status, amount), occurred_at=updated_at, checked_at=checked_at)


def refunded_order() -> OrderState:
    return replace(order(REF), changed_at=CHANGED_AT)


@pytest.mark.parametrize("status", ["paid", "settled"])
def test_the_provider_saying_paid_after_the_refund_takes_a_refunded_order_back(
    status: str,
) -> None:
    decision = decide(refunded_order(), answer(status, AFTER, checked_at=AFTER))
    assert decision.reason is Reason.REVERSED_AT_PROVIDER
    assert decision.new_state is not None
    assert decision.new_state.status is STATUS_TARGETS[status]
    assert (decision.new_state.refunded_amount, decision.new_state.refunded_at) == (0, None)
    assert decision.new_state.refund_ids == order(REF).refund_ids  # a late refund.completed
    assert [e.name for e in decision.events] == [f"order.{status}"]  # of them counts nothing


@pytest.mark.parametrize(
    ("updated_at", "checked_at", "why"),
    [
        (BEFORE, AFTER, "the provider's payment last changed before the refund"),
        (AFTER, REFUNDED_AT, "the order changed after the provider was asked"),
        (None, AFTER, "the provider gave no time"),
    ],
)
def test_an_answer_that_does_not_prove_the_reversal_leaves_a_refunded_order(
    updated_at: datetime | None, checked_at: datetime, why: str
) -> None:
    event = replace(answer("paid", AFTER, checked_at), occurred_at=updated_at)
    decision = decide(refunded_order(), event)
    assert decision.new_state is None, why
    assert not decision.events, why


def test_a_webhook_saying_paid_never_takes_a_refunded_order_back() -> None:
    decision = decide(refunded_order(), status_event("paid"))  # no checked_at: a webhook
    assert decision.reason is Reason.IGNORED_BACKWARDS


def test_a_wrong_amount_answer_never_takes_a_refunded_order_back() -> None:
    decision = decide(refunded_order(), answer("paid", AFTER, AFTER, amount="99.00"))
    assert decision.new_state is None


def test_undecided_events_are_the_ones_the_provider_is_asked_about() -> None:
    assert decide(order(REF), EVENTS["reversed_before"]).reason in UNDECIDED
    assert decide(order(PAI), EVENTS["settled_wrong_amount"]).reason in UNDECIDED
    assert decide(order(PAI), EVENTS["paid"]).reason not in UNDECIDED


@pytest.mark.parametrize(
    ("status", "said", "amount", "agreed"),
    [
        (REF, "refunded", "100.00", True),
        (REF, "paid", "100.00", False),
        (PAI, "paid", "100.00", True),
        (PAI, "paid", "99.00", False),
        (MIS, "paid", "99.00", True),
        (CAN, "expired", "100.00", True),
    ],
)
def test_agrees_when_the_provider_status_is_the_orders_own(
    status: OrderStatus, said: str, amount: str, agreed: bool
) -> None:
    assert agrees(order(status), answer(said, AFTER, AFTER, amount)) is agreed


def test_a_body_never_makes_an_event_the_reconcilers_answer() -> None:
    """W12: the reconciler's power is keyed on its message's headers; a webhook's body
    carrying `checked_at` (signed and forwarded as received) is an ordinary webhook."""
    body = {
        "event": "payment.status_changed",
        "payment_id": "p",
        "status": "paid",
        "amount": "1.00",
        "currency": "USD",
        "created_at": "2026-01-01T00:00:00Z",
        "checked_at": "2026-01-01T00:00:05+00:00",
        "source": "reconciliation",
    }
    assert parse_event(body).checked_at is None
    asked = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    assert parse_event(body, checked_at=asked).checked_at == asked


def test_only_the_reconcilers_headers_carry_a_checked_at() -> None:
    asked = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    assert checked_at_of(reconciler_headers(asked)) == asked
    assert checked_at_of({"provider": "xhub"}) is None
    assert checked_at_of({"checked_at": asked.isoformat()}) is None  # without the source
    with pytest.raises(InvalidMessageError):
        checked_at_of({"source": "reconciliation", "checked_at": "yesterday"})


# --- a refund after a reversal: the provider's "refunded" must be newer than our change ----

REVERSED_AT = CHANGED_AT + timedelta(hours=1)  # when we took the order back to PAID


def reversed_order() -> OrderState:
    return replace(order(PAI), reversed_refund_ids=frozenset({"r1"}), changed_at=REVERSED_AT)


def test_a_refund_after_the_reversal_refunds_the_order_again() -> None:
    later = REVERSED_AT + timedelta(minutes=5)
    decision = decide(reversed_order(), answer("refunded", later, checked_at=later))
    assert [e.name for e in decision.events] == ["order.refunded"]


def test_a_refunded_status_from_before_the_reversal_leaves_the_order_paid() -> None:
    """A provider whose status still shows the reversed refund is no new refund."""
    asked = REVERSED_AT + timedelta(minutes=10)
    decision = decide(reversed_order(), answer("refunded", REVERSED_AT, checked_at=asked))
    assert decision.reason is Reason.REFUNDED_BEFORE_REVERSAL
    assert decision.new_state is None


def test_a_webhook_refund_after_a_reversal_needs_no_time_proof() -> None:
    decision = decide(reversed_order(), status_event("refunded"))
    assert [e.name for e in decision.events] == ["order.refunded"]
