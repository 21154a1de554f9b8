"""The development SMTP sink of `payhooks run all` (when nothing listens on SMTP_PORT here):
every mail printed as a person reads it, its headers and its text decoded, not as the wire
carries it (base64). aiosmtpd runs it: `python -m aiosmtpd -c services.cli.dev_smtp.Printer`."""

from __future__ import annotations

from email import message_from_bytes, policy
from typing import Any

SHOWN_HEADERS = ("From", "To", "Subject", "Message-ID", "X-Payhooks-Template")


def readable(content: bytes, recipients: list[str]) -> str:
    """One mail as the sink prints it."""
    message = message_from_bytes(content, policy=policy.default)
    lines = [f"---------- mail to {', '.join(recipients)}"]
    lines += [f"{name}: {message[name]}" for name in SHOWN_HEADERS if message[name]]
    body = message.get_body(preferencelist=("plain", "html"))
    lines += ["", body.get_content().rstrip() if body is not None else "(no text)", "-" * 10]
    return "\n".join(lines)


class Printer:
    """An aiosmtpd handler: prints each mail and accepts it."""

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        print(readable(envelope.content, list(envelope.rcpt_tos)), flush=True)
        return "250 OK"
