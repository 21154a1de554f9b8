"""The chaos harness's SMTP sink (real aiosmtpd, real sockets): it tells a connection that ended
right after the server took a message (its 250 may never have reached the client) from one the
client closed with QUIT, so that the verdict can count a resend after a lost 250 apart from a
doubled email."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from bench.processes import free_port
from tests.chaos.stack import CountingController, SmtpCounter

MESSAGE = (
    b"MAIL FROM:<payments@chaos.test>\r\nRCPT TO:<buyer@example.com>\r\nDATA\r\n"
    b"Message-ID: <payment_succeeded.p1@chaos.test>\r\n"
    b"X-Payhooks-Template: payment_succeeded\r\n\r\nPaid.\r\n.\r\n"
)


@pytest.fixture
def sink() -> Iterator[tuple[SmtpCounter, int]]:
    counter = SmtpCounter()
    port = free_port()
    controller = CountingController(counter, port)
    controller.start()
    try:
        yield counter, port
    finally:
        controller.stop()


def _until(condition: object, what: str) -> None:
    deadline = time.monotonic() + 5
    while not callable(condition) or not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _session(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    client.recv(1024)  # the greeting
    client.sendall(b"EHLO chaos.test\r\n")
    time.sleep(0.05)
    client.recv(4096)
    return client


def test_a_connection_reset_right_after_a_message_may_have_lost_its_250(
    sink: tuple[SmtpCounter, int],
) -> None:
    counter, port = sink
    client = _session(port)
    client.sendall(MESSAGE)
    _until(lambda: len(counter.mails) == 1, "the message")
    # A reset, as a cut link gives: whatever the server answered is lost.
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    client.close()
    connection = counter.mails[0].connection
    _until(lambda: connection in counter.cut_at, "the end of the connection")
    assert counter.reply_maybe_lost() == {0}


def test_a_message_whose_client_said_quit_had_its_250_read(
    sink: tuple[SmtpCounter, int],
) -> None:
    counter, port = sink
    client = _session(port)
    client.sendall(MESSAGE + b"QUIT\r\n")
    _until(lambda: len(counter.mails) == 1, "the message")
    while client.recv(4096):  # until the server closes after its 221
        pass
    client.close()
    time.sleep(0.1)
    # (The controller's own check that it listens is a connection without QUIT, and no mail.)
    assert counter.mails[0].connection not in counter.cut_at
    assert counter.reply_maybe_lost() == set()
