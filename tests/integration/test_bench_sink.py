"""bench.workers' lean SMTP sink takes mail from the email worker's sender, pipelined, and
notes each Message-ID once, also when several messages share one connection."""

from __future__ import annotations

import asyncio
import io

from bench.smtp_sink import _LeanSmtp, _Recorder
from services.email.sender import SmtpSender
from services.email.templates import OutgoingEmail


def _email(message_id: str, body: str) -> OutgoingEmail:
    data = (
        "From: payhooks@example.test\r\nTo: customer@example.test\r\n"
        f"Subject: Payment received\r\nMessage-ID: {message_id}\r\n\r\n{body}\r\n"
    ).encode()
    return OutgoingEmail(message_id, "payhooks@example.test", "customer@example.test", data)


async def test_the_lean_sink_records_every_message_id_sent_over_one_connection() -> None:
    out = io.StringIO()
    recorder = _Recorder(out)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _LeanSmtp(recorder), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    smtp = SmtpSender("127.0.0.1", port, connections=1)
    try:
        await smtp.send(_email("<payment_succeeded.pay_1@example.test>", "one"))
        # A line of just "." in the body is dot-stuffed by the client: not the end.
        await smtp.send(_email("<payment_refunded.pay_1@example.test>", "a\r\n.\r\nb"))
        await smtp.send(_email("<payment_succeeded.pay_2@example.test>", "three"))
    finally:
        await smtp.close()
        server.close()
        await server.wait_closed()
    recorder.flush()

    ids = [line.split()[0] for line in out.getvalue().splitlines()]
    assert ids == [
        "<payment_succeeded.pay_1@example.test>",
        "<payment_refunded.pay_1@example.test>",
        "<payment_succeeded.pay_2@example.test>",
    ]
