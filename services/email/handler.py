"""One order transition: send its customer email, at most once per (payment, template).

The send happens inside the transaction that inserts the emails_sent row, and the commit
follows the SMTP server's acceptance. A crash after the server accepted the message and
before the commit is the one window that resends: the redelivered message finds no row and
sends again — with the same deterministic Message-ID, which mail systems dedup.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import structlog

from services.email.sender import Sender
from services.email.templates import TEMPLATE_FOR_EVENT, message_id, render
from shared.errors import UnknownPaymentError
from shared.messages import OrderTransition
from shared.metrics import EmailMetrics
from shared.queries import emails as emails_sql
from shared.queries import orders as orders_sql
from shared.worker import Delivery, Handler

log = structlog.get_logger(__name__)

WORKER = "email"


def make_handler(
    pool: asyncpg.Pool[Any], sender: Sender, email_from: str, metrics: EmailMetrics
) -> Handler:
    async def handle(delivery: Delivery) -> str:
        transition = OrderTransition.decode(delivery.body)
        template = TEMPLATE_FOR_EVENT.get(transition.event)
        if template is None:
            return "ok"  # order.cancelled and friends send nothing
        mid = message_id(template, transition.payment_id, email_from)
        async with pool.acquire() as conn, conn.transaction():
            order = await orders_sql.order_for_payment(conn, transition.payment_id)
            if order is None:
                raise UnknownPaymentError(f"no order for payment {transition.payment_id}")
            claimed = await emails_sql.record_email(
                conn, transition.payment_id, template, mid, order["email"], delivery.message_id
            )
            if not claimed:
                return "skipped_duplicate"
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
        metrics.emails_sent.labels(template=template).inc()
        log.info("email.sent", payment_id=transition.payment_id, template=template)
        return "ok"

    return handle
