"""The customer emails' deterministic Message-ID (SPEC: <{template}.{payment_id}@{domain}>), their
texts (defaults and a shop's own, one file format) and how they render."""

from __future__ import annotations

import re
from email import message_from_bytes
from email.header import decode_header, make_header
from email.message import Message

import pytest

from services.email.template_files import EmailTemplate, default_templates, parse_template
from services.email.templates import OutgoingEmail, UnwritableHeaderError, message_id, render
from shared.errors import PermanentError


@pytest.mark.parametrize(
    "email_from",
    [
        "payments@shop.example",
        "Shop <payments@shop.example>",
        '"Shop, Inc." <payments@shop.example>',
        " payments@shop.example ",
    ],
)
def test_message_id_uses_the_domain_of_the_address(email_from: str) -> None:
    assert message_id("payment_succeeded", "pay_1", email_from) == (
        "<payment_succeeded.pay_1@shop.example>"
    )


def test_message_id_without_a_domain_falls_back_to_a_local_one() -> None:
    assert message_id("payment_refunded", "pay_1", "payments") == (
        "<payment_refunded.pay_1@payhooks.localhost>"
    )


def test_rendered_email_carries_the_message_id_once() -> None:
    email = written(sender="Shop <payments@shop.example>")
    msg = message_from_bytes(email.data)
    assert msg.get_all("Message-ID") == ["<payment_succeeded.pay_1@shop.example>"]
    assert email.message_id == "<payment_succeeded.pay_1@shop.example>"
    assert (email.mail_from, email.rcpt_to) == ("payments@shop.example", "buyer@example.com")


def test_the_boundary_is_ours_and_no_body_line_can_hold_it() -> None:
    """The boundary is set, not drawn by the generator: a text that spells it out (even a
    shop's, in a line of its own) still parses back into the same two parts."""
    first = rendered()
    boundary = first.get_boundary()
    assert boundary is not None
    assert boundary.startswith("=_payhooks_")
    assert rendered().get_boundary() == boundary  # per Message-ID, the same on a resend
    assert rendered(payment_id="pay_2").get_boundary() != boundary
    text = f"Subject: x\n\n--{boundary}\n--{boundary}--\n--- html ---\n<p>--{boundary}</p>\n"
    shop = {"payment_succeeded": parse_template(text)}
    msg = rendered(shop)
    again = message_from_bytes(msg.as_bytes())
    assert [p.get_content_type() for p in again.walk()] == [
        "multipart/alternative",
        "text/plain",
        "text/html",
    ]
    assert parts(again) == parts(msg)
    assert parts(again)[0] == f"--{boundary}\n--{boundary}--\n"


# --- the texts: defaults shipped as files, a shop's own parsed by the same rules ---------------

SHOP_TEXT = """Subject: Danke für Ihre Zahlung ($order_id)

Hallo,

wir haben $amount $currency erhalten. 100 $$ Rabatt beim nächsten Mal!

--- html ---
<p>Wir haben <b>$amount $currency</b> für $order_id erhalten.</p>
"""


def written(
    templates: dict[str, EmailTemplate] | None = None,
    template: str = "payment_succeeded",
    **values: str,
) -> OutgoingEmail:
    fields = {
        "payment_id": "pay_1",
        "order_id": "ord_1",
        "amount": "100.00",
        "currency": "USD",
        "recipient": "buyer@example.com",
        "sender": "payments@shop.example",
    }
    return render(template, **(fields | values), templates=templates)


def rendered(templates: dict[str, EmailTemplate] | None = None, **values: str) -> Message:
    """The email as a mail reader parses it back."""
    return message_from_bytes(written(templates, **values).data)


def parts(msg: Message) -> tuple[str, str]:
    plain, html = (p.get_payload(decode=True) for p in msg.walk() if not p.is_multipart())
    assert isinstance(plain, bytes)
    assert isinstance(html, bytes)
    return plain.decode(), html.decode()


def test_the_default_texts_are_the_ones_shipped_in_the_package() -> None:
    msg = rendered()

    assert msg["Subject"] == "Payment received for order ord_1"
    assert parts(msg) == (
        "Hello,\n\nwe received your payment of 100.00 USD for order ord_1.\nThank you!\n",
        "<p>Hello,</p><p>we received your payment of <b>100.00 USD</b> for order"
        " <b>ord_1</b>.</p><p>Thank you!</p>",
    )
    assert set(default_templates()) == {"payment_succeeded", "payment_refunded"}


def test_a_shops_text_renders_by_the_same_rules() -> None:
    msg = rendered({"payment_succeeded": parse_template(SHOP_TEXT)}, order_id="ord_<1>")

    subject = str(make_header(decode_header(msg["Subject"])))
    assert subject == "Danke für Ihre Zahlung (ord_<1>)"
    assert msg["Subject"].startswith("=?utf-8?")  # non-ASCII: an RFC 2047 encoded word
    assert parts(msg) == (
        "Hallo,\n\nwir haben 100.00 USD erhalten. 100 $ Rabatt beim nächsten Mal!\n",
        "<p>Wir haben <b>100.00 USD</b> für ord_&lt;1&gt; erhalten.</p>",  # values escaped
    )
    assert msg["Message-ID"] == "<payment_succeeded.pay_1@shop.example>"


def texts(template: EmailTemplate) -> tuple[str, str, str]:
    return template.subject.template, template.text.template, template.html.template


@pytest.mark.parametrize(
    "values",
    [
        {"order_id": "ord_1\r\nBcc: everyone@example.com"},
        {"order_id": "ord_1\nBcc: everyone@example.com"},
        {"recipient": "buyer@example.com\r\nBcc: everyone@example.com"},
        {"recipient": "büyer@example.com\nBcc: everyone@example.com"},
        {"payment_id": "pay_1\rBcc: everyone@example.com"},
    ],
)
def test_a_line_break_in_a_value_cannot_add_a_header(values: dict[str, str]) -> None:
    """Refused before anything is sent, for good (a PermanentError: straight to the DLQ)."""
    with pytest.raises(UnwritableHeaderError) as refused:
        rendered(None, **values)
    assert isinstance(refused.value, PermanentError)


def test_windows_line_ends_and_surrounding_blank_lines_do_not_matter() -> None:
    source = SHOP_TEXT.replace("\n--- html ---", "\n\n\n--- html ---\n\n").replace("\n", "\r\n")

    assert texts(parse_template(source)) == texts(parse_template(SHOP_TEXT))


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("Payment received\n\nbody\n--- html ---\n<p>x</p>\n", "must start with a line"),
        ("Subject:  \n\nbody\n--- html ---\n<p>x</p>\n", "has an empty subject"),
        ("Subject: s\nbody\n--- html ---\n<p>x</p>\n", "needs an empty line after the subject"),
        ("Subject: s\n\nbody without html\n", "needs exactly one line '--- html ---'"),
        ("Subject: s\n\nb\n--- html ---\nh\n--- html ---\nh\n", "needs exactly one line"),
        ("Subject: s\n\nbody\n--- html ---\n\n", "needs a plain-text body and an HTML body"),
        ("Subject: s\n\n\n--- html ---\n<p>x</p>\n", "needs a plain-text body and an HTML"),
        ("Subject: $name\n\nb\n--- html ---\nh\n", "unknown placeholder $name in its subject"),
        ("Subject: s\n\nb ${total}\n--- html ---\nh\n", "unknown placeholder $total in its text"),
        ("Subject: s\n\nb\n--- html ---\ncosts $5\n", "has a '$' in its html that is no place"),
    ],
)
def test_a_malformed_template_says_what_is_wrong(source: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_template(source)


# --- the bytes on the wire: what a mail reader parses back --------------------------------------


def test_the_bytes_are_crlf_lines_short_enough_for_any_server() -> None:
    long_subject = "Subject: " + "Payment received for order $order_id " * 4
    shop = {"payment_succeeded": parse_template(f"{long_subject}\n\nbody\n--- html ---\n<p/>\n")}
    email = written(shop)

    assert email.data.endswith(b"--\r\n")
    lines = email.data.split(b"\r\n")
    assert all(b"\n" not in line and b"\r" not in line for line in lines)
    assert max(len(line) for line in lines) <= 78
    subject = message_from_bytes(email.data)["Subject"]
    assert " ".join(subject.split()) == ("Payment received for order ord_1 " * 4).strip()


def test_a_display_name_in_another_script_is_encoded_and_the_address_stays_plain() -> None:
    email = written(
        recipient="Jürgen Müller <buyer@example.com>", sender="Магазин <payments@shop.example>"
    )
    msg = message_from_bytes(email.data)

    assert email.data.isascii()
    assert not email.needs_smtputf8
    assert (email.mail_from, email.rcpt_to) == ("payments@shop.example", "buyer@example.com")
    for name, display, address in [
        ("From", "Магазин", "payments@shop.example"),
        ("To", "Jürgen Müller", "buyer@example.com"),
    ]:
        assert msg[name].endswith(f"<{address}>")
        assert str(make_header(decode_header(msg[name]))) == f"{display} <{address}>"


def test_an_address_in_another_script_asks_the_server_for_smtputf8() -> None:
    email = written(template="payment_refunded", recipient="käufer@beispiel.de")

    assert email.needs_smtputf8
    assert email.rcpt_to == "käufer@beispiel.de"
    assert "To: käufer@beispiel.de\r\n".encode() in email.data  # RFC 6532: as it is
