"""The sender's side of the SMTP conversation: MAIL, RCPT and DATA pipelined (RFC 2920) to a
server that offers PIPELINING, and only to such a server; the content dot-stuffed with CRLF
line ends; nothing read past a STARTTLS reply taken for the server's. Real sockets, a small
scripted SMTP server that notes what each read brought."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from services.email.sender import SmtpRejectedError, SmtpSender, SmtpUnavailableError
from services.email.smtp import _content
from services.email.templates import OutgoingEmail


class Scripted(asyncio.Protocol):
    """Answers EHLO (offering PIPELINING or not), MAIL, RCPT, DATA, the content and QUIT.
    `hold_until_data`: no reply to MAIL or RCPT until DATA has arrived too, as only a
    pipelining client lets happen."""

    def __init__(self, server: ScriptedServer) -> None:
        self._server = server
        self._buffer = b""
        self._in_data = False
        self._held: list[bytes] = []
        self._rcpt_refused = False
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport
        transport.write(b"220 scripted ESMTP\r\n")  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        commands_in_this_read = 0
        self._buffer += data
        while True:
            if self._in_data:
                end = self._buffer.find(b"\r\n.\r\n")
                if end < 0:
                    break
                self._server.contents.append(self._buffer[: end + 2])
                self._buffer = self._buffer[end + 5 :]
                self._in_data = False
                if self._buffer:  # the next commands came in the same read
                    self._server.contents_followed_by_commands += 1
                if len(self._server.contents) == self._server.hang_up_at_content:
                    assert self._transport is not None
                    self._transport.close()
                    return
                if not self._server.silent_after_content:
                    self._reply(b"250 queued")
                continue
            line, found, rest = self._buffer.partition(b"\r\n")
            if not found:
                break
            self._buffer = rest
            commands_in_this_read += 1
            self._server.commands.append(line)
            self._command(line)
        self._server.most_commands_in_one_read = max(
            self._server.most_commands_in_one_read, commands_in_this_read
        )

    def _command(self, line: bytes) -> None:
        verb = line[:4].upper()
        if verb == b"STAR":  # STARTTLS
            # A man in the middle's plain-text addition after the 220, before TLS.
            self._reply(b"220 go ahead\r\n250-injected\r\n250 PIPELINING")
        elif verb == b"EHLO":
            if self._server.starttls:
                self._reply(b"250-scripted\r\n250 STARTTLS")
            elif self._server.pipelining:
                self._reply(b"250-scripted\r\n250-PIPELINING\r\n250 SMTPUTF8")
            else:
                self._reply(b"250 scripted")
        elif verb in (b"MAIL", b"RCPT"):
            refused = verb == b"RCPT" and (
                self._server.refuse_rcpt or line[9:-1] in self._server.refused_recipients
            )
            self._rcpt_refused = refused or (verb == b"RCPT" and self._rcpt_refused)
            reply = b"550 no such user" if refused else b"250 OK"
            if self._server.hold_until_data:
                self._held.append(reply)
            else:
                self._reply(reply)
        elif verb == b"DATA":
            for reply in self._held:
                self._reply(reply)
            self._held.clear()
            if self._rcpt_refused:
                self._reply(b"554 no valid recipients")
                return
            self._in_data = True
            self._buffer = b"\r\n" + self._buffer  # the terminator's first CRLF
            self._reply(b"354 go on")
        elif verb == b"RSET":
            self._held.clear()
            self._rcpt_refused = False
            self._reply(b"250 reset")
        elif verb == b"QUIT":
            self._reply(b"221 bye")
        else:
            self._reply(b"502 no")

    def _reply(self, line: bytes) -> None:
        assert self._transport is not None
        self._transport.write(line + b"\r\n")


class ScriptedServer:
    def __init__(
        self,
        *,
        pipelining: bool,
        hold_until_data: bool = False,
        refuse_rcpt: bool = False,
        starttls: bool = False,
    ) -> None:
        self.silent_after_content = False  # takes the email, then never answers: a stall
        self.pipelining = pipelining
        self.starttls = starttls
        self.hold_until_data = hold_until_data
        self.refuse_rcpt = refuse_rcpt
        self.refused_recipients: set[bytes] = set()  # RCPT TO these: 550
        self.hang_up_at_content: int | None = None  # closes on receiving the n-th content
        self.commands: list[bytes] = []
        self.contents: list[bytes] = []
        self.most_commands_in_one_read = 0
        self.contents_followed_by_commands = 0


Serve = Callable[[ScriptedServer], Awaitable[int]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[asyncio.Server] = []

    async def start(scripted: ScriptedServer) -> int:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Scripted(scripted), "127.0.0.1", 0)
        servers.append(server)
        port: int = server.sockets[0].getsockname()[1]
        return port

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


def email(payment_id: str, body: bytes = b"Hello\r\n") -> OutgoingEmail:
    data = f"Message-ID: <{payment_id}@shop.example>\r\n\r\n".encode() + body
    return OutgoingEmail(f"<{payment_id}@shop.example>", "payments@shop.example", "b@x.test", data)


async def send(port: int, *emails: OutgoingEmail) -> None:
    smtp = SmtpSender("127.0.0.1", port, connections=1, timeout_s=2.0)
    try:
        for one in emails:
            await smtp.send(one)
    finally:
        await smtp.close()


async def test_a_server_offering_pipelining_gets_mail_rcpt_and_data_together(serve: Serve) -> None:
    # It answers MAIL and RCPT only once DATA is there: a client waiting for each reply
    # would time out here.
    scripted = ScriptedServer(pipelining=True, hold_until_data=True)
    port = await serve(scripted)

    await send(port, email("pay_1"), email("pay_2"))

    transaction = [b"MAIL FROM:<payments@shop.example>", b"RCPT TO:<b@x.test>", b"DATA"]
    assert [c for c in scripted.commands if not c.startswith((b"EHLO", b"QUIT"))] == [
        *transaction,
        *transaction,
    ]
    assert len(scripted.contents) == 2
    assert scripted.most_commands_in_one_read == 3


async def test_a_server_without_pipelining_gets_one_command_at_a_time(serve: Serve) -> None:
    scripted = ScriptedServer(pipelining=False)
    port = await serve(scripted)

    await send(port, email("pay_3"), email("pay_4"))

    assert len(scripted.contents) == 2
    assert scripted.most_commands_in_one_read == 1


async def test_a_refused_recipient_in_a_pipelined_transaction_is_an_error(serve: Serve) -> None:
    scripted = ScriptedServer(pipelining=True, hold_until_data=True, refuse_rcpt=True)
    port = await serve(scripted)

    with pytest.raises(SmtpRejectedError, match="RCPT TO: 550 no such user"):
        await send(port, email("pay_5"))
    assert scripted.contents == []


def emails_to(*recipients: str) -> list[OutgoingEmail]:
    return [
        OutgoingEmail(f"<pay_{r}@shop.example>", "payments@shop.example", r, b"Hi\r\n")
        for r in recipients
    ]


async def send_many(port: int, emails: list[OutgoingEmail]) -> list[Exception | None]:
    smtp = SmtpSender("127.0.0.1", port, connections=1, timeout_s=2.0)
    try:
        return await smtp.send_many(emails)
    finally:
        await smtp.close()


async def test_emails_sent_together_go_each_content_with_the_next_envelope(
    serve: Serve,
) -> None:
    # n emails in n + 1 round trips: the server never waits for a reply it already gave.
    scripted = ScriptedServer(pipelining=True, hold_until_data=True)
    port = await serve(scripted)

    results = await send_many(port, emails_to("a@x.test", "b@x.test", "c@x.test"))

    assert results == [None, None, None]
    assert [c for c in scripted.commands if c.startswith(b"RCPT")] == [
        b"RCPT TO:<a@x.test>",
        b"RCPT TO:<b@x.test>",
        b"RCPT TO:<c@x.test>",
    ]
    assert len(scripted.contents) == 3
    assert scripted.contents_followed_by_commands == 2


async def test_a_refused_recipient_fails_that_email_alone_and_the_next_ones_go(
    serve: Serve,
) -> None:
    scripted = ScriptedServer(pipelining=True)
    scripted.refused_recipients = {b"gone@x.test"}
    port = await serve(scripted)

    first, refused, last = await send_many(port, emails_to("a@x.test", "gone@x.test", "c@x.test"))

    assert (first, last) == (None, None)
    assert isinstance(refused, SmtpRejectedError)
    assert "RCPT TO: 550 no such user" in str(refused)
    assert len(scripted.contents) == 2
    assert b"RSET" in scripted.commands  # the half-open transaction ended before the next


async def test_a_connection_lost_mid_run_fails_the_email_in_flight_and_the_later_ones(
    serve: Serve,
) -> None:
    # The second email's content reached the server, its reply never came: unknown, so
    # failed (retried with the same Message-ID); the third was never sent.
    scripted = ScriptedServer(pipelining=True)
    scripted.hang_up_at_content = 2
    port = await serve(scripted)

    results = await send_many(port, emails_to("a@x.test", "b@x.test", "c@x.test"))

    assert results[0] is None
    assert all(isinstance(r, SmtpUnavailableError) for r in results[1:])
    assert len(scripted.contents) == 2


async def test_bytes_after_the_starttls_reply_end_the_connection_before_tls(
    serve: Serve,
) -> None:
    scripted = ScriptedServer(pipelining=False, starttls=True)
    port = await serve(scripted)
    smtp = SmtpSender("127.0.0.1", port, tls="starttls", connections=1, timeout_s=2.0)
    try:
        with pytest.raises(SmtpUnavailableError, match="more after its STARTTLS reply"):
            await smtp.send(email("pay_6"))
    finally:
        await smtp.close()
    assert scripted.commands[-1] == b"STARTTLS"


async def test_a_server_silent_after_the_content_is_a_timeout_and_the_retry_sends_again(
    serve: Serve,
) -> None:
    # The window SMTP leaves open (RFC 1047): the server has the email, the client never
    # learns it. The retry sends it again, with the same Message-ID.
    scripted = ScriptedServer(pipelining=True)
    scripted.silent_after_content = True
    port = await serve(scripted)
    smtp = SmtpSender("127.0.0.1", port, connections=1, timeout_s=0.3)
    try:
        with pytest.raises(SmtpUnavailableError, match=r"no answer within 0\.3 s"):
            await smtp.send(email("pay_7"))
        scripted.silent_after_content = False
        await smtp.send(email("pay_7"))  # over a fresh connection: the stalled one is closed
    finally:
        await smtp.close()
    assert len(scripted.contents) == 2
    assert sum(c.startswith(b"EHLO") for c in scripted.commands) == 2  # two connections


def test_the_content_is_dot_stuffed_with_crlf_line_ends() -> None:
    assert _content(b"a\n.\nb\r..c\r\n") == b"a\r\n..\r\nb\r\n...c\r\n.\r\n"
    assert _content(b".first\r\nlast") == b"..first\r\nlast\r\n.\r\n"
    assert _content(b"") == b".\r\n"
