"""Sending mail: a Sender protocol and its SMTP adapter, which keeps a few connections open
and reuses them (a connection per message costs more than the message), each one upgraded to
TLS and logged in once when SMTP_TLS and credentials say so (services/email/smtp.py)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Protocol

from services.email.smtp import (
    SmtpConnection,
    SmtpDisconnectedError,
    SmtpError,
    SmtpLoginRefusedError,
)
from services.email.templates import OutgoingEmail
from shared.config import Settings
from shared.config_values import SMTP_TLS_MODES
from shared.errors import TransientError

SMTP_TIMEOUT_S = 10.0


class Sender(Protocol):
    async def send(self, email: OutgoingEmail) -> None: ...


class SmtpUnavailableError(TransientError):
    """The SMTP server refused, failed or timed out: retry on the ladder."""


class SmtpLoginError(SmtpUnavailableError):
    """The server refused SMTP_USERNAME / SMTP_PASSWORD: retried too, so that emails wait
    (then dead-letter) rather than get lost while the credentials are being fixed."""


class SmtpSender:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        username: str | None = None,
        password: str | None = None,
        tls: str = "none",
        ca_file: str | None = None,
        connections: int = 8,
        timeout_s: float = SMTP_TIMEOUT_S,
    ) -> None:
        """`tls`: none (plain), starttls (upgrade on connect, required) or implicit (TLS from
        the first byte); the server's certificate is always verified, against `ca_file`'s
        CAs too when given. `connections`: each opened at its first send, then kept; each
        email waits for its replies (two round trips where the server offers PIPELINING, four
        where not), so the worker's two batches of up to 32 go out over eight (bench.workers:
        480-536 payments/s against 384-462 with four, the email worker the last stage)."""
        if tls not in SMTP_TLS_MODES:
            raise ValueError(f"tls must be one of {', '.join(SMTP_TLS_MODES)}")
        if password is not None and tls == "none":
            raise ValueError("SMTP credentials are never sent without TLS")
        self._host = host
        self._port = port
        self._timeout_s = timeout_s
        context = None
        if tls != "none":
            # The system's CAs, and ca_file's; the host name checked.
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
            if ca_file is not None:
                context.load_verify_locations(cafile=ca_file)
        self._idle: asyncio.Queue[SmtpConnection] = asyncio.Queue()
        for _ in range(connections):
            self._idle.put_nowait(
                SmtpConnection(
                    host,
                    port,
                    tls=tls,
                    ssl_context=context,
                    username=username,
                    password=password,
                    timeout_s=timeout_s,
                )
            )

    @classmethod
    def from_settings(cls, settings: Settings) -> SmtpSender:
        return cls(
            settings.smtp_host,
            settings.smtp_port,
            username=settings.smtp_username,
            password=settings.smtp_password,
            tls=settings.smtp_tls,
            ca_file=settings.smtp_ca_file,
        )

    async def send(self, email: OutgoingEmail) -> None:
        """One SMTP transaction: MAIL FROM, RCPT TO, DATA with the email's bytes as they are."""
        client = await self._idle.get()
        try:
            try:
                if not client.is_connected:
                    await client.connect()  # and STARTTLS, login: once per connection
                    await _transact(client, email)
                else:
                    try:
                        await _transact(client, email)
                    except SmtpDisconnectedError:
                        # The server closed a connection that sat idle: one fresh attempt.
                        await client.connect()
                        await _transact(client, email)
            except SmtpLoginRefusedError as e:
                raise SmtpLoginError(
                    f"SMTP {self._host}:{self._port} refused the login ({e.code} {e.text}):"
                    " check SMTP_USERNAME and SMTP_PASSWORD"
                ) from e
            except TimeoutError as e:
                raise SmtpUnavailableError(
                    f"SMTP {self._host}:{self._port}: no answer within {self._timeout_s:g} s"
                ) from e
            except (SmtpError, OSError) as e:
                raise SmtpUnavailableError(f"SMTP {self._host}:{self._port}: {e}") from e
        except BaseException:
            # A failed session may be half-way through a transaction: start the next afresh.
            client.close()
            raise
        finally:
            self._idle.put_nowait(client)

    async def close(self) -> None:
        while not self._idle.empty():
            client = self._idle.get_nowait()
            if client.is_connected:
                with contextlib.suppress(Exception):
                    await client.quit()


async def _transact(client: SmtpConnection, email: OutgoingEmail) -> None:
    await client.send(email.mail_from, email.rcpt_to, email.data, smtputf8=email.needs_smtputf8)
