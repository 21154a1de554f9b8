"""Sending mail: a Sender protocol and its SMTP adapter (aiosmtplib), which keeps a few
connections open and reuses them (a connection per message costs more than the message)."""

from __future__ import annotations

import asyncio
import contextlib
from email.message import Message
from typing import Protocol

import aiosmtplib

from shared.errors import TransientError

SMTP_TIMEOUT_S = 10.0


class Sender(Protocol):
    async def send(self, message: Message) -> None: ...


class SmtpUnavailableError(TransientError):
    """The SMTP server refused, failed or timed out: retry on the ladder."""


class SmtpSender:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        connections: int = 4,
        timeout_s: float = SMTP_TIMEOUT_S,
    ) -> None:
        self._host = host
        self._port = port
        self._timeout_s = timeout_s
        self._idle: asyncio.Queue[aiosmtplib.SMTP] = asyncio.Queue()
        for _ in range(connections):
            self._idle.put_nowait(
                aiosmtplib.SMTP(hostname=host, port=port, timeout=timeout_s, start_tls=False)
            )

    async def send(self, message: Message) -> None:
        client = await self._idle.get()
        try:
            try:
                if not client.is_connected:
                    await client.connect()
                await client.send_message(message)
            except aiosmtplib.SMTPServerDisconnected:
                # The server closed a connection that sat idle: one fresh attempt.
                client.close()
                await client.connect()
                await client.send_message(message)
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as e:
            # A failed session may be half-way through a transaction: start the next afresh.
            with contextlib.suppress(Exception):
                client.close()
            raise SmtpUnavailableError(f"SMTP {self._host}:{self._port}: {e}") from e
        finally:
            self._idle.put_nowait(client)

    async def close(self) -> None:
        while not self._idle.empty():
            client = self._idle.get_nowait()
            if client.is_connected:
                with contextlib.suppress(Exception):
                    await client.quit()
