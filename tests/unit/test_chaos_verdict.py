"""The chaos harness's judge: which class each kind of wrong outcome falls in."""

from __future__ import annotations

from services.sim.summary import Expectation
from shared.vocabulary import OrderStatus
from tests.chaos.stack import REPLY_IN_FLIGHT_S, Mail, SmtpCounter
from tests.chaos.verdict import Observed, counts, judge, problems, smtp_seen


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


def _counter(*mails: tuple[str, int], cut: dict[int, float] | None = None) -> SmtpCounter:
    """(message id, connection) in the order received, a second apart from t=100."""
    counter = SmtpCounter(cut_at=dict(cut or {}))
    for n, (message_id, connection) in enumerate(mails):
        counter.mails.append(Mail(message_id, "payment_succeeded", 100.0 + n, connection))
    return counter


SUCCEEDED = "<payment_succeeded.p1@chaos.test>"


def test_a_copy_after_a_250_lost_with_its_connection_is_resent_not_doubled() -> None:
    # The first copy was the last its connection carried, cut 0.1 s after it was taken.
    seen = smtp_seen(_counter((SUCCEEDED, 1), (SUCCEEDED, 2), cut={1: 100.1}))
    assert seen.copies["p1"]["payment_succeeded"] == 1
    assert seen.resent["p1"] == 1


def test_a_copy_after_a_250_the_client_had_time_to_read_is_doubled() -> None:
    # Connection 1 carried another message after the first copy, or ended long after it, or
    # ended with QUIT (no cut recorded): each time the client read the 250.
    for counter in (
        _counter((SUCCEEDED, 1), ("<payment_succeeded.p2@chaos.test>", 1), (SUCCEEDED, 2)),
        _counter((SUCCEEDED, 1), (SUCCEEDED, 2), cut={1: 100.0 + REPLY_IN_FLIGHT_S + 0.5}),
        _counter((SUCCEEDED, 1), (SUCCEEDED, 2)),
    ):
        seen = smtp_seen(counter)
        assert seen.copies["p1"]["payment_succeeded"] == 2
        assert seen.resent["p1"] == 0


def test_only_the_copy_right_after_a_lost_250_is_excused() -> None:
    # Copy 2 was read (its connection lives on): copy 3 is a doubled email.
    seen = smtp_seen(_counter((SUCCEEDED, 1), (SUCCEEDED, 2), (SUCCEEDED, 3), cut={1: 100.1}))
    assert seen.copies["p1"]["payment_succeeded"] == 2
    assert seen.resent["p1"] == 1
