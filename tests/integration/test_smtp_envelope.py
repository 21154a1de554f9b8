"""What the SMTP server receives from the sender: the envelope the email names and its bytes
as written, whether the server offers PIPELINING or not, and SMTPUTF8 asked for an address in
another script. Real aiosmtpd."""

from __future__ import annotations

import contextlib
import email
import email.policy
from collections.abc import Iterator
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from bench.processes import free_port
from services.email.sender import SmtpRejectedError, SmtpSender
from services.email.templates import OutgoingEmail, render
from shared.vocabulary import SUCCEEDED_EMAIL


class Envelopes:
    def __init__(self) -> None:
        self.received: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.received.append(envelope)
        return "250 Message accepted for delivery"


class PipeliningEnvelopes(Envelopes):
    """The same, its EHLO offering PIPELINING (aiosmtpd reads commands in order either way)."""

    async def handle_EHLO(
        self, server: Any, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        session.host_name = hostname  # what aiosmtpd does itself without this hook
        return [*responses[:-1], "250-PIPELINING", responses[-1]]


@contextlib.contextmanager
def smtp_server(handler: Envelopes, *, smtputf8: bool) -> Iterator[int]:
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port, enable_SMTPUTF8=smtputf8)
    controller.start()
    try:
        yield port
    finally:
        controller.stop()


def outgoing(recipient: str) -> OutgoingEmail:
    return render(
        SUCCEEDED_EMAIL,
        payment_id="pay_env",
        order_id="ord_env",
        amount="100.00",
        currency="USD",
        recipient=recipient,
        sender="Shop <payments@shop.example>",
    )


@pytest.mark.parametrize("handler_class", [Envelopes, PipeliningEnvelopes])
@pytest.mark.parametrize("recipient", ["buyer@example.test", "käufer@beispiel.test"])
async def test_the_server_gets_the_envelope_and_the_bytes_as_written(
    recipient: str, handler_class: type[Envelopes]
) -> None:
    handler = handler_class()
    sent = outgoing(recipient)
    with smtp_server(handler, smtputf8=True) as port:
        smtp = SmtpSender("127.0.0.1", port, connections=1)
        try:
            await smtp.send(sent)
        finally:
            await smtp.close()

    [envelope] = handler.received
    assert envelope.mail_from == "payments@shop.example"
    assert envelope.rcpt_tos == [recipient]
    assert ("SMTPUTF8" in envelope.mail_options) == (not recipient.isascii())
    assert envelope.original_content.replace(b"\r\n", b"\n") == sent.data.replace(b"\r\n", b"\n")
    parsed = email.message_from_bytes(envelope.original_content, policy=email.policy.SMTPUTF8)
    assert parsed["To"] == recipient


async def test_an_address_in_another_script_to_a_server_without_smtputf8_is_retried() -> None:
    handler = Envelopes()
    with smtp_server(handler, smtputf8=False) as port:
        smtp = SmtpSender("127.0.0.1", port, connections=1)
        try:
            # That email's failure, not the relay's outage: retried on its ladder, then the DLQ.
            with pytest.raises(SmtpRejectedError):
                await smtp.send(outgoing("käufer@beispiel.test"))
        finally:
            await smtp.close()

    assert handler.received == []
