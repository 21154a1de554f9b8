"""Words several modules must spell alike: order statuses, the headers we put on messages
(and int_header, which reads a number back from one), queue name suffixes, email template
names."""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class OrderStatus(StrEnum):
    PENDING = "PENDING"
    PAID = "PAID"
    SETTLED = "SETTLED"
    REFUNDED = "REFUNDED"
    CANCELLED = "CANCELLED"
    AMOUNT_MISMATCH = "AMOUNT_MISMATCH"


# An order in one of these holds its bonus points.
EARNING: Final = frozenset({OrderStatus.PAID, OrderStatus.SETTLED})

# Headers we own on a message on its way through retries, into a DLQ and back (no `x-`
# prefix: that space belongs to RabbitMQ).
ATTEMPTS: Final = "attempts"
FIRST_FAILED_AT: Final = "first_failed_at"
LAST_FAILED_AT: Final = "last_failed_at"
LAST_ERROR: Final = "error"
REASON: Final = "reason"
ORIGINAL_QUEUE: Final = "original_queue"
REQUEUED: Final = "requeued"
# The reconciler's synthetic events carry SOURCE = RECONCILIATION and CHECKED_AT (when the
# provider's answer was sought); ingest never puts a header of a webhook on a message, so no
# webhook can carry them (shared/messages.py: checked_at_of).
SOURCE: Final = "source"
RECONCILIATION: Final = "reconciliation"
CHECKED_AT: Final = "checked_at"
# A message an operator replayed from the inbox (`payhooks replay`) carries REPLAY = the run's
# id; with `--reprocess` also REPROCESS = the same id, which lets a worker apply it although
# its processed mark says it did (shared/worker/batches.py). Only a publisher holding AMQP
# credentials can set a header, never a webhook's body (shared/ops/replay.py, docs/runbook.md).
REPLAY: Final = "replay"
REPROCESS: Final = "reprocess"


def int_header(value: object) -> int | None:
    """A header that should hold a whole number (AMQP may carry it as text); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str | bytes):
        try:
            return int(value)
        except ValueError:
            return None
    return None


# `<queue>.dlq` holds a work queue's dead letters; `<dlq>.lock` is held by whoever reads it.
DLQ_SUFFIX: Final = ".dlq"
LOCK_SUFFIX: Final = ".lock"

# Customer emails, by template (the `emails.template` column).
SUCCEEDED_EMAIL: Final = "payment_succeeded"
REFUNDED_EMAIL: Final = "payment_refunded"
# Which transition asks for which email (services/email/templates.py TEMPLATE_FOR_EVENT is
# this; a replay's dry run reads it to count the emails a reprocess would find recorded).
EMAIL_FOR_TRANSITION: Final = {
    "order.paid": SUCCEEDED_EMAIL,
    "order.settled": SUCCEEDED_EMAIL,
    "order.refunded": REFUNDED_EMAIL,
}

# The reconciler's schedule classes, in the order they are asked (shared/queries/schedule.py).
RECONCILE_CLASSES: Final = ("undecided", "money", "settlement", "recheck")
