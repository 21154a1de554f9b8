"""One SMTP client connection (RFC 5321) that sends an email in two round trips where the server
offers PIPELINING (RFC 2920): MAIL, RCPT and DATA written together, then the content.

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
from dataclasses import dataclass

_LINE_END = re.compile(rb"\r\n|\r|\n")
_LEADING_DOT = re.compile(rb"^\.", re.MULTILINE)
_MAX_REPLY_LINES = 100


class SmtpError(Exception):
    """The server refused a command, broke the protocol, or went away."""


class SmtpReplyError(SmtpError):
    def __init__(self, command: str, code: int, text: str) -> None:
        super().__init__(f"{command}: {code} {text}")
        self.code = code
        self.text = text


class SmtpLoginRefusedError(SmtpReplyError):
    """AUTH refused (the credentials; never part of the message)."""


class SmtpDisconnectedError(SmtpError):
    """The server closed the connection (an idle one, typically)."""


@dataclass(frozen=True, slots=True)
class Reply:
    code: int
    text: str


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
        for address in (mail_from, rcpt_to):
            if any(c in address for c in "\r\n\x00<>"):
                raise ValueError(f"an envelope address can't hold {address!r}")
        if smtputf8 and "SMTPUTF8" not in self._extensions:
            raise SmtpError("the server does not offer SMTPUTF8, which this address needs")
        options = " SMTPUTF8" if smtputf8 else ""
        commands = [f"MAIL FROM:<{mail_from}>{options}", f"RCPT TO:<{rcpt_to}>", "DATA"]
        expected: tuple[tuple[int, ...], ...] = ((250,), (250, 251), (354,))
        async with asyncio.timeout(self._timeout_s):
            if "PIPELINING" in self._extensions:
                self._write("".join(f"{c}\r\n" for c in commands))
                replies = [await self._reply() for _ in commands]
                for command, reply, codes in zip(commands, replies, expected, strict=True):
                    self._expect(command.split(":")[0], reply, codes)
            else:
                for command, codes in zip(commands, expected, strict=True):
                    self._expect(command.split(":")[0], await self._command(command), codes)
            self._write_bytes(_content(data))
            self._expect("DATA content", await self._reply(), (250,))

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
