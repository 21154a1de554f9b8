"""Judging a chaos round from the outside: every payment's state, ledger and emails against
what the provider's events say it should be, every email counted at the SMTP server.

Per payment, each problem falls in one class:
  lost     an effect that should be there is not (an email never sent, a bonus missing)
  doubled  an effect that happened twice (an SMTP message received twice, bonus too high)
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
from tests.chaos.stack import Mail

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


async def observe(
    database_url: str, payment_ids: Sequence[str], mails: Iterable[Mail]
) -> dict[str, Observed]:
    smtp: dict[str, Counter[str]] = defaultdict(Counter)
    order: dict[str, list[str]] = defaultdict(list)
    for mail in sorted(mails, key=lambda m: m.received):
        payment_id, template = _payment_of(mail.message_id)
        smtp[payment_id][template] += 1
        if template not in order[payment_id]:
            order[payment_id].append(template)
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
            smtp=dict(smtp.get(r["payment_id"], {})),
            smtp_order=tuple(order.get(r["payment_id"], ())),
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
