"""The two customer emails, as small plain-text and HTML templates. No I/O."""

from __future__ import annotations

import html
from dataclasses import dataclass
from email.header import Header
from email.message import Message
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from email.utils import parseaddr
from string import Template

from shared.vocabulary import REFUNDED_EMAIL, SUCCEEDED_EMAIL

TEMPLATE_HEADER = "X-Payhooks-Template"

# Which transition sends which email (at most one of each per payment id).
TEMPLATE_FOR_EVENT = {
    "order.paid": SUCCEEDED_EMAIL,
    "order.settled": SUCCEEDED_EMAIL,
    "order.refunded": REFUNDED_EMAIL,
}


@dataclass(frozen=True, slots=True)
class _Template:
    subject: Template
    text: Template
    html: Template


_TEMPLATES = {
    "payment_succeeded": _Template(
        Template("Payment received for order $order_id"),
        Template(
            "Hello,\n\nwe received your payment of $amount $currency for order $order_id.\n"
            "Thank you!\n"
        ),
        Template(
            "<p>Hello,</p><p>we received your payment of <b>$amount $currency</b> for order"
            " <b>$order_id</b>.</p><p>Thank you!</p>"
        ),
    ),
    "payment_refunded": _Template(
        Template("Refund for order $order_id"),
        Template("Hello,\n\nyour payment of $amount $currency for order $order_id was refunded.\n"),
        Template(
            "<p>Hello,</p><p>your payment of <b>$amount $currency</b> for order"
            " <b>$order_id</b> was refunded.</p>"
        ),
    ),
}


def message_id(template: str, payment_id: str, email_from: str) -> str:
    """Deterministic: a resend after a crash carries the same id, so receivers dedup it."""
    # EMAIL_FROM may carry a display name ("Shop <payments@shop.example>"): the address's.
    address = parseaddr(email_from)[1]
    _, at, domain = address.rpartition("@")
    domain = (domain.strip() if at else "") or "payhooks.localhost"
    return f"<{template}.{payment_id}@{domain}>"


def render(
    template: str,
    *,
    payment_id: str,
    order_id: str,
    amount: str,
    currency: str,
    recipient: str,
    sender: str,
) -> Message:
    """A multipart/alternative message (plain text + HTML).

    Built with the compat32 MIME classes: the default-policy EmailMessage creates a header
    class per header and costs ~1.5 ms a message, four times this, which made email building
    the email worker's main CPU cost in bench/workers.py.
    """
    parts = _TEMPLATES[template]
    values = {"order_id": order_id, "amount": amount, "currency": currency}
    escaped = {k: html.escape(v) for k, v in values.items()}
    msg = MIMEMultipart("alternative")
    msg["From"] = sender
    msg["To"] = recipient
    msg["Subject"] = _header(parts.subject.substitute(values))
    msg["Message-ID"] = message_id(template, payment_id, sender)
    msg[TEMPLATE_HEADER] = template
    msg.attach(MIMEText(parts.text.substitute(values), "plain", "utf-8"))
    msg.attach(MIMEText(parts.html.substitute(escaped), "html", "utf-8"))
    return msg


def _header(value: str) -> str:
    """Non-ASCII header text as an RFC 2047 encoded word (compat32 won't do it for us)."""
    return value if value.isascii() else Header(value, "utf-8").encode()
