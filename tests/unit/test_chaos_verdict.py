"""The chaos harness's judge: which class each kind of wrong outcome falls in."""

from __future__ import annotations

from services.sim.summary import Expectation
from shared.vocabulary import OrderStatus
from tests.chaos.verdict import Observed, counts, judge, problems


def refunded(payment_id: str = "p1") -> Expectation:
    return Expectation(
        payment_id=payment_id,
        flow="refunded",
        lost=0,
        needs_repair=False,
        reordered=False,
        status=OrderStatus.REFUNDED,
        bonus=0,
        emails=("payment_refunded",),
        optional_emails=("payment_succeeded",),
    )


def seen(
    status: str = "REFUNDED",
    transitions: tuple[str, ...] = ("PAID", "REFUNDED"),
    ledger: tuple[str, ...] = ("grant", "clawback"),
    bonus: int = 0,
    smtp_order: tuple[str, ...] = ("payment_succeeded", "payment_refunded"),
    copies: int = 1,
) -> Observed:
    return Observed(
        status=status,
        transitions=transitions,
        ledger=ledger,
        bonus=bonus,
        emails=smtp_order,
        smtp=dict.fromkeys(smtp_order, copies),
        smtp_order=smtp_order,
    )


def test_a_refunded_payment_told_as_one_story_has_no_problem() -> None:
    assert problems(refunded(), seen()) == {}


def test_a_second_smtp_copy_is_a_doubled_effect() -> None:
    assert set(problems(refunded(), seen(copies=2))) == {"doubled"}


def test_a_missing_refund_email_is_a_lost_effect() -> None:
    found = problems(refunded(), seen(smtp_order=("payment_succeeded",)))
    assert set(found) == {"lost"}


def test_a_success_email_without_a_grant_breaks_the_story() -> None:
    found = problems(refunded(), seen(ledger=()))
    assert set(found) == {"story"}
    assert "without a grant" in found["story"]


def test_a_refund_the_order_saw_before_its_payment_needs_no_success_email_nor_grant() -> None:
    alone = seen(transitions=("REFUNDED",), ledger=(), smtp_order=("payment_refunded",))
    assert problems(refunded(), alone) == {}


def test_a_ledger_that_misses_a_transition_breaks_the_story() -> None:
    again = ("PAID", "REFUNDED", "PAID", "REFUNDED")
    short = ("grant", "clawback", "restore")
    found = problems(refunded(), seen(transitions=again, ledger=short, bonus=500))
    assert set(found) == {"story", "doubled"}  # net 500 where 0 is due: also one bonus too many
    assert "call for ['grant', 'clawback', 'restore', 'clawback']" in found["story"]


def test_a_success_email_after_the_refund_email_breaks_the_story() -> None:
    found = problems(refunded(), seen(smtp_order=("payment_refunded", "payment_succeeded")))
    assert set(found) == {"story"}


def test_a_wrong_final_state_and_a_missing_order_are_state_problems() -> None:
    assert set(problems(refunded(), seen(status="PAID"))) >= {"state"}
    found = judge([refunded("p1"), refunded("p2")], {"p1": seen()})
    assert found == {"p2": {"state": "no order"}}
    assert counts(found) == {"lost": 0, "doubled": 0, "state": 1, "story": 0}
