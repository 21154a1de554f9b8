"""One order transition: send its customer email, at most once per (payment, template).

A payment's emails are decided and sent one at a time (a lock per payment), and a success
email whose payment already has its refund email is not sent but recorded as skipped: a
customer never reads "payment received" after "payment refunded" (SPEC 5).

The send happens inside the transaction that inserts the emails_sent row, and the commit
follows the SMTP server's acceptance. If PostgreSQL goes away between the two (the commit
fails), the row is written again in a new transaction, retried for RECORD_AFTER_SEND_S, so a
database outage does not resend. A crash of the process in that window is the one case that
resends: the redelivered message finds no row and sends again — with the same deterministic
Message-ID, which mail systems dedup.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import structlog

from services.email.sender import Sender
from services.email.templates import REFUNDED, SUCCEEDED, TEMPLATE_FOR_EVENT, message_id, render
from shared.db import TRANSIENT_DB_ERRORS
from shared.errors import UnknownPaymentError
from shared.messages import OrderTransition
from shared.metrics import EmailMetrics
from shared.queries import emails as emails_sql
from shared.queries import orders as orders_sql
from shared.worker import Delivery, Handler

log = structlog.get_logger(__name__)

WORKER = "email"

# How long a sent email's record is retried when the commit after the send failed.
RECORD_AFTER_SEND_S = 120.0
_RECORD_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
_RECORD_ATTEMPT_S = 5.0


def make_handler(
    pool: asyncpg.Pool[Any], sender: Sender, email_from: str, metrics: EmailMetrics
) -> Handler:
    async def handle(delivery: Delivery) -> str:
        transition = OrderTransition.decode(delivery.body)
        template = TEMPLATE_FOR_EVENT.get(transition.event)
        if template is None:
            return "ok"  # order.cancelled and friends send nothing
        mid = message_id(template, transition.payment_id, email_from)
        sent: tuple[str, str, str, str, str] | None = None  # the record of an email sent
        skipped = False
        try:
            async with pool.acquire() as conn, conn.transaction():
                order = await orders_sql.order_for_payment(conn, transition.payment_id)
                if order is None:
                    raise UnknownPaymentError(f"no order for payment {transition.payment_id}")
                record = (transition.payment_id, template, mid, order["email"], delivery.message_id)
                await emails_sql.lock_payment_emails(conn, transition.payment_id)
                skipped = template == SUCCEEDED and await emails_sql.is_recorded(
                    conn, transition.payment_id, REFUNDED
                )
                if not await emails_sql.record_email(conn, *record, skipped=skipped):
                    return "skipped_duplicate"
                if not skipped:
                    await sender.send(
                        render(
                            template,
                            payment_id=transition.payment_id,
                            order_id=order["order_id"],
                            amount=str(order["amount"]),
                            currency=order["currency"],
                            recipient=order["email"],
                            sender=email_from,
                        )
                    )
                    sent = record
        except TRANSIENT_DB_ERRORS as e:
            if sent is None:
                raise
            # The SMTP server has the email; the failed commit took its record with it.
            log.warning("email.record_failed_after_send", error=repr(e))
            await _record_after_send(pool, *sent)
        if skipped:
            metrics.emails_skipped.labels(template=template).inc()
            log.info("email.skipped_after_refund", payment_id=transition.payment_id)
            return "ok"
        metrics.emails_sent.labels(template=template).inc()
        log.info("email.sent", payment_id=transition.payment_id, template=template)
        return "ok"

    return handle


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
