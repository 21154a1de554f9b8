"""The two customer emails rendered from their templates (template_files.py), and their
deterministic Message-ID."""

from __future__ import annotations

import hashlib
import html
from collections.abc import Mapping
from email.header import Header
from email.message import Message
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from email.utils import parseaddr

from services.email.template_files import EmailTemplate, default_templates
from shared.vocabulary import REFUNDED_EMAIL, SUCCEEDED_EMAIL

TEMPLATE_HEADER = "X-Payhooks-Template"

# Which transition sends which email (at most one of each per payment id).
TEMPLATE_FOR_EVENT = {
    "order.paid": SUCCEEDED_EMAIL,
    "order.settled": SUCCEEDED_EMAIL,
    "order.refunded": REFUNDED_EMAIL,
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
    templates: Mapping[str, EmailTemplate] | None = None,
) -> Message:
    """A multipart/alternative message (plain text + HTML); `templates`: load_templates'
    (a shop's texts), else the defaults.

    Built with the compat32 MIME classes: the default-policy EmailMessage creates a header
    class per header and costs ~1.5 ms a message, four times this, which made email building
    the email worker's main CPU cost in bench/workers.py.
    """
    parts = (default_templates() if templates is None else templates)[template]
    values = {"order_id": order_id, "amount": amount, "currency": currency}
    escaped = {k: html.escape(v) for k, v in values.items()}
    mid = message_id(template, payment_id, sender)
    # Our own boundary, so the generator need not make one: it draws a random one and
    # compiles a regular expression per message to check the text doesn't hold it (a tenth
    # of the email worker's CPU in bench/workers.py's profile). The parts are base64 (utf-8
    # bodies), whose lines never start with "--": no text can collide with it.
    boundary = "=_payhooks_" + hashlib.sha256(mid.encode()).hexdigest()[:32]
    msg = MIMEMultipart("alternative", boundary=boundary)
    msg["From"] = sender
    msg["To"] = recipient
    msg["Subject"] = _header(parts.subject.substitute(values))
    msg["Message-ID"] = mid
    msg[TEMPLATE_HEADER] = template
    msg.attach(MIMEText(parts.text.substitute(values), "plain", "utf-8"))
    msg.attach(MIMEText(parts.html.substitute(escaped), "html", "utf-8"))
    return msg


def _header(value: str) -> str:
    """Non-ASCII header text as an RFC 2047 encoded word (compat32 won't do it for us)."""
    return value if value.isascii() else Header(value, "utf-8").encode()
