"""Judging a chaos round from the outside: every payment's state, ledger and emails against
what the provider's events say it should be, every email counted at the SMTP server.

Per payment, each problem falls in one class:
  lost     an effect that should be there is not (an email never sent, a bonus missing)
  doubled  an effect that happened twice (an SMTP message received twice, bonus too high)
           A copy sent again because the server's 250 for the first one was lost with its
           connection is counted apart (resent): SMTP cannot tell a client whether a message
           it sent before the link broke went through (RFC 1047), so a client that never read
           the 250 must send again; the copy carries the same Message-ID, by which receiving
           systems collapse it (docs/failure-behaviour.md).
  state    the order's final state is wrong
  story    the ledger and the emails disagree (a success email without a grant, a success email
           after the refund email): SPEC 5's one-story rule
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from services.sim.summary import Expectation, story_problems
from tests.chaos.stack import SmtpCounter

CLASSES = ("lost", "doubled", "state", "story")


@dataclass(frozen=True, slots=True)
class Observed:
    """What payhooks did for one payment."""

    status: str | None
    transitions: tuple[str, ...]  # the statuses the order moved to, in order
    ledger: tuple[str, ...]  # kinds, in order
    bonus: int
    emails: tuple[str, ...]  # templates recorded as sent (not skipped)
    smtp: Mapping[str, int]  # template -> SMTP messages received
    smtp_order: tuple[str, ...]  # templates in the order the SMTP server received them
    resent: int = 0  # copies sent again after the server's 250 was lost with its connection


def problems(expected: Expectation, seen: Observed) -> dict[str, str]:
    """The problem classes of one payment, each with what was seen."""
    found: dict[str, str] = {}
    if seen.status != expected.status.value:
        found["state"] = f"status {seen.status} != {expected.status.value}"
    missing = [t for t in expected.emails if seen.smtp.get(t, 0) == 0 or t not in seen.emails]
    if missing or seen.bonus < expected.bonus:
        found["lost"] = f"emails missing {missing}; bonus {seen.bonus} vs {expected.bonus}"
    doubled = {t: n for t, n in seen.smtp.items() if n > 1}
    if doubled or seen.bonus > expected.bonus:
        found["doubled"] = f"smtp copies {doubled}; bonus {seen.bonus} vs {expected.bonus}"
    allowed = set(expected.emails) | set(expected.optional_emails)
    unexpected = [t for t in seen.smtp if t not in allowed]
    story = [f"unexpected emails {unexpected}"] if unexpected else []
    story += story_problems(seen.transitions, seen.ledger, seen.smtp_order)
    if story:
        found["story"] = "; ".join(story)
    return found


def _payment_of(message_id: str) -> tuple[str, str]:
    """`<payment_succeeded.pay_1@chaos.test>` -> (payment id, template)."""
    local = message_id.strip("<>").split("@", 1)[0]
    template, _, payment_id = local.partition(".")
    return payment_id, template


@dataclass
class SmtpSeen:
    """What the SMTP server received, per payment."""

    copies: dict[str, Counter[str]]  # payment -> template -> copies (resent ones left out)
    order: dict[str, list[str]]  # payment -> templates in the order first received
    resent: Counter[str]  # payment -> copies sent again after a 250 lost with the link


def smtp_seen(counter: SmtpCounter) -> SmtpSeen:
    """A copy that follows one whose 250 may have been lost with its connection is resent,
    not doubled; any further copy is doubled again."""
    seen = SmtpSeen(defaultdict(Counter), defaultdict(list), Counter())
    maybe_lost = counter.reply_maybe_lost()
    reply_lost: set[str] = set()  # message ids whose latest copy's 250 may have been lost
    for index, mail in sorted(enumerate(counter.mails), key=lambda m: m[1].received):
        payment_id, template = _payment_of(mail.message_id)
        if mail.message_id in reply_lost:
            seen.resent[payment_id] += 1
        else:
            seen.copies[payment_id][template] += 1
        if index in maybe_lost:
            reply_lost.add(mail.message_id)
        else:
            reply_lost.discard(mail.message_id)
        if template not in seen.order[payment_id]:
            seen.order[payment_id].append(template)
    return seen


async def observe(
    database_url: str, payment_ids: Sequence[str], counter: SmtpCounter
) -> dict[str, Observed]:
    smtp = smtp_seen(counter)
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        rows = await conn.fetch(
            """
            SELECT o.payment_id, o.status,
                   coalesce((SELECT array_agg(to_status ORDER BY id) FROM order_transitions t
                             WHERE t.payment_id = o.payment_id), '{}') AS transitions,
                   coalesce((SELECT array_agg(kind ORDER BY transition_id, id) FROM bonus_ledger b
                             WHERE b.payment_id = o.payment_id), '{}') AS ledger,
                   coalesce((SELECT sum(points) FROM bonus_ledger b
                             WHERE b.payment_id = o.payment_id), 0) AS bonus,
                   coalesce((SELECT array_agg(template ORDER BY sent_at) FROM emails_sent e
                             WHERE e.payment_id = o.payment_id AND NOT skipped), '{}') AS emails
            FROM orders o WHERE o.payment_id = ANY($1::text[])
            """,
            list(payment_ids),
        )
    finally:
        await conn.close()
    found: dict[str, Any] = {}
    for r in rows:
        found[r["payment_id"]] = Observed(
            status=r["status"],
            transitions=tuple(r["transitions"]),
            ledger=tuple(r["ledger"]),
            bonus=int(r["bonus"]),
            emails=tuple(r["emails"]),
            smtp=dict(smtp.copies.get(r["payment_id"], {})),
            smtp_order=tuple(smtp.order.get(r["payment_id"], ())),
            resent=smtp.resent[r["payment_id"]],
        )
    return found


def judge(
    expectations: Iterable[Expectation], observed: Mapping[str, Observed]
) -> dict[str, dict[str, str]]:
    """payment id -> its problems (payments without problems are left out)."""
    result = {}
    for e in expectations:
        seen = observed.get(e.payment_id)
        found = {"state": "no order"} if seen is None else problems(e, seen)
        if found:
            result[e.payment_id] = found
    return result


def counts(found: Mapping[str, Mapping[str, str]]) -> dict[str, int]:
    return {c: sum(1 for p in found.values() if c in p) for c in CLASSES}
