"""The two customer emails rendered from their templates (template_files.py), and their
deterministic Message-ID."""

from __future__ import annotations

import base64
import functools
import hashlib
import html
from collections.abc import Mapping
from dataclasses import dataclass
from email.header import Header
from email.utils import formataddr, parseaddr

from services.email.template_files import EmailTemplate, default_templates
from shared.errors import PermanentError
from shared.vocabulary import EMAIL_FOR_TRANSITION

TEMPLATE_HEADER = "X-Payhooks-Template"

# Which transition sends which email (at most one of each per payment id).
TEMPLATE_FOR_EVENT = EMAIL_FOR_TRANSITION


def message_id(template: str, payment_id: str, email_from: str) -> str:
    """Deterministic: a resend after a crash carries the same id, so receivers dedup it."""
    return f"<{template}.{payment_id}@{_domain_of(email_from)}>"


@functools.cache
def _address_of(email_from: str) -> str:
    """EMAIL_FROM may carry a display name ("Shop <payments@shop.example>"): its address."""
    return parseaddr(email_from)[1]


@functools.cache
def _domain_of(email_from: str) -> str:
    _, at, domain = _address_of(email_from).rpartition("@")
    return (domain.strip() if at else "") or "payhooks.localhost"


@dataclass(frozen=True, slots=True)
class OutgoingEmail:
    """One email as it goes to the SMTP server: its envelope and its bytes (CRLF lines)."""

    message_id: str
    mail_from: str  # the envelope's addresses: EMAIL_FROM's and the order's
    rcpt_to: str
    data: bytes

    @property
    def needs_smtputf8(self) -> bool:
        """An address in UTF-8 (RFC 6531): the server must take SMTPUTF8."""
        return not (self.mail_from.isascii() and self.rcpt_to.isascii())


class UnwritableHeaderError(PermanentError, ValueError):
    """A value with a line break would end its header and start another (a Bcc, say)."""


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
) -> OutgoingEmail:
    """A multipart/alternative message (plain text + HTML, each base64 UTF-8); `templates`:
    load_templates' (a shop's texts), else the defaults.

    Written out here rather than built with the email package's MIME classes and generator:
    the message's shape never changes, and those took ~700 us a message (building the parts,
    folding every header, walking the tree), 40 % of the email worker's CPU in
    bench/workers.py, where this takes ~60 us. The email package still writes every header
    that needs encoding or folding (email.header.Header), and tests parse the bytes back
    with it.
    """
    parts = (default_templates() if templates is None else templates)[template]
    values = {"order_id": order_id, "amount": amount, "currency": currency}
    escaped = {k: html.escape(v) for k, v in values.items()}
    mid = message_id(template, payment_id, sender)
    # Ours, not random: a resend carries the same bytes. The parts are base64, whose lines
    # never start with "--", so no text can collide with it.
    boundary = "=_payhooks_" + hashlib.sha256(mid.encode()).hexdigest()[:32]
    lines = [
        "Content-Type: multipart/alternative;",
        f' boundary="{boundary}"',
        "MIME-Version: 1.0",
        _address_header("From", sender),
        _address_header("To", recipient),
        _text_header("Subject", parts.subject.substitute(values)),
        _text_header("Message-ID", mid),
        f"{TEMPLATE_HEADER}: {template}",
        "",
    ]
    for subtype, body in (
        ("plain", parts.text.substitute(values)),
        ("html", parts.html.substitute(escaped)),
    ):
        lines += [
            f"--{boundary}",
            f'Content-Type: text/{subtype}; charset="utf-8"',
            "MIME-Version: 1.0",
            "Content-Transfer-Encoding: base64",
            "",
            base64.encodebytes(body.encode()).decode("ascii").replace("\n", _CRLF),
        ]
    lines.append(f"--{boundary}--{_CRLF}")
    return OutgoingEmail(
        mid, _address_of(sender), parseaddr(recipient)[1], _CRLF.join(lines).encode()
    )


_CRLF = "\r\n"
_MAX_LINE = 78  # RFC 5322's "should"; email.header folds longer headers at it


def _text_header(name: str, value: str) -> str:
    """`Name: value`, non-ASCII text as RFC 2047 encoded words, folded where too long."""
    if "\r" in value or "\n" in value:
        raise UnwritableHeaderError(f"a line break in the {name} header")
    if value.isascii() and len(name) + 2 + len(value) <= _MAX_LINE:
        return f"{name}: {value}"
    charset = None if value.isascii() else "utf-8"
    folded = Header(value, charset, header_name=name).encode(linesep=_CRLF, maxlinelen=_MAX_LINE)
    return f"{name}: {folded}"


def _address_header(name: str, value: str) -> str:
    """From/To: a non-ASCII display name encoded (the address must stay readable); a
    non-ASCII address as it is (RFC 6532: the message then needs SMTPUTF8)."""
    if value.isascii():
        return _text_header(name, value)
    display, address = parseaddr(value)
    if not address.isascii():
        if "\r" in value or "\n" in value:
            raise UnwritableHeaderError(f"a line break in the {name} header")
        return f"{name}: {value}"
    return _text_header(name, formataddr((display, address), charset="utf-8"))
