"""The simulator's scenario plans and expectations (pure)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from services.sim import scenario
from services.sim.deliverer import DeliveryRecord, Result
from services.sim.summary import expect, expect_from_webhooks, mismatches, summarize
from shared.order_machine import OrderState, decide
from shared.providers.xhub import STATUS_CHANGED
from shared.providers.xhub.events import ProviderEvent
from shared.vocabulary import OrderStatus

CONFIG = scenario.ScenarioConfig(
    payments=200, duplicate_rate=0.3, reorder_rate=0.5, lost_rate=0.1, seed=7
)
S = OrderStatus


def _payment(flow: str, lost: tuple[int, ...] = ()) -> scenario.SimPayment:
    """A payment of `flow` whose webhooks at the positions `lost` are never sent."""
    config = scenario.ScenarioConfig(payments=1, flows={flow: 1}, lost_rate=0, seed=1)
    (p,) = scenario.generate(config).payments
    return replace(p, lost_ids=frozenset(p.events[i].event_id for i in lost))


def test_same_seed_same_plan() -> None:
    a, b = scenario.generate(CONFIG), scenario.generate(CONFIG)
    assert [p.payment_id for p in a.payments] == [p.payment_id for p in b.payments]
    assert [p.lost_ids for p in a.payments] == [p.lost_ids for p in b.payments]
    assert [(w.event_id, c) for w, c in a.sends] == [(w.event_id, c) for w, c in b.sends]


def test_the_default_mix_has_every_flow_refunds_after_settlement_and_payments_after_expiry() -> (
    None
):
    assert scenario.FLOWS["settled_refunded"] == ("paid", "settled", "refunded")
    assert scenario.FLOWS["expired_paid"] == ("expired", "paid")
    assert set(scenario.ScenarioConfig().flows) == set(scenario.FLOWS)
    plan = scenario.generate(scenario.ScenarioConfig(payments=300, lost_rate=0.03, seed=2))
    assert {p.flow for p in plan.payments} == set(scenario.FLOWS)


def test_sends_keep_each_payments_order_unless_reordered_and_skip_lost_webhooks() -> None:
    plan = scenario.generate(CONFIG)
    assert {p.flow for p in plan.payments} == set(scenario.FLOWS)
    originals = [w for w, copy in plan.sends if copy == 0]
    for p in plan.payments:
        sent = [w.event_id for w in originals if w.payment_id == p.payment_id]
        expected = [w.event_id for w in p.events if w.event_id not in p.lost_ids]
        assert sent == (expected[::-1] if p.reordered else expected)
    position = {w.event_id: i for i, (w, c) in enumerate(plan.sends) if c == 0}
    duplicates = [(i, w) for i, (w, c) in enumerate(plan.sends) if c == 1]
    assert duplicates
    assert all(i > position[w.event_id] for i, w in duplicates)
    assert {w.event_id for w, _ in plan.sends}.isdisjoint(
        {i for p in plan.payments for i in p.lost_ids}
    )
    assert any(p.reordered for p in plan.payments)


def test_lost_rate_is_the_share_of_webhooks_lost_whatever_their_place_in_the_flow() -> None:
    plan = scenario.generate(CONFIG)
    webhooks = sum(len(p.events) for p in plan.payments)
    lost = [p for p in plan.payments if p.lost]
    assert sum(len(p.lost_ids) for p in lost) == round(CONFIG.lost_rate * webhooks)
    assert len(scenario.lost_records(plan)) == round(CONFIG.lost_rate * webhooks)
    assert all(r.result is Result.LOST and r.attempts == 0 for r in scenario.lost_records(plan))
    # Single webhooks are lost, not only whole payments: the last of a longer flow, one that
    # a later webhook covers, and every webhook of a payment.
    longer = [p for p in lost if len(p.events) > 1]
    assert any(p.events[-1].event_id in p.lost_ids and p.sent_events for p in longer)
    assert any(p.events[-1].event_id not in p.lost_ids for p in longer)
    assert any(not p.sent_events for p in lost)


def test_a_payment_needs_repair_exactly_when_its_last_webhook_is_lost() -> None:
    """The provider's API tells only the current status, the flow's last: losing the last
    webhook leaves the order behind (the reconciler's work); losing an earlier one is covered
    by the later webhooks, and nothing is left to repair."""
    plan = scenario.generate(scenario.ScenarioConfig(payments=600, lost_rate=0.3, seed=11))
    for p in plan.payments:
        assert expect(p).needs_repair == (p.events[-1].event_id in p.lost_ids), p
        if not expect(p).needs_repair:
            assert expect_from_webhooks(p) == expect(p)
    repairs = {(expect_from_webhooks(p).status, expect(p).status) for p in plan.payments}
    assert (S.SETTLED, S.REFUNDED) in repairs  # a refund after settlement, its webhook lost
    assert (S.CANCELLED, S.PAID) in repairs  # a payment after expiry, its webhook lost


@pytest.mark.parametrize(
    ("flow", "lost", "before", "after", "optional"),
    [
        ("settled_refunded", (2,), S.SETTLED, S.REFUNDED, ("payment_succeeded",)),
        ("settled_refunded", (1,), S.REFUNDED, S.REFUNDED, ("payment_succeeded",)),
        ("settled_refunded", (0, 1), S.REFUNDED, S.REFUNDED, ()),
        ("settled_refunded", (0, 1, 2), S.PENDING, S.REFUNDED, ()),
        ("expired_paid", (1,), S.CANCELLED, S.PAID, ()),
        ("expired_paid", (0,), S.PAID, S.PAID, ()),
        ("settled", (1,), S.PAID, S.SETTLED, ()),
        ("refunded", (1,), S.PAID, S.REFUNDED, ("payment_succeeded",)),
        ("paid", (0,), S.PENDING, S.PAID, ()),
        ("expired", (0,), S.PENDING, S.CANCELLED, ()),
    ],
)
def test_expectations_of_a_lost_webhook(
    flow: str,
    lost: tuple[int, ...],
    before: OrderStatus,
    after: OrderStatus,
    optional: tuple[str, ...],
) -> None:
    p = _payment(flow, lost)
    webhooks, final = expect_from_webhooks(p), expect(p)
    assert (webhooks.status, final.status) == (before, after)
    assert final.needs_repair == (before is not after)
    assert final.lost == len(lost)
    assert final.optional_emails == optional
    assert webhooks.bonus == (500 if before in (S.PAID, S.SETTLED) else 0)
    assert final.bonus == (500 if after in (S.PAID, S.SETTLED) else 0)


def _replay(statuses: tuple[str, ...], amount: Decimal) -> OrderStatus:
    """The order machine's state after status_changed events with these statuses."""
    state = OrderState(S.PENDING, amount, "USD")
    at = datetime(2026, 12, 1, tzinfo=UTC)
    for status in statuses:
        event = ProviderEvent(
            event_type=STATUS_CHANGED,
            status=status,
            payment_id="p",
            amount=amount,
            currency="USD",
            occurred_at=at,
        )
        decision = decide(state, event)
        state = decision.new_state or state
    return state.status


@pytest.mark.parametrize("flow", sorted(scenario.FLOWS))
def test_every_loss_ends_where_the_providers_status_takes_the_order(flow: str) -> None:
    """Whatever webhooks of a flow are lost, in whatever order the rest arrive, the provider's
    current status (what the reconciler asks for) then takes the order to the expected state:
    every loss the simulator makes is harmless or repairable."""
    n = len(scenario.FLOWS[flow])
    for k in range(n + 1):
        for lost in itertools.combinations(range(n), k):
            p = _payment(flow, lost)
            for arrival in itertools.permutations(p.sent_statuses):
                assert _replay(arrival, p.amount) is expect_from_webhooks(p).status
                assert _replay((*arrival, p.final_status), p.amount) is expect(p).status


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
    late = by_flow[("settled_refunded", False)]
    assert (late.status, late.bonus, late.emails) == (S.REFUNDED, 0, ("payment_refunded",))
    after_all = by_flow[("expired_paid", False)]
    assert (after_all.status, after_all.bonus, after_all.emails) == (
        S.PAID,
        500,
        ("payment_succeeded",),
    )

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
    late_email = {**got, "emails": ["payment_refunded", "payment_succeeded"]}
    assert (
        "after the refund email"
        in mismatches([refunded], {refunded.payment_id: late_email})[refunded.payment_id]
    )
    early = {**got, "transitions": ["REFUNDED"], "ledger": []}
    assert (
        "without a grant"
        in mismatches([refunded], {refunded.payment_id: early})[refunded.payment_id]
    )
    # A refund after settlement whose webhook was lost, caught before the reconciler repaired
    # it: still SETTLED with its bonus and no refund email.
    behind = _payment("settled_refunded", (2,))
    stuck = {
        "status": "SETTLED",
        "transitions": ["PAID", "SETTLED"],
        "bonus": 500,
        "ledger": ["grant"],
        "emails": ["payment_succeeded"],
    }
    problem = mismatches([expect(behind)], {behind.payment_id: stuck})[behind.payment_id]
    assert "status SETTLED != REFUNDED" in problem
    assert "bonus 500 != 0" in problem
    assert mismatches([expect_from_webhooks(behind)], {behind.payment_id: stuck}) == {}


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
    assert counts["needs_repair"] == 0
    assert counts["DELIVERED"] == counts["deliveries"] == counts["attempts"] == len(plan.sends)


def test_summary_counts_the_payments_only_the_reconciler_can_repair() -> None:
    plan = scenario.generate(CONFIG)
    summary = summarize(scenario.lost_records(plan), plan.payments)
    behind = [p for p in plan.payments if p.events[-1].event_id in p.lost_ids]
    assert behind
    assert summary.counts()["needs_repair"] == len(behind)
    assert summary.counts()["LOST"] == sum(len(p.lost_ids) for p in plan.payments)
    rows = [row.split() for row in summary.render().splitlines()]
    row = next(row for row in rows if row and row[0] == behind[0].payment_id)
    assert "repair" in row[1]
