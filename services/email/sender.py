"""Sending mail: a Sender protocol and its SMTP adapter (aiosmtplib)."""

from __future__ import annotations

from email.message import EmailMessage
from typing import Protocol

import aiosmtplib

from shared.errors import TransientError

SMTP_TIMEOUT_S = 10.0


class Sender(Protocol):
    async def send(self, message: EmailMessage) -> None: ...


class SmtpUnavailableError(TransientError):
    """The SMTP server refused, failed or timed out: retry on the ladder."""


class SmtpSender:
    def __init__(self, host: str, port: int, *, timeout_s: float = SMTP_TIMEOUT_S) -> None:
        self._host = host
        self._port = port
        self._timeout_s = timeout_s

    async def send(self, message: EmailMessage) -> None:
        try:
            await aiosmtplib.send(
                message, hostname=self._host, port=self._port, timeout=self._timeout_s
            )
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as e:
            raise SmtpUnavailableError(f"SMTP {self._host}:{self._port}: {e}") from e
