"""A lean HTTP/1.1 client for load generation: one keep-alive connection, one request at a
time, the request's bytes written whole and the answer read by its Content-Length.

Why not aiohttp's client: at a paced few hundred requests a second it took ~0.65 ms of CPU
per request, as much as ingest's own handling of it, on the same two cores as the system
measured (bench.workers at a steady rate). This one takes a fraction of that. It speaks only
what ingest answers: a status line, headers with Content-Length, a body; no chunked answers,
no redirects, no TLS.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from urllib.parse import urlsplit

REQUEST_TIMEOUT_S = 15.0
_HEAD_END = b"\r\n\r\n"


def post_request(url: str, headers: Mapping[str, str], body: bytes) -> bytes:
    """The whole POST as it goes on the wire."""
    parts = urlsplit(url)
    given = {name.lower() for name in headers}
    lines = [
        f"POST {parts.path or '/'} HTTP/1.1",
        f"Host: {parts.netloc}",
        *(["Content-Type: application/json"] if "content-type" not in given else []),
        f"Content-Length: {len(body)}",
        *(
            f"{name}: {value}"
            for name, value in headers.items()
            if name.lower() != "content-length"
        ),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class RawConnection:
    """One keep-alive connection to `url`'s host; reopened after an error or a close."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def open(self) -> None:
        if self._streams is None:
            self._streams = await asyncio.open_connection(self._host, self._port)

    async def send(self, request: bytes) -> tuple[int, bytes]:
        """Status and body of the answer; (0, the error's name) when there was none."""
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await self.open()
                assert self._streams is not None
                reader, writer = self._streams
                writer.write(request)
                head = await reader.readuntil(_HEAD_END)
                status, length, close = _parse_head(head)
                body = await reader.readexactly(length)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
            self.close()
            return 0, type(e).__name__.encode()
        if close:
            self.close()
        return status, body

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


class OneShotSender:
    """The simulator's Sender (services/sim/deliverer.py) for load from this machine: each
    attempt on a connection of its own, closed after the answer (as X-Hub opens them when its
    breaker lets a backlog go), answered within `timeout_s` of the call or None. A 10,000
    burst cost the simulator 5.5 s of CPU with aiohttp's client, more than ingest spent on it,
    on the same two cores (bench/burst.py)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    async def __call__(self, url: str, headers: dict[str, str], body: bytes) -> int | None:
        raw = RawConnection(url)
        # The server closes first, so the TIME_WAIT is its own (its one port), not this
        # side's: 18,000 of those held this machine's ephemeral ports for a minute.
        request = post_request(url, {**headers, "Connection": "close"}, body)
        try:
            async with asyncio.timeout(self.timeout_s):
                status, _ = await raw.send(request)
        except TimeoutError:
            return None
        finally:
            raw.close()
        return status or None  # 0: a network error


def _parse_head(head: bytes) -> tuple[int, int, bool]:
    """Status, Content-Length and whether the server closes the connection after it."""
    status_line, *fields = head[: -len(_HEAD_END)].split(b"\r\n")
    status = int(status_line.split(b" ", 2)[1])
    length, close = 0, False
    for field in fields:
        name, _, value = field.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection":
            close = value.strip().lower() == b"close"
        elif name == b"transfer-encoding":
            raise ValueError("chunked answers are not read here")
    return status, length, close
