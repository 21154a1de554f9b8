"""An OTLP/HTTP sink that accepts every export and keeps nothing: where bench.workers' traced
runs send their spans (`--otlp-sink` starts one; docs/observability.md, "What it costs").

    python -m bench.otlp_sink [--port 4318]
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python -m bench.workers --n 4000

It shares the benchmark's cores, where a real collector runs elsewhere, so it does as little
as it can: a bare asyncio protocol that finds each request's Content-Length, skips that many
bytes and answers 200 with an empty body (the exporter reads only the status). No HTTP
framework, no parsing of the spans. It counts the exports and their bytes, printed at exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
import time
from pathlib import Path

from bench.processes import OwnedProcess, free_port, spawn

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"


class Received:
    exports = 0
    bytes = 0


class Exports(asyncio.Protocol):
    """One connection: requests one after the other (keep-alive), bodies counted and dropped."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._head = b""
        self._body_left = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        while data:
            if self._body_left:
                taken = min(self._body_left, len(data))
                self._body_left -= taken
                Received.bytes += taken
                data = data[taken:]
                if not self._body_left:
                    self._answer()
                continue
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self._head[:end], self._head[end + 4 :]
            self._head = b""
            self._body_left = _content_length(head)
            if not self._body_left:
                self._answer()

    def _answer(self) -> None:
        Received.exports += 1
        assert self._transport is not None
        self._transport.write(OK)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Exports, "127.0.0.1", port)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()
    print(f"otlp sink: {Received.exports:,} exports, {Received.bytes:,} bytes", flush=True)


class OtlpSink(OwnedProcess):
    """The sink subprocess bench.workers owns (--otlp-sink): its endpoint goes in the
    services' OTEL_EXPORTER_OTLP_ENDPOINT, its CPU in a group of its own."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._log_path = log_dir / "otlp-sink.log"
        self._env = env

    def start(self, timeout_s: float = 15.0) -> None:
        command = [sys.executable, "-m", "bench.otlp_sink", "--port", str(self.port)]
        self.process = spawn(command, self._env, self._log_path)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"OTLP sink exited at startup, see {self._log_path}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            time.sleep(0.1)
        raise RuntimeError(f"OTLP sink not listening in {timeout_s}s")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.otlp_sink", description=__doc__)
    p.add_argument("--port", type=int, default=4318)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(p.parse_args().port))


if __name__ == "__main__":
    main()
