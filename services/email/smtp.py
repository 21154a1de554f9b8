"""One SMTP client connection (RFC 5321) that pipelines (RFC 2920) where the server offers
PIPELINING: MAIL, RCPT and DATA written together, and each email's content written together with
the next email's MAIL, RCPT and DATA (the content may begin a group), so n emails on a connection
take n + 1 round trips.

aiosmtplib, which this replaces, waits for each command's reply: four round trips per email,
whose socket writes and reads were 46 % of the email worker's CPU (bench.workers, py-spy), and
four times the server's round-trip time per email on a connection to a distant relay. A server
without PIPELINING gets the commands one at a time. TLS is the ssl module's, through asyncio
(implicit TLS, or STARTTLS with `StreamWriter.start_tls`), the certificate always verified."""

from __future__ import annotations

import asyncio
import base64
import functools
import re
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

_LINE_END = re.compile(rb"\r\n|\r|\n")
_LEADING_DOT = re.compile(rb"^\.", re.MULTILINE)
_MAX_REPLY_LINES = 100


class SmtpError(Exception):
    """The server refused a command, broke the protocol, or went away."""


class SmtpReplyError(SmtpError):
    def __init__(self, command: str, code: int, text: str) -> None:
        super().__init__(f"{command}: {code} {text}")
        self.command = command
        self.code = code
        self.text = text

    @property
    def about_the_email(self) -> bool:
        """A refusal of one email's transaction (MAIL, RCPT, DATA, its content), not of the
        session (greeting, EHLO, STARTTLS, AUTH, RSET)."""
        return self.command in TRANSACTION_COMMANDS


class SmtpEnvelopeError(SmtpError):
    """This email cannot go to this server as it is (an address that needs SMTPUTF8)."""


class SmtpLoginRefusedError(SmtpReplyError):
    """AUTH refused (the credentials; never part of the message)."""


class SmtpDisconnectedError(SmtpError):
    """The server closed the connection (an idle one, typically)."""


@dataclass(frozen=True, slots=True)
class Reply:
    code: int
    text: str


@dataclass(frozen=True, slots=True)
class Transaction:
    """One email's envelope and content (CRLF lines; dot-stuffed when sent)."""

    mail_from: str
    rcpt_to: str
    data: bytes
    smtputf8: bool = False


# The commands of one email's transaction, as SmtpReplyError names them.
TRANSACTION_COMMANDS = frozenset({"MAIL FROM", "RCPT TO", "DATA", "DATA content"})

# The envelope's commands and the replies that let a transaction go on.
_ENVELOPE: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("MAIL FROM", (250,)),
    ("RCPT TO", (250, 251)),
    ("DATA", (354,)),
)


def _refusal(command: str, reply: Reply, codes: tuple[int, ...]) -> SmtpReplyError | None:
    return None if reply.code in codes else SmtpReplyError(command, reply.code, reply.text)


@functools.cache
def _local_hostname() -> str:
    """What EHLO names: this host's fully qualified name, looked up once per process."""
    return socket.getfqdn()


class SmtpConnection:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: str,
        ssl_context: ssl.SSLContext | None,
        username: str | None,
        password: str | None,
        timeout_s: float,
    ) -> None:
        """`tls`: none, starttls (required: no STARTTLS offered is an error) or implicit;
        `ssl_context` is required unless `tls` is none. Credentials go out only after TLS."""
        if tls != "none" and ssl_context is None:
            raise ValueError("TLS needs an SSL context")
        if password is not None and tls == "none":
            raise ValueError("SMTP credentials are never sent without TLS")
        self._host = host
        self._port = port
        self._tls = tls
        self._ssl_context = ssl_context
        self._username = username
        self._password = password
        self._timeout_s = timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._extensions: dict[str, str] = {}

    @property
    def is_connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self) -> None:
        """Greeting, EHLO, STARTTLS and EHLO again (starttls), AUTH (with credentials)."""
        self.close()
        async with asyncio.timeout(self._timeout_s):
            implicit = self._tls == "implicit"
            self._reader, self._writer = await asyncio.open_connection(
                self._host,
                self._port,
                ssl=self._ssl_context if implicit else None,
                server_hostname=self._host if implicit else None,
            )
            self._expect("connect", await self._reply(), (220,))
            # getfqdn may ask DNS: off the event loop, once per process.
            name = await asyncio.to_thread(_local_hostname)
            await self._hello(name)
            if self._tls == "starttls":
                if "STARTTLS" not in self._extensions:
                    raise SmtpError("the server does not offer STARTTLS, which SMTP_TLS requires")
                self._expect("STARTTLS", await self._command("STARTTLS"), (220,))
                # Bytes already read past the 220 came in plain text: read after the upgrade,
                # they would pass for the server's (an injected EHLO reply, say).
                if getattr(self._reader, "_buffer", b""):
                    raise SmtpError("the server sent more after its STARTTLS reply")
                assert self._ssl_context is not None  # the constructor's check
                await self._writer.start_tls(self._ssl_context, server_hostname=self._host)
                await self._hello(name)
            if self._username is not None and self._password is not None:
                await self._login(self._username, self._password)

    async def send(self, mail_from: str, rcpt_to: str, data: bytes, *, smtputf8: bool) -> None:
        """One transaction: MAIL FROM, RCPT TO, DATA and `data` (CRLF lines, dot-stuffed
        here); returns once the server accepted it (250), raises SmtpError otherwise."""
        [error] = await self.send_many([Transaction(mail_from, rcpt_to, data, smtputf8)])
        if error is not None:
            raise error

    async def send_many(self, transactions: Sequence[Transaction]) -> list[Exception | None]:
        """The transactions one after the other; per transaction None once the server
        accepted it (250 after its content), else why not: a refusal, or a bad envelope
        (ValueError, SmtpError) that fails it alone. A failure of the connection itself (it
        closed, no reply within the timeout, a broken reply) fails the transaction in
        progress and every later one, and closes the connection."""
        results: list[Exception | None] = [None] * len(transactions)
        envelopes: list[tuple[int, bytes]] = []  # (index, MAIL RCPT DATA lines) of the valid
        for index, transaction in enumerate(transactions):
            try:
                envelopes.append((index, self._envelope(transaction)))
            except (ValueError, SmtpError) as e:
                results[index] = e
        done = 0
        try:
            if "PIPELINING" in self._extensions:
                if envelopes:
                    self._write_bytes(envelopes[0][1])
                reset = False  # an RSET went out before the envelope now answered
                for n, (index, _) in enumerate(envelopes):
                    next_envelope = envelopes[n + 1][1] if n + 1 < len(envelopes) else b""
                    async with asyncio.timeout(self._timeout_s):
                        if reset:
                            await self._reset_reply()
                        refusal = await self._envelope_replies()
                    reset = refusal is not None
                    if refusal is not None:
                        # A refused MAIL or RCPT leaves the transaction half open: RSET.
                        results[index] = refusal
                        self._write_bytes(b"RSET\r\n" + next_envelope)
                        if not next_envelope:
                            async with asyncio.timeout(self._timeout_s):
                                await self._reset_reply()
                    else:
                        self._write_bytes(_content(transactions[index].data) + next_envelope)
                        async with asyncio.timeout(self._timeout_s):
                            results[index] = _refusal("DATA content", await self._reply(), (250,))
                    done = n + 1
            else:
                for n, (index, _) in enumerate(envelopes):
                    async with asyncio.timeout(self._timeout_s):
                        results[index] = await self._one_at_a_time(transactions[index])
                    done = n + 1
        except (TimeoutError, OSError, SmtpError) as e:
            self.close()
            for index, _ in envelopes[done:]:
                results[index] = e
        return results

    def _envelope(self, transaction: Transaction) -> bytes:
        for address in (transaction.mail_from, transaction.rcpt_to):
            if any(c in address for c in "\r\n\x00<>"):
                raise ValueError(f"an envelope address can't hold {address!r}")
        if transaction.smtputf8 and "SMTPUTF8" not in self._extensions:
            raise SmtpEnvelopeError("the server does not offer SMTPUTF8, which this address needs")
        options = " SMTPUTF8" if transaction.smtputf8 else ""
        return (
            f"MAIL FROM:<{transaction.mail_from}>{options}\r\n"
            f"RCPT TO:<{transaction.rcpt_to}>\r\nDATA\r\n"
        ).encode()

    async def _envelope_replies(self) -> SmtpReplyError | None:
        """The replies to a pipelined MAIL, RCPT and DATA: None when the server waits for the
        content (354), else the first refusal (the server is back to taking commands)."""
        replies = [await self._reply() for _ in _ENVELOPE]
        refusals = [
            refusal
            for (command, codes), reply in zip(_ENVELOPE, replies, strict=True)
            if (refusal := _refusal(command, reply, codes)) is not None
        ]
        if refusals and replies[-1].code == 354:
            # DATA taken although MAIL or RCPT was not: no content can follow safely.
            raise SmtpError(f"the server took DATA after refusing: {refusals[0]}")
        return refusals[0] if refusals else None

    async def _reset_reply(self) -> None:
        if (refusal := _refusal("RSET", await self._reply(), (250,))) is not None:
            raise SmtpError(f"the transaction could not be reset: {refusal}")

    async def _one_at_a_time(self, transaction: Transaction) -> SmtpReplyError | None:
        """A transaction with a server without PIPELINING: each command waits for its reply."""
        lines = self._envelope(transaction).decode().split("\r\n")
        for line, (command, codes) in zip(lines, _ENVELOPE, strict=False):
            if (refusal := _refusal(command, await self._command(line), codes)) is not None:
                self._write_bytes(b"RSET\r\n")
                await self._reset_reply()
                return refusal
        self._write_bytes(_content(transaction.data))
        return _refusal("DATA content", await self._reply(), (250,))

    async def quit(self) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._command("QUIT")
        finally:
            self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
        self._extensions = {}

    async def _hello(self, name: str) -> None:
        reply = await self._command(f"EHLO {name}")
        if reply.code != 250:  # an old server: plain HELO, no extensions
            self._expect("HELO", await self._command(f"HELO {name}"), (250,))
            self._extensions = {}
            return
        # The first line is the server's name; each further one an extension and its
        # parameters (AUTH's mechanisms).
        extensions = {}
        for line in reply.text.split("\n")[1:]:
            keyword, _, parameters = line.strip().partition(" ")
            extensions[keyword.upper()] = parameters.upper()
        self._extensions = extensions

    async def _login(self, username: str, password: str) -> None:
        mechanisms = self._extensions.get("AUTH", "").split()
        if "PLAIN" in mechanisms:
            token = _b64(f"\0{username}\0{password}")
            reply = await self._command(f"AUTH PLAIN {token}")
        elif "LOGIN" in mechanisms:
            reply = await self._command("AUTH LOGIN")
            if reply.code == 334:
                reply = await self._command(_b64(username))
            if reply.code == 334:
                reply = await self._command(_b64(password))
        else:
            raise SmtpError(f"the server offers no AUTH mechanism this client speaks: {mechanisms}")
        if reply.code != 235:
            raise SmtpLoginRefusedError("AUTH", reply.code, reply.text)

    async def _command(self, line: str) -> Reply:
        self._write(line + "\r\n")
        return await self._reply()

    def _write(self, text: str) -> None:
        self._write_bytes(text.encode())

    def _write_bytes(self, data: bytes) -> None:
        if self._writer is None or self._writer.is_closing():
            raise SmtpDisconnectedError("not connected")
        self._writer.write(data)

    async def _reply(self) -> Reply:
        """One reply, all its lines ("250-..." continues, "250 ..." ends)."""
        if self._reader is None:
            raise SmtpDisconnectedError("not connected")
        texts: list[str] = []
        for _ in range(_MAX_REPLY_LINES):
            try:
                line = await self._reader.readline()
            except ValueError as e:  # longer than the reader's limit
                raise SmtpError(f"a reply line too long: {e}") from None
            if not line.endswith(b"\n"):
                raise SmtpDisconnectedError("the server closed the connection")
            if len(line) < 4 or not line[:3].isdigit() or line[3:4] not in b" -\r\n":
                raise SmtpError(f"a malformed reply line: {line[:80]!r}")
            texts.append(line[4:].strip().decode("utf-8", "replace"))
            if line[3:4] != b"-":
                return Reply(int(line[:3]), "\n".join(texts))
        raise SmtpError(f"a reply of more than {_MAX_REPLY_LINES} lines")

    @staticmethod
    def _expect(command: str, reply: Reply, codes: tuple[int, ...]) -> None:
        if reply.code not in codes:
            raise SmtpReplyError(command, reply.code, reply.text)


def _content(data: bytes) -> bytes:
    """The DATA content as sent: CRLF line ends, a line starting with "." doubled, the
    terminating line."""
    data = _LEADING_DOT.sub(b"..", _LINE_END.sub(b"\r\n", data))
    if data and not data.endswith(b"\r\n"):
        data += b"\r\n"
    return data + b".\r\n"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")
