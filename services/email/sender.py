"""Sending mail: a Sender protocol and its SMTP adapter, which keeps a few connections open
and reuses them (a connection per message costs more than the message), each one upgraded to
TLS and logged in once when SMTP_TLS and credentials say so (services/email/smtp.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections.abc import Sequence
from typing import Protocol

from services.email.smtp import (
    SmtpConnection,
    SmtpDisconnectedError,
    SmtpEnvelopeError,
    SmtpError,
    SmtpLoginRefusedError,
    SmtpReplyError,
    Transaction,
)
from services.email.templates import OutgoingEmail
from shared import tracing
from shared.config import Settings
from shared.config_values import SMTP_TLS_MODES
from shared.errors import Dependency, TransientError

SMTP_TIMEOUT_S = 10.0

# Replies that refuse the session whatever command they answer (RFC 4954: authentication
# required, too weak, credentials invalid, encryption required): our configuration, not the
# email; every email would get them.
_SESSION_REFUSALS = frozenset({530, 534, 535, 538})


class Sender(Protocol):
    async def send_many(self, emails: Sequence[OutgoingEmail]) -> list[Exception | None]: ...


class SmtpUnavailableError(TransientError):
    """The SMTP server cannot be reached, failed, timed out or said "try later" (4xx): an
    outage of the relay, not the email's fault. The email worker waits for it (no attempt
    of the message counted), however long it lasts."""

    dependency = Dependency.SMTP


class SmtpLoginError(SmtpUnavailableError):
    """The server refused SMTP_USERNAME / SMTP_PASSWORD: the emails wait (the worker paused,
    /readyz and the log saying why) while the credentials are being fixed."""


class SmtpRejectedError(TransientError):
    """The server refused this one email for good (a 5xx to its MAIL, RCPT or DATA: a
    rejected address, say): that email's failure, retried on its ladder, then dead-lettered."""


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
        CAs too when given. `connections`: each opened at its first send, then kept; a batch
        of emails is shared out over them, pipelined on each where the server offers
        PIPELINING (n emails in n + 1 round trips), one command at a time where not (eight
        rather than four: docs/performance.md)."""
        if tls not in SMTP_TLS_MODES:
            raise ValueError(f"tls must be one of {', '.join(SMTP_TLS_MODES)}")
        if password is not None and tls == "none":
            raise ValueError("SMTP credentials are never sent without TLS")
        self._host = host
        self._port = port
        self._timeout_s = timeout_s
        self._connections = connections
        context = None
        if tls != "none":
            # The system's CAs, and ca_file's; the host name checked.
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
            if ca_file is not None:
                context.load_verify_locations(cafile=ca_file)
        self._new_connection = functools.partial(
            SmtpConnection,
            host,
            port,
            tls=tls,
            ssl_context=context,
            username=username,
            password=password,
            timeout_s=timeout_s,
        )
        self._idle: asyncio.Queue[SmtpConnection] = asyncio.Queue()
        for _ in range(connections):
            self._idle.put_nowait(self._new_connection())

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
        [error] = await self.send_many([email])
        if error is not None:
            raise error

    async def send_many(self, emails: Sequence[OutgoingEmail]) -> list[Exception | None]:
        """One SMTP transaction per email, the emails shared out over the connections in
        order (contiguous runs, each pipelined on its connection); per email None once the
        server accepted it, else why not: SmtpUnavailableError while the server is away or
        says "later", SmtpRejectedError when it refused that email."""
        if not emails:
            return []
        shares = min(len(emails), self._connections)
        size, extra = divmod(len(emails), shares)
        runs: list[Sequence[OutgoingEmail]] = []
        start = 0
        for i in range(shares):
            end = start + size + (i < extra)
            runs.append(emails[start:end])
            start = end
        # A span of its own while tracing is on (the batch's child): the SMTP conversation,
        # up to the server's acceptance. Only counts: no address (shared/tracing.py).
        with tracing.StepSpan("smtp send", **{"payhooks.emails": len(emails)}):
            results = await asyncio.gather(*(self._send_run(run) for run in runs))
        return [error for run in results for error in run]

    async def _send_run(self, emails: Sequence[OutgoingEmail]) -> list[Exception | None]:
        client = await self._idle.get()
        try:
            transactions = [
                Transaction(e.mail_from, e.rcpt_to, e.data, e.needs_smtputf8) for e in emails
            ]
            try:
                if not client.is_connected:
                    await client.connect()  # and STARTTLS, login: once per connection
                    results = await client.send_many(transactions)
                else:
                    results = await client.send_many(transactions)
                    if isinstance(results[0], SmtpDisconnectedError):
                        # The server closed a connection that sat idle: one fresh attempt.
                        await client.connect()
                        results = await client.send_many(transactions)
            except BaseException as e:
                # A failed session may be half-way through a transaction: start afresh.
                client.close()
                if not isinstance(e, Exception):
                    raise
                results = [e] * len(emails)
            return [self._unavailable(error) for error in results]
        finally:
            self._idle.put_nowait(client)

    async def probe(self) -> None:
        """Raises unless the server takes a session (greeting, EHLO, STARTTLS and login as
        configured): what the paused email worker asks before it sends again."""
        client = self._new_connection()
        try:
            await client.connect()
        except Exception as e:
            client.close()
            raise (self._unavailable(e) or e) from e
        with contextlib.suppress(Exception):
            await client.quit()

    def _unavailable(self, error: Exception | None) -> Exception | None:
        """An SMTP failure as the worker treats it: the relay's outage (SmtpUnavailableError),
        or this email refused (SmtpRejectedError); a bad envelope (ValueError) as it is."""
        where = f"SMTP {self._host}:{self._port}"
        if isinstance(error, SmtpEnvelopeError) or (
            isinstance(error, SmtpReplyError)
            and error.about_the_email
            and error.code >= 500
            and error.code not in _SESSION_REFUSALS
        ):
            rejected = SmtpRejectedError(f"{where}: {error}")
            rejected.__cause__ = error
            return rejected
        if isinstance(error, SmtpLoginRefusedError):
            login = SmtpLoginError(
                f"{where} refused the login ({error.code} {error.text}):"
                " check SMTP_USERNAME and SMTP_PASSWORD"
            )
            login.__cause__ = error
            return login
        if isinstance(error, TimeoutError):
            timeout = SmtpUnavailableError(f"{where}: no answer within {self._timeout_s:g} s")
            timeout.__cause__ = error
            return timeout
        if isinstance(error, SmtpError | OSError):
            unavailable = SmtpUnavailableError(f"{where}: {error}")
            unavailable.__cause__ = error
            return unavailable
        return error

    async def close(self) -> None:
        while not self._idle.empty():
            client = self._idle.get_nowait()
            if client.is_connected:
                with contextlib.suppress(Exception):
                    await client.quit()
