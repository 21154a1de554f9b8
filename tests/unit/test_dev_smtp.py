"""The development SMTP sink prints a mail's text decoded, not its base64."""

from __future__ import annotations

from email.message import EmailMessage

from services.cli.dev_smtp import readable


def test_a_base64_mail_is_printed_as_its_text() -> None:
    message = EmailMessage()
    message["From"] = "payments@shop.test"
    message["To"] = "buyer@example.com"
    message["Subject"] = "Payment received"
    message["X-Payhooks-Template"] = "payment_succeeded"
    message.set_content("Thank you: 100.00 USD received, 500 points added. Grüße", cte="base64")
    wire = message.as_bytes()
    assert b"Thank you" not in wire  # what the old sink printed: base64

    shown = readable(wire, ["buyer@example.com"])

    assert "Thank you: 100.00 USD received, 500 points added. Grüße" in shown
    assert "Subject: Payment received" in shown
    assert "X-Payhooks-Template: payment_succeeded" in shown
    assert "mail to buyer@example.com" in shown
