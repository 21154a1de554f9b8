"""bench.workers' lean SMTP sink takes mail from aiosmtplib (what the email worker sends with)
and notes each Message-ID once, also when several messages share one connection."""

from __future__ import annotations

import asyncio
import io
from email.message import EmailMessage

import aiosmtplib

from bench.smtp_sink import _LeanSmtp, _Recorder


def _email(message_id: str, body: str) -> EmailMessage:
    message = EmailMessage()
    message["From"] = "payhooks@example.test"
    message["To"] = "customer@example.test"
    message["Subject"] = "Payment received"
    message["Message-ID"] = message_id
    message.set_content(body)
    return message


async def test_the_lean_sink_records_every_message_id_sent_over_one_connection() -> None:
    out = io.StringIO()
    recorder = _Recorder(out)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _LeanSmtp(recorder), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with aiosmtplib.SMTP(hostname="127.0.0.1", port=port, start_tls=False) as smtp:
            await smtp.send_message(_email("<payment_succeeded.pay_1@example.test>", "one"))
            # A line of just "." in the body is dot-stuffed by the client: not the end.
            await smtp.send_message(_email("<payment_refunded.pay_1@example.test>", "a\n.\nb"))
            await smtp.send_message(_email("<payment_succeeded.pay_2@example.test>", "three"))
    finally:
        server.close()
        await server.wait_closed()
    recorder.flush()

    ids = [line.split()[0] for line in out.getvalue().splitlines()]
    assert ids == [
        "<payment_succeeded.pay_1@example.test>",
        "<payment_refunded.pay_1@example.test>",
        "<payment_succeeded.pay_2@example.test>",
    ]
