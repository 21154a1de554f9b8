"""The simulator's scenario plans and expectations (pure)."""

from __future__ import annotations

from services.sim import scenario
from services.sim.deliverer import DeliveryRecord, Result
from services.sim.summary import expect, mismatches, summarize
from shared.vocabulary import OrderStatus

CONFIG = scenario.ScenarioConfig(
    payments=200, duplicate_rate=0.3, reorder_rate=0.5, lost_rate=0.1, seed=7
)


def test_same_seed_same_plan() -> None:
    a, b = scenario.generate(CONFIG), scenario.generate(CONFIG)
    assert [p.payment_id for p in a.payments] == [p.payment_id for p in b.payments]
    assert [(w.event_id, c) for w, c in a.sends] == [(w.event_id, c) for w, c in b.sends]


def test_sends_keep_each_payments_order_unless_reordered_and_skip_lost_ones() -> None:
    plan = scenario.generate(CONFIG)
    assert {p.flow for p in plan.payments} == set(scenario.FLOWS)
    originals = [w for w, copy in plan.sends if copy == 0]
    for p in plan.payments:
        sent = [w.event_id for w in originals if w.payment_id == p.payment_id]
        expected = [w.event_id for w in p.events]
        if p.lost:
            assert sent == []
        else:
            assert sent == (expected[::-1] if p.reordered else expected)
    position = {w.event_id: i for i, (w, c) in enumerate(plan.sends) if c == 0}
    duplicates = [(i, w) for i, (w, c) in enumerate(plan.sends) if c == 1]
    assert duplicates
    assert all(i > position[w.event_id] for i, w in duplicates)
    assert any(p.lost for p in plan.payments)
    assert any(p.reordered for p in plan.payments)


def test_expectations() -> None:
    plan = scenario.generate(CONFIG)
    by_flow = {}  # type: ignore[var-annotated]
    for p in plan.payments:
        by_flow.setdefault((p.flow, p.lost), expect(p))
    paid, settled = by_flow[("paid", False)], by_flow[("settled", False)]
    refunded, expired = by_flow[("refunded", False)], by_flow[("expired", False)]
    assert (paid.status, paid.bonus, paid.emails) == (OrderStatus.PAID, 500, ("payment_succeeded",))
    assert (settled.status, settled.bonus) == (OrderStatus.SETTLED, 500)
    assert (refunded.status, refunded.bonus, refunded.emails) == (
        OrderStatus.REFUNDED,
        0,
        ("payment_refunded",),
    )
    assert refunded.optional_emails == ("payment_succeeded",)
    assert (expired.status, expired.bonus, expired.emails) == (OrderStatus.CANCELLED, 0, ())
    lost_refund = [expect(p) for p in plan.payments if p.lost and p.flow == "refunded"]
    assert all(e.optional_emails == () for e in lost_refund)

    got = {
        "status": "REFUNDED",
        "transitions": ["PAID", "REFUNDED"],
        "bonus": 0,
        "ledger": ["grant", "clawback"],
        "emails": ["payment_succeeded", "payment_refunded"],
    }
    assert mismatches([refunded], {refunded.payment_id: got}) == {}
    assert mismatches([paid], {paid.payment_id: {**got, "status": "PAID"}}) != {}
    assert mismatches([paid], {}) == {paid.payment_id: "no order"}
    # One story (SPEC 5): the success email never follows the refund email, and has a grant.
    late = {**got, "emails": ["payment_refunded", "payment_succeeded"]}
    assert (
        "after the refund email"
        in mismatches([refunded], {refunded.payment_id: late})[refunded.payment_id]
    )
    early = {**got, "transitions": ["REFUNDED"], "ledger": []}
    assert (
        "without a grant"
        in mismatches([refunded], {refunded.payment_id: early})[refunded.payment_id]
    )


def test_summary_counts() -> None:
    plan = scenario.generate(scenario.ScenarioConfig(payments=3, lost_rate=0.0, seed=1))
    records = [
        DeliveryRecord(
            event_id=w.event_id,
            payment_id=w.payment_id,
            merchant_id=w.merchant_id,
            event_type=w.event_type,
            status=w.status,
            copy=c,
            result=Result.DELIVERED,
            attempts=1,
        )
        for w, c in plan.sends
    ]
    counts = summarize(records, plan.payments).counts()
    assert counts["payments"] == 3
    assert counts["DELIVERED"] == counts["deliveries"] == counts["attempts"] == len(plan.sends)
