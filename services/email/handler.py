"""One order transition: send its customer email, at most once per (payment, template).

A payment's emails are decided and sent one at a time (a lock per payment), and a success
email whose payment already has its refund email is not sent but recorded as skipped: a
customer never reads "payment received" after "payment refunded" (SPEC 5).

A batch of messages is decided in one transaction (a savepoint each), its emails are sent
before the commit (a payment's in the order decided, payments concurrently), and the claims
of the ones that failed to send are taken back before it. The commit follows the SMTP
server's acceptance. If PostgreSQL goes away between the two (the commit
fails), the row is written again in a new transaction, retried for RECORD_AFTER_SEND_S, so a
database outage does not resend. A crash of the process in that window is the one case that
resends: the redelivered message finds no row and sends again — with the same deterministic
Message-ID, which mail systems dedup.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from email.message import Message
from functools import partial
from typing import Any

import asyncpg
import structlog

from services.email.sender import Sender
from services.email.templates import REFUNDED, SUCCEEDED, TEMPLATE_FOR_EVENT, message_id, render
from shared.batches import BatchHandler, Delivery, Result, Step, apply_each
from shared.db import TRANSIENT_DB_ERRORS
from shared.errors import UnknownPaymentError
from shared.messages import OrderTransition
from shared.metrics import EmailMetrics
from shared.queries import emails as emails_sql
from shared.queries import orders as orders_sql

log = structlog.get_logger(__name__)

WORKER = "email"

# How long a sent email's record is retried when the commit after the send failed.
RECORD_AFTER_SEND_S = 120.0
_RECORD_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
_RECORD_ATTEMPT_S = 5.0
# A success email the refund email overtook: recorded, not sent; answered `ok`.
_SKIPPED_AFTER_REFUND = "skipped_after_refund"


@dataclass(frozen=True, slots=True)
class _Email:
    """An email decided and claimed in the batch transaction, to be sent before its commit."""

    index: int  # of its delivery in the batch
    template: str
    record: tuple[str, str, str, str, str]  # payment id, template, Message-ID, to, event id
    message: Message


def make_handler(
    pool: asyncpg.Pool[Any], sender: Sender, email_from: str, metrics: EmailMetrics
) -> BatchHandler:
    """A batch's emails are decided in one transaction (a savepoint each, payments in id
    order, each payment locked), then sent (a payment's emails one after the other in the
    order decided, different payments concurrently), then committed together; the record of
    an email whose send failed is taken back before the commit."""

    async def decide(step: Step, delivery: Delivery, decided: dict[int, _Email]) -> str:
        """Claim the email (or record it skipped) under the payment's lock; an email to send
        goes into `decided`, by the delivery's place in the batch."""
        conn = step.conn
        transition = OrderTransition.decode(delivery.body)
        template = TEMPLATE_FOR_EVENT.get(transition.event)
        if template is None:
            return "ok"  # order.cancelled and friends send nothing
        payment_id = transition.payment_id
        order = await orders_sql.order_for_payment(conn, payment_id)
        if order is None:
            raise UnknownPaymentError(f"no order for payment {payment_id}")
        mid = message_id(template, payment_id, email_from)
        record = (payment_id, template, mid, order["email"], delivery.message_id)
        await emails_sql.lock_payment_emails(conn, payment_id)
        skipped = template == SUCCEEDED and await emails_sql.is_recorded(conn, payment_id, REFUNDED)
        if not await emails_sql.record_email(conn, *record, skipped=skipped):
            return "skipped_duplicate"
        if skipped:
            return _SKIPPED_AFTER_REFUND
        message = render(
            template,
            payment_id=payment_id,
            order_id=order["order_id"],
            amount=str(order["amount"]),
            currency=order["currency"],
            recipient=order["email"],
            sender=email_from,
        )
        decided[step.index] = _Email(step.index, template, record, message)
        return "ok"

    async def handle(deliveries: Sequence[Delivery]) -> list[Result]:
        results: list[Result | None] = [None] * len(deliveries)
        decided: dict[int, _Email] = {}
        emails: list[_Email] = []
        failed: dict[int, Exception] = {}
        delivered: list[_Email] = []  # accepted by the SMTP server
        try:
            async with pool.acquire() as conn, conn.transaction():
                results, claimed = await apply_each(
                    conn, deliveries, partial(decide, decided=decided), _payment_id
                )
                emails = [decided[step.index] for step in claimed if step.index in decided]
                failed = await _send_all(sender, emails)
                delivered = [m for m in emails if m.index not in failed]
                if failed:
                    await emails_sql.forget_emails(
                        conn, [e.record[:2] for e in emails if e.index in failed]
                    )
        except TRANSIENT_DB_ERRORS as caught:
            lost = caught if isinstance(caught, Exception) else RuntimeError(repr(caught))
            results = [r if isinstance(r, Exception) else lost for r in results]
            if delivered:
                # The SMTP server has these emails; the failed commit took their records along.
                log.warning(
                    "email.record_failed_after_send", error=repr(lost), emails=len(delivered)
                )
            for email in delivered:
                try:
                    await _record_after_send(pool, *email.record)
                except Exception as again:
                    results[email.index] = again
                else:
                    results[email.index] = "ok"
        for index, error in failed.items():
            results[index] = error
        for i, result in enumerate(results):
            if result == _SKIPPED_AFTER_REFUND:
                metrics.emails_skipped.labels(template=SUCCEEDED).inc()
                log.info("email.skipped_after_refund", payment_id=_payment_id(deliveries[i]))
                results[i] = "ok"
        for email in delivered:
            if results[email.index] == "ok":
                metrics.emails_sent.labels(template=email.template).inc()
                log.info("email.sent", payment_id=email.record[0], template=email.template)
        return [r if r is not None else RuntimeError("not handled") for r in results]

    return handle


def _payment_id(delivery: Delivery) -> str:
    """The batch order: the payment whose emails the message is about."""
    return OrderTransition.decode(delivery.body).payment_id


async def _send_all(sender: Sender, emails: list[_Email]) -> dict[int, Exception]:
    """Send: a payment's emails in order, stopping at its first failure (a later one must not
    arrive before it); payments concurrently. The failed and unsent ones, by index."""
    by_payment: dict[str, list[_Email]] = {}
    for email in emails:
        by_payment.setdefault(email.record[0], []).append(email)
    failed: dict[int, Exception] = {}

    async def send_in_order(queue: list[_Email]) -> None:
        for n, email in enumerate(queue):
            try:
                await sender.send(email.message)
            except Exception as e:
                for later in queue[n:]:
                    failed[later.index] = e
                return

    await asyncio.gather(*(send_in_order(q) for q in by_payment.values()))
    return failed


async def _record_after_send(
    pool: asyncpg.Pool[Any],
    payment_id: str,
    template: str,
    mid: str,
    recipient: str,
    event_id: str,
) -> None:
    """Write the record of an email already sent, retrying while PostgreSQL is away; raise
    (the message is redelivered and sent again) if it is still away after RECORD_AFTER_SEND_S.
    A row there already (another copy's) is just as good."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RECORD_AFTER_SEND_S
    attempt = 0
    while True:
        try:
            async with asyncio.timeout(_RECORD_ATTEMPT_S), pool.acquire() as conn:
                await emails_sql.record_email(conn, payment_id, template, mid, recipient, event_id)
            return
        except TRANSIENT_DB_ERRORS:
            if loop.time() >= deadline:
                raise
        await asyncio.sleep(_RECORD_BACKOFF_S[min(attempt, len(_RECORD_BACKOFF_S) - 1)])
        attempt += 1
