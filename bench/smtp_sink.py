"""The SMTP sink of `bench.workers`: a lean SMTP server in its own process that notes the
Message-ID and arrival time of every email, and the driver's view of what it has received."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO

import uvloop

from bench.processes import OwnedProcess, free_port, spawn

_MESSAGE_ID = re.compile(rb"^Message-ID:[ \t]*(\S+)", re.IGNORECASE | re.MULTILINE)
_SINK_MAIN = (
    "import sys; from bench.smtp_sink import run_sink; run_sink(int(sys.argv[1]), sys.argv[2])"
)


class _Recorder:
    """One line per accepted message, `<message-id> <unix time received>`.

    Lines are flushed 20 ms after the first unflushed one: the arrival time is taken on
    arrival, and an idle sink costs nothing."""

    FLUSH_AFTER_S = 0.02

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._flush: asyncio.TimerHandle | None = None

    def record(self, content: bytes) -> None:
        received = time.time()
        match = _MESSAGE_ID.search(content)
        message_id = match.group(1).decode(errors="replace") if match else "?"
        self._out.write(f"{message_id} {received:.6f}\n")
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(self.FLUSH_AFTER_S, self.flush)

    def flush(self) -> None:
        self._flush = None
        self._out.flush()


class _LeanSmtp(asyncio.Protocol):
    """Just enough SMTP (RFC 5321) to take mail from the email worker: greeting, EHLO/HELO
    (offering PIPELINING, as postfix and most relays do), MAIL, RCPT, DATA with
    dot-terminated content, RSET, NOOP, QUIT; anything else 502. The replies to what one read
    brought go out in one write (RFC 2920). No checks, no parsing beyond the Message-ID: the
    aiosmtpd sink before it cost ~0.7 ms of CPU per email (this one ~0.14), and a benchmark's
    sink must not be its bottleneck."""

    def __init__(self, recorder: _Recorder) -> None:
        self._recorder = recorder
        self._buffer = b""
        self._in_data = False
        self._transport: asyncio.Transport | None = None
        self._replies: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport
        self._replies.append(b"220 bench-sink ESMTP")
        self._send_replies()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            self._take_commands()
        finally:
            self._send_replies()

    def _take_commands(self) -> None:
        while True:
            if self._in_data:
                end = self._buffer.find(b"\r\n.\r\n")
                if end < 0:
                    return
                self._recorder.record(self._buffer[:end])
                self._buffer = self._buffer[end + 5 :]
                self._in_data = False
                self._replies.append(b"250 OK")
                continue
            line, found, rest = self._buffer.partition(b"\r\n")
            if not found:
                return
            self._buffer = rest
            if self._command(line[:4].upper()):
                return

    def _command(self, verb: bytes) -> bool:
        """Answer one command; True when the connection is done."""
        if verb == b"EHLO":
            self._replies.append(b"250-bench-sink\r\n250 PIPELINING")
        elif verb == b"HELO":
            self._replies.append(b"250 bench-sink")
        elif verb in (b"MAIL", b"RCPT", b"RSET", b"NOOP"):
            self._replies.append(b"250 OK")
        elif verb == b"DATA":
            self._in_data = True
            # The terminator is CRLF "." CRLF; an empty message's CRLF is the DATA line's.
            self._buffer = b"\r\n" + self._buffer
            self._replies.append(b"354 End data with <CR><LF>.<CR><LF>")
        elif verb == b"QUIT":
            self._replies.append(b"221 Bye")
            self._send_replies()
            if self._transport is not None:
                self._transport.close()
            return True
        else:
            self._replies.append(b"502 Command not implemented")
        return False

    def _send_replies(self) -> None:
        if self._transport is not None and self._replies:
            self._transport.write(b"".join(line + b"\r\n" for line in self._replies))
        self._replies.clear()


def run_sink(port: int, path: str) -> None:
    """The sink process: a lean SMTP server on uvloop until SIGTERM."""

    async def serve(out: IO[str]) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        recorder = _Recorder(out)
        server = await loop.create_server(
            lambda: _LeanSmtp(recorder), "127.0.0.1", port, backlog=256
        )
        await stop.wait()
        server.close()
        recorder.flush()

    with open(path, "w", buffering=1 << 16) as out:
        uvloop.run(serve(out))


class Sink(OwnedProcess):
    """The sink subprocess we own, and what it has received so far."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.path = log_dir / "sink-received.txt"
        self._log_path = log_dir / "sink.log"
        self._env = env
        self._offset = 0
        self._partial = b""
        self.received: dict[str, float] = {}  # payment id -> first arrival (unix time)
        self.repeats: Counter[str] = Counter()  # payment ids received more than once

    def start(self, timeout_s: float = 15.0) -> None:
        self.path.write_bytes(b"")
        self.process = spawn(
            [sys.executable, "-c", _SINK_MAIN, str(self.port), str(self.path)],
            self._env,
            self._log_path,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"SMTP sink exited at startup, see {self._log_path}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            time.sleep(0.1)
        raise RuntimeError(f"SMTP sink not listening in {timeout_s}s")

    def poll(self) -> int:
        """Read the lines written since the last call; return how many payments have mail."""
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            message_id, _, at = line.decode().rpartition(" ")
            payment_id = _payment_of(message_id)
            if payment_id in self.received:
                self.repeats[payment_id] += 1
            else:
                self.received[payment_id] = float(at)
        return len(self.received)


def _payment_of(message_id: str) -> str:
    """`<payment_succeeded.PAYMENT@domain>` (services.email.templates.message_id) -> PAYMENT."""
    local = message_id.strip("<>").rpartition("@")[0]
    return local.partition(".")[2] or message_id


def wait_for_emails(
    sink: Sink,
    expected: set[str],
    timeout_s: float,
    every_second: Callable[[], None] | None = None,
) -> float | None:
    """Poll the sink until every expected payment has mail; the time it did (unix), or None."""
    deadline = time.monotonic() + timeout_s
    next_call = time.monotonic() + 1.0
    while True:
        sink.poll()
        if expected.issubset(sink.received.keys()):
            return time.time()
        if time.monotonic() > deadline:
            return None
        if every_second is not None and time.monotonic() >= next_call:
            every_second()
            next_call = time.monotonic() + 1.0
        time.sleep(0.02)
