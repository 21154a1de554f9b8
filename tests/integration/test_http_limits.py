"""Every service's HTTP limits (shared/process/http_limits.py): idle and slow connections are
closed, requests beyond the in-flight cap are answered 503 at once.

The servers run with the options service.run passes to aiohttp, with short timings; clients
are raw sockets, so nothing on the client side hides what the server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from services.ingest.app import create_app
from shared.config import Settings
from shared.process.http_limits import HTTP_LIMITS, HttpLimits
from shared.process.web import base_app
from tests.conftest import TEST_SECRETS
from tests.helpers import delivery, payment_event

LIMITS = HttpLimits(keepalive_timeout_s=1.0, body_timeout_s=0.5, lingering_s=0.5, max_in_flight=2)
SLACK_S = 1.0


async def _serve(aiohttp_server: Any, app: web.Application) -> TestServer:
    app[HTTP_LIMITS] = LIMITS
    server: TestServer = await aiohttp_server(app, **LIMITS.server_options())
    return server


async def _open(server: TestServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    assert server.port is not None
    return await asyncio.open_connection(server.host, server.port)


async def _seconds_until_closed(reader: asyncio.StreamReader) -> float:
    """Read (and drop) until the server closes the connection."""
    started = time.monotonic()
    async with asyncio.timeout(10):
        with contextlib.suppress(ConnectionResetError):
            while await reader.read(65536):
                pass
    return time.monotonic() - started


async def _trickle(writer: asyncio.StreamWriter, chunk: bytes) -> None:
    """Send `chunk` every 0.1 s until the connection breaks (a slowloris client)."""
    with contextlib.suppress(ConnectionError):
        while not writer.is_closing():
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(0.1)


async def test_an_idle_keep_alive_connection_is_closed(aiohttp_server: Any) -> None:
    server = await _serve(aiohttp_server, base_app(CollectorRegistry()))
    reader, writer = await _open(server)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")

    idle_s = await _seconds_until_closed(reader)

    assert LIMITS.keepalive_timeout_s - 0.2 < idle_s < LIMITS.keepalive_timeout_s + SLACK_S
    writer.close()


async def test_headers_trickled_in_are_cut_off(aiohttp_server: Any) -> None:
    server = await _serve(aiohttp_server, base_app(CollectorRegistry()))
    reader, writer = await _open(server)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")
    slowloris = asyncio.create_task(_trickle(writer, b"X-Slow: 1\r\n"))

    open_s = await _seconds_until_closed(reader)

    assert open_s < LIMITS.keepalive_timeout_s + SLACK_S
    slowloris.cancel()
    writer.close()


async def test_a_webhook_body_trickled_in_is_answered_503_and_the_connection_closed(
    aiohttp_server: Any, make_settings: Callable[..., Settings], amqp: Any
) -> None:
    app = create_app(make_settings())
    server = await _serve(aiohttp_server, app)
    body, headers = delivery(payment_event(), TEST_SECRETS[0])
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    reader, writer = await _open(server)
    started = time.monotonic()
    writer.write(
        f"POST /webhooks/xhub HTTP/1.1\r\nHost: test\r\nContent-Length: {len(body)}\r\n"
        f"{head}\r\n".encode()
        + body[:10]
    )
    slowloris = asyncio.create_task(_trickle(writer, b" "))

    answer = await reader.readuntil(b"\r\n\r\n")
    answered_s = time.monotonic() - started
    closed_s = await _seconds_until_closed(reader)

    assert answer.startswith(b"HTTP/1.1 503"), answer
    assert b"Retry-After: 5" in answer
    assert answered_s < LIMITS.body_timeout_s + SLACK_S
    assert closed_s < LIMITS.lingering_s + SLACK_S
    slowloris.cancel()
    writer.close()


async def test_requests_beyond_the_in_flight_cap_are_503_at_once(aiohttp_client: Any) -> None:
    app = base_app(CollectorRegistry())
    app[HTTP_LIMITS] = LIMITS
    inside = asyncio.Semaphore(0)
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        inside.release()
        await release.wait()
        return web.json_response({"ok": True})

    app.router.add_get("/slow", slow)
    client = await aiohttp_client(app)
    held = [asyncio.create_task(client.get("/slow")) for _ in range(LIMITS.max_in_flight)]
    for _ in held:
        await asyncio.wait_for(inside.acquire(), 5)

    started = time.monotonic()
    refused = await client.get("/slow")
    refused_s = time.monotonic() - started
    health = await client.get("/healthz")
    metrics = await (await client.get("/metrics")).text()
    release.set()
    statuses = [(await task).status for task in held]

    assert refused.status == 503
    assert refused.headers["Retry-After"] == "5"
    assert orjson.loads(await refused.read())["error"]
    assert refused_s < 0.5
    assert health.status == 200  # probes are always answered
    assert "payhooks_http_requests_shed_total 1.0" in metrics
    assert statuses == [200] * LIMITS.max_in_flight
    assert (await client.get("/slow")).status == 200  # the slots are free again
