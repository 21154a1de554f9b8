"""A TCP proxy for outage tests: forwards to a real server, and can cut or stall on demand.

The real PostgreSQL and RabbitMQ keep running (other tests share them); an app under test
talks to them through a TcpProxy, and the test breaks the path instead of the server.
`cut()` is a dropped link (every connection closed, new ones refused by an immediate reset),
`stall()` a black hole (connections stay open, no byte moves either way: bytes already read
are held, in order, and delivered after `restore()`, as a congested network would).
"""

from __future__ import annotations

import asyncio
import socket
from enum import StrEnum
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit, urlunsplit

_CHUNK_BYTES = 65_536


class Mode(StrEnum):
    PASS = "pass"
    CUT = "cut"
    STALL = "stall"


class TcpProxy:
    """Listens on 127.0.0.1:<free port> and forwards to `target_host:target_port`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.mode = Mode.PASS
        self.port = 0
        self._server: asyncio.Server | None = None
        # Set while bytes may flow; cleared by stall(). Pumps wait on it before each write.
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._on_client, self.host, 0)
        sock: socket.socket = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._drop_connections()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def cut(self) -> None:
        """Close every open connection (both sides) and reset every new one at once."""
        self.mode = Mode.CUT
        # Release stalled pumps so they notice the cut and drop what they hold.
        self._flowing.set()
        self._drop_connections()

    def stall(self) -> None:
        """Keep connections (and accept new ones) but stop forwarding bytes both ways."""
        self.mode = Mode.STALL
        self._flowing.clear()

    def restore(self) -> None:
        """Forward again; bytes held by a stall are delivered first, in order."""
        self.mode = Mode.PASS
        self._flowing.set()

    def _drop_connections(self) -> None:
        for writer in list(self._writers):
            _abort(writer)
        self._writers.clear()

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.target_host, self.target_port)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode is Mode.CUT:
            _abort(writer)
            return
        try:
            up_reader, up_writer = await self._open_upstream()
        except OSError:  # the source reset: so does the destination
            self._writers.discard(writer)
            _abort(writer)
            return
        if self.mode is Mode.CUT:  # cut while we were connecting upstream
            _abort(writer)
            _abort(up_writer)
            return
        self._writers.update((writer, up_writer))
        for task in (
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction until EOF; the first direction to end closes the connection."""
        try:
            while True:
                data = await reader.read(_CHUNK_BYTES)
                await self._flowing.wait()
                if self.mode is Mode.CUT or writer not in self._writers:
                    return  # the link is gone: what was in flight is lost
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except OSError:  # the source reset: so does the destination
            self._writers.discard(writer)
            _abort(writer)
            return
        # Orderly close: deliver what is buffered, then close; the peer's reader then sees
        # EOF on this transport and ends the other direction the same way.
        self._writers.discard(writer)
        writer.close()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close at once with a reset, like a dead link or a refused connection."""
    transport = writer.transport
    if not transport.is_closing():
        transport.abort()


async def proxy_to(url: str, default_port: int) -> TcpProxy:
    """A started proxy to the server of `url` (a database or AMQP URL)."""
    parts = urlsplit(url)
    return await TcpProxy(parts.hostname or "127.0.0.1", parts.port or default_port).start()


def via(url: str, proxy: TcpProxy) -> str:
    """`url` with its host and port replaced by the proxy's (credentials kept)."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@{proxy.address}" if credentials else proxy.address
    return urlunsplit(parts._replace(netloc=netloc))
