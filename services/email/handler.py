"""One order transition: its customer email, at most once per (payment, template), and never
a success email after the refund one (SPEC 5): recorded skipped instead. Sent before the
batch commits; the one resend window is in _Batch's docstring."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import structlog
from asyncpg.pool import PoolConnectionProxy

from services.email.sender import Sender
from services.email.template_files import EmailTemplate
from services.email.templates import TEMPLATE_FOR_EVENT, OutgoingEmail, message_id, render
from shared.db import TRANSIENT_DB_ERRORS, Executor
from shared.errors import Dependency, UnknownPaymentError
from shared.messages import OrderTransition
from shared.metrics import EmailMetrics
from shared.ops.erasure import MARKER
from shared.outages import outage_of
from shared.queries import emails as emails_sql
from shared.queries import orders as orders_sql
from shared.vocabulary import REFUNDED_EMAIL, SUCCEEDED_EMAIL
from shared.worker.batches import BatchHandler, Delivery, Result, Step, apply_set_batch, keys_of

log = structlog.get_logger(__name__)

WORKER = "email"

# How long a sent email's record is retried when the commit after the send failed.
RECORD_AFTER_SEND_S = 120.0
_RECORD_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
_RECORD_ATTEMPT_S = 5.0
# A success email the refund email overtook: recorded, not sent; answered `ok`.
_SKIPPED_AFTER_REFUND = "skipped_after_refund"
# An email of an order whose customer was erased: recorded, not sent; answered `ok`.
_SKIPPED_ERASED = "skipped_erased"


@dataclass(frozen=True, slots=True)
class _Claim:
    """An email a message asks for: claimed with the batch's others just before its commit."""

    index: int  # of its delivery in the batch
    claim: emails_sql.EmailClaim
    order: asyncpg.Record


@dataclass(frozen=True, slots=True)
class _Email:
    """An email claimed in the batch transaction, to be sent before its commit."""

    index: int
    claim: emails_sql.EmailClaim
    email: OutgoingEmail


class _Batch:
    """One batch's emails, decided in one transaction: its payments' emails locked first, in
    one statement (`start`); each message's email found in payment id order (`handle`); all
    of them claimed (or recorded skipped) in one statement, then the claimed ones sent, a
    payment's emails one after the other in the order decided and different payments
    concurrently, and the record of an email whose send failed taken back (`write`); then
    the commit.

    The commit follows the SMTP server's acceptance. If PostgreSQL goes away between the two,
    the record is written again in a new transaction (`failed`), retried for
    RECORD_AFTER_SEND_S, so a database outage does not resend. A crash of the process in that
    window is the one case that resends, with the same deterministic Message-ID, which mail
    systems dedup."""

    def __init__(
        self,
        orders: dict[str, asyncpg.Record],
        pool: asyncpg.Pool[Any],
        sender: Sender,
        email_from: str,
        templates: Mapping[str, EmailTemplate] | None,
    ) -> None:
        self._orders = orders  # read before the transaction
        self._pool = pool
        self._sender = sender
        self._email_from = email_from
        self._templates = templates
        self.delivered: list[_Email] = []  # accepted by the SMTP server

    async def start(self, conn: Executor, payment_ids: list[str]) -> None:
        await emails_sql.lock_payment_emails(conn, payment_ids)

    async def handle(self, step: Step, delivery: Delivery) -> str:
        """The email the message asks for, left on the step."""
        transition = OrderTransition.decode(delivery.body)
        template = TEMPLATE_FOR_EVENT.get(transition.event)
        if template is None:
            return "ok"  # order.cancelled and friends send nothing
        payment_id = transition.payment_id
        order = self._orders.get(payment_id)
        if order is None:
            raise UnknownPaymentError(f"no order for payment {payment_id}")
        claim = emails_sql.EmailClaim(
            payment_id,
            template,
            message_id(template, payment_id, self._email_from),
            order["email"],
            delivery.message_id,
            skip_if_recorded=REFUNDED_EMAIL if template == SUCCEEDED_EMAIL else None,
        )
        step.value = _Claim(step.index, claim, order)
        return "ok"

    async def write(self, conn: Executor, steps: list[Step]) -> dict[int, Result]:
        """Claim and send the committed steps' emails."""
        claims = [step.value for step in steps if isinstance(step.value, _Claim)]
        changed: dict[int, Result] = {}
        # An order whose customer was erased (read under the payments' email locks, which an
        # erasure takes too, so one that committed before is seen): its emails are recorded
        # as skipped, never sent (the order read before the transaction may still show the
        # address).
        erased = await emails_sql.erased_payments(conn, [c.claim.payment_id for c in claims])
        if erased:
            gone = [c for c in claims if c.claim.payment_id in erased]
            claims = [c for c in claims if c.claim.payment_id not in erased]
            recorded = await emails_sql.skip_erased(conn, [c.claim for c in gone], MARKER)
            for c, new in zip(gone, recorded, strict=True):
                changed[c.index] = _SKIPPED_ERASED if new else "skipped_duplicate"
        answers = await emails_sql.claim_emails(conn, [c.claim for c in claims])
        emails: list[_Email] = []
        for c, answer in zip(claims, answers, strict=True):
            if answer is None:
                changed[c.index] = "skipped_duplicate"
            elif not answer:
                changed[c.index] = _SKIPPED_AFTER_REFUND
            else:
                try:
                    emails.append(
                        _Email(c.index, c.claim, _render(c, self._email_from, self._templates))
                    )
                except Exception as e:  # a header it can't write: for good
                    changed[c.index] = e
        failed = await _send_all(self._sender, emails)
        changed.update(failed)
        self.delivered = [m for m in emails if m.index not in failed]
        if unsent := [c.claim for c in claims if isinstance(changed.get(c.index), Exception)]:
            await emails_sql.forget_emails(conn, [(c.payment_id, c.template) for c in unsent])
        return changed

    async def failed(self, error: Exception, deliveries: int) -> list[Result]:
        """The batch failed after `write` may have sent: the emails the SMTP server has are
        recorded anew (the failed commit took their records along), whatever failed it (a
        connection the server terminated under the commit surfaces as asyncpg's
        InternalClientError, not only as a connection error). Then a database outage fails
        the unsent messages alone; anything else hands the whole batch back, whose sent
        emails are found recorded."""
        results: list[Result] = [error] * deliveries
        if self.delivered:
            log.warning(
                "email.record_failed_after_send", error=repr(error), emails=len(self.delivered)
            )
        for email in self.delivered:
            try:
                await _record_after_send(self._pool, email.claim)
            except Exception as again:
                results[email.index] = again
            else:
                results[email.index] = "ok"
        if not _database_down(error):
            raise error  # not the database's: the worker hands the whole batch back
        return results

    def report(
        self, deliveries: Sequence[Delivery], results: list[Result], metrics: EmailMetrics
    ) -> list[Result]:
        """Count and log what the batch sent and skipped; a skipped email's message is `ok`."""
        for i, result in enumerate(results):
            if result == _SKIPPED_AFTER_REFUND:
                metrics.emails_skipped.labels(template=SUCCEEDED_EMAIL).inc()
                log.info("email.skipped_after_refund", payment_id=_payment_id(deliveries[i]))
                results[i] = "ok"
            elif result == _SKIPPED_ERASED:
                template = TEMPLATE_FOR_EVENT.get(_event(deliveries[i]), "unknown")
                metrics.emails_skipped.labels(template=template).inc()
                log.info("email.skipped_erased", payment_id=_payment_id(deliveries[i]))
                results[i] = "ok"
        for email in self.delivered:
            if results[email.index] == "ok":
                metrics.emails_sent.labels(template=email.claim.template).inc()
                log.info(
                    "email.sent", payment_id=email.claim.payment_id, template=email.claim.template
                )
        return results


def make_handler(
    pool: asyncpg.Pool[Any],
    sender: Sender,
    email_from: str,
    metrics: EmailMetrics,
    templates: Mapping[str, EmailTemplate] | None = None,
) -> BatchHandler:
    async def run(deliveries: Sequence[Delivery]) -> list[Result]:
        try:
            orders = await orders_sql.orders_for_payments(pool, keys_of(deliveries, _payment_id))
        except TRANSIENT_DB_ERRORS as e:
            return [e if isinstance(e, Exception) else RuntimeError(repr(e))] * len(deliveries)
        batch = _Batch(orders, pool, sender, email_from, templates)
        results = await apply_set_batch(pool, deliveries, batch, _payment_id, failed=batch.failed)
        return batch.report(deliveries, results, metrics)

    return run


def _render(
    c: _Claim, email_from: str, templates: Mapping[str, EmailTemplate] | None
) -> OutgoingEmail:
    order = c.order
    return render(
        c.claim.template,
        payment_id=c.claim.payment_id,
        order_id=order["order_id"],
        amount=str(order["amount"]),
        currency=order["currency"],
        recipient=c.claim.recipient,
        sender=email_from,
        templates=templates,
    )


def _event(delivery: Delivery) -> str:
    return OrderTransition.decode(delivery.body).event


def _payment_id(delivery: Delivery) -> str:
    """The batch order: the payment whose emails the message is about."""
    return OrderTransition.decode(delivery.body).payment_id


async def _send_all(sender: Sender, emails: list[_Email]) -> dict[int, Exception]:
    """Send: a payment's emails in order, stopping at its first failure (a later one must not
    arrive before it); payments together, the first email of each, then the second of those
    whose first went, and so on. The failed and unsent ones, by index."""
    queues: dict[str, list[_Email]] = {}
    for email in emails:
        queues.setdefault(email.claim.payment_id, []).append(email)
    failed: dict[int, Exception] = {}
    depth = 0
    while turn := [queue for queue in queues.values() if depth < len(queue)]:
        results = await sender.send_many([queue[depth].email for queue in turn])
        for queue, error in zip(turn, results, strict=True):
            if error is not None:
                for later in queue[depth:]:
                    failed[later.index] = error
                del queues[queue[0].claim.payment_id]
        depth += 1
    return failed


async def _record_after_send(pool: asyncpg.Pool[Any], claim: emails_sql.EmailClaim) -> None:
    """Write the record of an email already sent, retrying while PostgreSQL is away; raise
    (the message is redelivered and sent again) if it is still away after RECORD_AFTER_SEND_S.
    A row there already (another copy's) is just as good."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RECORD_AFTER_SEND_S
    attempt = 0
    while True:
        try:
            async with asyncio.timeout(_RECORD_ATTEMPT_S), pool.acquire() as conn:
                await _record_once(conn, claim)
            return
        except Exception as e:
            if not _database_down(e) or loop.time() >= deadline:
                raise
        await asyncio.sleep(_RECORD_BACKOFF_S[min(attempt, len(_RECORD_BACKOFF_S) - 1)])
        attempt += 1


async def _record_once(
    conn: asyncpg.Connection[Any] | PoolConnectionProxy[Any], claim: emails_sql.EmailClaim
) -> None:
    """The record, under the payment's email lock: an erasure that committed meanwhile makes
    its marker the recipient, never the address again."""
    async with conn.transaction():
        await emails_sql.lock_payment_emails(conn, [claim.payment_id])
        if await emails_sql.erased_payments(conn, [claim.payment_id]):
            claim = claim._replace(recipient=MARKER)
        await emails_sql.claim_email(conn, claim._replace(skip_if_recorded=None))


def _database_down(error: BaseException) -> bool:
    """PostgreSQL unreachable, overloaded or terminating connections (SPEC section 5's
    outage), as opposed to a statement it refused."""
    return isinstance(error, TRANSIENT_DB_ERRORS) or outage_of(error) is Dependency.POSTGRESQL
