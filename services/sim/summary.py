"""The simulator's summary: what happened to each delivery, what payhooks should end with per
payment (status, bonus, emails; an email that depends on arrival order is optional), which
payments only the reconciler can bring there (their last webhook lost), and where a payment's
ledger and emails tell different stories."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from services.sim.deliverer import DeliveryRecord
from services.sim.scenario import SimPayment
from shared.bonus_rules import Transition, entries_for
from shared.db import Executor
from shared.queries import emails as emails_sql
from shared.queries import ledger as ledger_sql
from shared.queries import orders as orders_sql
from shared.vocabulary import REFUNDED_EMAIL, SUCCEEDED_EMAIL, OrderStatus

BONUS_POINTS: Final = 500
_EARNING: Final = frozenset({OrderStatus.PAID, OrderStatus.SETTLED})


@dataclass(frozen=True, slots=True, kw_only=True)
class Expectation:
    payment_id: str
    flow: str
    lost: int  # webhooks never sent
    needs_repair: bool  # the webhooks sent fall short of `status`: only the reconciler gets there
    reordered: bool
    status: OrderStatus
    bonus: int
    emails: tuple[str, ...]  # must be sent (once each)
    optional_emails: tuple[str, ...]  # may be sent, depending on arrival order
    provider: str = "xhub"  # who sent its webhooks (registry name)

    def as_json(self) -> dict[str, Any]:
        return {
            "payment_id": self.payment_id,
            "provider": self.provider,
            "flow": self.flow,
            "lost": self.lost,
            "needs_repair": self.needs_repair,
            "reordered": self.reordered,
            "status": self.status.value,
            "bonus": self.bonus,
            "emails": list(self.emails),
            "optional_emails": list(self.optional_emails),
        }


def expect(payment: SimPayment, bonus_points: int = BONUS_POINTS) -> Expectation:
    """The final status over all of the payment's statuses (the provider's API holds the last
    one: a lost or FAILED delivery is still reached by reconciliation); the bonus while
    PAID/SETTLED; payment_succeeded for PAID/SETTLED, payment_refunded for REFUNDED plus an
    optional payment_succeeded (it depends on arrival order; never when no `paid` or `settled`
    was sent: reconciliation jumps straight to REFUNDED).

    A payment whose provider has no payments API (Standard Webhooks) is repaired by nothing
    but its sender's redeliveries: a webhook the sender gave up on (lost) stays missing, so
    its end state is what the sent ones bring it to (PENDING when all were lost), exactly,
    neither more nor less (the reconciler must not invent what nobody said)."""
    statuses = payment.statuses if payment.repairable else payment.sent_statuses
    return _expectation(payment, statuses, bonus_points)


def expect_from_webhooks(payment: SimPayment, bonus_points: int = BONUS_POINTS) -> Expectation:
    """What the webhooks sent bring the payment to before any reconciliation (PENDING when
    every one was lost); as `expect` for a payment that needs no repair."""
    return _expectation(payment, payment.sent_statuses, bonus_points)


def _expectation(payment: SimPayment, statuses: Sequence[str], bonus_points: int) -> Expectation:
    status = expected_final_status(statuses)
    emails: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    if status in _EARNING:
        emails = (SUCCEEDED_EMAIL,)
    elif status is OrderStatus.REFUNDED:
        emails = (REFUNDED_EMAIL,)
        passes_paid = any(s in ("paid", "settled") for s in payment.sent_statuses)
        optional = (SUCCEEDED_EMAIL,) if passes_paid else ()
    return Expectation(
        payment_id=payment.payment_id,
        flow=payment.flow,
        lost=len(payment.lost_ids),
        needs_repair=status is not expected_final_status(payment.sent_statuses),
        reordered=payment.reordered,
        status=status,
        bonus=bonus_points if status in _EARNING else 0,
        emails=emails,
        optional_emails=optional,
        provider=payment.provider,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    deliveries: tuple[DeliveryRecord, ...]
    expectations: tuple[Expectation, ...]

    def counts(self) -> dict[str, int]:
        results = Counter(r.result.value if r.result else "PENDING" for r in self.deliveries)
        return {
            "payments": len(self.expectations),
            "needs_repair": sum(e.needs_repair for e in self.expectations),
            "deliveries": len(self.deliveries),
            "attempts": sum(r.attempts for r in self.deliveries),
            **dict(sorted(results.items())),
            **{
                f"payments_{k}": v
                for k, v in sorted(Counter(e.provider for e in self.expectations).items())
            },
            **{
                f"expected_{k}": v
                for k, v in sorted(Counter(e.status.value for e in self.expectations).items())
            },
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "counts": self.counts(),
            "deliveries": [r.as_json() for r in self.deliveries],
            "payments": [e.as_json() for e in self.expectations],
        }

    def render(self) -> str:
        lines = ["counts: " + ", ".join(f"{k}={v}" for k, v in self.counts().items()), ""]
        lines.append("deliveries (event id, copy, result, attempts, reason):")
        for r in self.deliveries:
            reason = r.reason.value if r.reason else ""
            result = r.result.value if r.result else "PENDING"
            lines.append(f"  {r.event_id} #{r.copy} {result} {r.attempts} {reason}".rstrip())
        lines.append("")
        lines.append(
            "payments (id, flow(lost=webhooks never sent, repair: only the reconciler gets it"
            " there), expected status, bonus, emails [optional], provider):"
        )
        for e in self.expectations:
            flags = ",".join(
                flag
                for flag, on in (
                    (f"lost={e.lost}", e.lost),
                    ("repair", e.needs_repair),
                    ("reordered", e.reordered),
                )
                if on
            )
            optional = f" [{','.join(e.optional_emails)}]" if e.optional_emails else ""
            lines.append(
                f"  {e.payment_id} {e.flow}{'(' + flags + ')' if flags else ''} {e.status.value}"
                f" {e.bonus} {','.join(e.emails) or '-'}{optional} {e.provider}"
            )
        return "\n".join(lines)


def summarize(
    deliveries: Iterable[DeliveryRecord],
    payments: Sequence[SimPayment],
    bonus_points: int = BONUS_POINTS,
) -> Summary:
    ordered = sorted(deliveries, key=lambda r: (r.payment_id, r.event_id, r.copy))
    return Summary(
        deliveries=tuple(ordered), expectations=tuple(expect(p, bonus_points) for p in payments)
    )


def story_problems(
    transitions: Sequence[str], ledger: Sequence[str], emails: Sequence[str]
) -> list[str]:
    """Where a payment's ledger and emails tell different stories (SPEC 5), given its order's
    transitions (to-statuses, oldest first), its ledger's kinds (oldest first) and the
    templates of the emails sent, in the order they were sent."""
    found = []
    history = [Transition(n, status, "") for n, status in enumerate(transitions)]
    called_for = [e.kind.value for e in entries_for(history)]
    if list(ledger) != called_for:
        found.append(
            f"ledger {list(ledger)} but the transitions {list(transitions)} call for {called_for}"
        )
    if SUCCEEDED_EMAIL in emails and "grant" not in ledger:
        found.append(f"success email without a grant (ledger {list(ledger)})")
    if (
        SUCCEEDED_EMAIL in emails
        and REFUNDED_EMAIL in emails
        and emails.index(SUCCEEDED_EMAIL) > emails.index(REFUNDED_EMAIL)
    ):
        found.append("success email after the refund email")
    return found


def mismatches(
    expectations: Iterable[Expectation], actual: Mapping[str, Mapping[str, Any]]
) -> dict[str, str]:
    """Compare with what payhooks did: `actual[payment_id]` holds `status` (str), `bonus` (int),
    `emails` (list of templates, one per email sent, oldest first) and, for the one-story rule,
    `transitions` and `ledger` (see `story_problems`; left out: not judged). Returns payment
    id -> what differs."""
    problems: dict[str, str] = {}
    for e in expectations:
        got = actual.get(e.payment_id)
        if got is None:
            problems[e.payment_id] = "no order"
            continue
        why = []
        if got.get("status") != e.status.value:
            why.append(f"status {got.get('status')} != {e.status.value}")
        if got.get("bonus") != e.bonus:
            why.append(f"bonus {got.get('bonus')} != {e.bonus}")
        emails = list(got.get("emails", ()))
        if len(emails) != len(set(emails)):
            why.append(f"duplicate emails {sorted(emails)}")
        sent = set(emails)
        if not set(e.emails) <= sent or not sent <= set(e.emails) | set(e.optional_emails):
            why.append(f"emails {sorted(sent)} vs {list(e.emails)} [{list(e.optional_emails)}]")
        if "transitions" in got and "ledger" in got:
            why.extend(story_problems(got["transitions"], got["ledger"], emails))
        if why:
            problems[e.payment_id] = "; ".join(why)
    return problems


async def actual_effects(db: Executor, payment_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """What payhooks recorded per payment: order status and transitions, bonus balance and
    ledger, emails sent."""
    statuses = await orders_sql.statuses(db, payment_ids)
    transitions = await orders_sql.transition_statuses(db, payment_ids)
    balances = await ledger_sql.balances(db, payment_ids)
    ledgers = await ledger_sql.kinds(db, payment_ids)
    sent = await emails_sql.templates_sent(db, payment_ids)
    return {
        payment_id: {
            "status": status,
            "transitions": transitions.get(payment_id, []),
            "bonus": balances.get(payment_id, 0),
            "ledger": ledgers.get(payment_id, []),
            "emails": sent.get(payment_id, []),
        }
        for payment_id, status in statuses.items()
    }


def expected_final_status(event_statuses: Iterable[str]) -> OrderStatus:
    """Final status of a PENDING order after payment.status_changed events with these statuses
    (amounts matching), delivered in any order and any number of times.

    Written from the rules, not from decide, so tests can hold one against the other. Raises
    ValueError for the one order-dependent set: a cancel-like status with amount_mismatch and
    no money status (whichever comes first wins, D1).
    """
    seen = set(event_statuses)
    for status, final in (
        ("refunded", OrderStatus.REFUNDED),
        ("settled", OrderStatus.SETTLED),
        ("paid", OrderStatus.PAID),
    ):
        if status in seen:
            return final
    cancelled = bool(seen & {"expired", "cancelled", "failed"})
    if cancelled and "amount_mismatch" in seen:
        raise ValueError("cancelled vs amount_mismatch depends on delivery order")
    if cancelled:
        return OrderStatus.CANCELLED
    if "amount_mismatch" in seen:
        return OrderStatus.AMOUNT_MISMATCH
    return OrderStatus.PENDING
