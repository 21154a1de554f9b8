"""Before `make run` and `make demo` start anything: PostgreSQL and RabbitMQ answer at the
configured DATABASE_URL and AMQP_URL, and the services' ports are free. Every problem is
printed with what to do about it (exit 1; 2 for a malformed variable); nothing waits long.

    .venv/bin/python scripts/preflight.py [--port 8090 ...] [--wait SECONDS]

A server that accepts connections but is still starting (a container just started) is given
--wait seconds (default DEPS_WAIT, else 30); nothing listening fails at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

# Run as a file from anywhere: the repository (shared/) on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aio_pika
import aiormq
import asyncpg
from dotenv import load_dotenv

from shared.config import ConfigError, Settings

CONNECT_TIMEOUT_S = 3.0  # TCP
HANDSHAKE_TIMEOUT_S = 5.0  # the protocol, once connected
START_THEM = (
    "start it: docker compose up -d --wait postgres rabbitmq\n"
    "      or the system service ({service})"
)
SYSTEM_SERVICE = {
    "PostgreSQL": "Debian/Ubuntu: sudo systemctl start postgresql; "
    "macOS: brew services start postgresql",
    "RabbitMQ": "Debian/Ubuntu: sudo systemctl start rabbitmq-server; "
    "macOS: brew services start rabbitmq",
}


class NotReady(Exception):
    """Connected, but the server did not complete the handshake (yet): worth another try."""


class Refused(Exception):
    """Connected and answered, and the answer will not change by waiting (credentials)."""


def say(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")
    sys.stderr.flush()


def where(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    default = 5432 if parts.scheme.startswith("postgres") else 5672
    return parts.hostname or "127.0.0.1", parts.port or default


async def tcp_problem(host: str, port: int) -> str | None:
    """Why nothing can be reached at host:port, or None when something accepts connections."""
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return f"nothing listens on {host}:{port}"
    except socket.gaierror:
        return f"cannot resolve host {host!r}"
    except TimeoutError:
        return f"no answer from {host}:{port} within {CONNECT_TIMEOUT_S:g} s"
    except OSError as e:
        return f"cannot connect to {host}:{port}: {e.strerror or e}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


async def postgres_handshake(url: str) -> None:
    try:
        connection = await asyncpg.connect(url, timeout=HANDSHAKE_TIMEOUT_S)
    except asyncpg.InvalidCatalogNameError:
        return  # the server is there; `payhooks migrate` creates the database
    except (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InvalidPasswordError) as e:
        raise Refused(f"refused the login: {e}; set DATABASE_URL's user and password") from e
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        # "the database system is starting up", a connection closed mid-handshake, ...
        raise NotReady(str(e) or type(e).__name__) from e
    await connection.close()


async def rabbitmq_handshake(url: str) -> None:
    try:
        connection = await aio_pika.connect(url, timeout=HANDSHAKE_TIMEOUT_S)
    except aiormq.exceptions.ProbableAuthenticationError as e:
        raise Refused("refused the login; set AMQP_URL's user and password") from e
    except aiormq.exceptions.ProtocolSyntaxError as e:  # e.g. the vhost is missing
        raise Refused("refused the connection: does AMQP_URL's vhost exist, for its user?") from e
    except (OSError, TimeoutError, aiormq.exceptions.AMQPError) as e:
        raise NotReady(str(e) or type(e).__name__) from e
    await connection.close()


async def dependency_problem(
    name: str, variable: str, url: str, handshake: Callable[[str], Awaitable[None]], wait_s: float
) -> str | None:
    host, port = where(url)
    heading = f"{name} ({variable}, {host}:{port}): "
    unreachable = await tcp_problem(host, port)
    if unreachable is not None:
        how = START_THEM.format(service=SYSTEM_SERVICE[name])
        return f"{heading}{unreachable}\n      {how}\n      or set {variable} to a running server"
    deadline = time.monotonic() + wait_s
    said_waiting = False
    while True:
        try:
            await handshake(url)
            return None
        except Refused as e:
            return f"{heading}{e}"
        except NotReady as e:
            if time.monotonic() >= deadline:
                return f"{heading}accepts connections but did not answer as {name}: {e}"
            if not said_waiting:
                say(f"payhooks: waiting up to {wait_s:g} s for {name} to start ({e})")
                said_waiting = True
            await asyncio.sleep(1.0)


def port_problems(settings: Settings, extra: list[int]) -> list[str]:
    ports = {
        "ingest": settings.ingest_port,
        "api": settings.api_port,
        "orders": settings.orders_port,
        "bonuses": settings.bonuses_port,
        "email": settings.email_port,
    }
    if settings.xhub_api_url and settings.xhub_api_key:  # `payhooks run all` starts it then
        ports["reconciler"] = settings.reconciler_port
    ports |= {f"port {port}": port for port in extra}
    problems = []
    for user, port in ports.items():
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                problems.append(
                    f"{user}: port {port} is in use (payhooks already running? `make run`, "
                    f"`make demo` or `docker compose up` elsewhere): stop that first"
                )
    return problems


async def problems(settings: Settings, extra_ports: list[int], wait_s: float) -> list[str]:
    found = await asyncio.gather(
        dependency_problem(
            "PostgreSQL", "DATABASE_URL", settings.database_url, postgres_handshake, wait_s
        ),
        dependency_problem("RabbitMQ", "AMQP_URL", settings.amqp_url, rabbitmq_handshake, wait_s),
    )
    return [p for p in found if p is not None] + port_problems(settings, extra_ports)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, action="append", default=[], help="must be free too")
    parser.add_argument("--wait", type=float, default=float(os.environ.get("DEPS_WAIT", "30")))
    args = parser.parse_args()
    for library in ("aio_pika", "aiormq", "asyncio"):  # our messages, not their tracebacks
        logging.getLogger(library).setLevel(logging.CRITICAL)
    # What `payhooks` will read: ./.env under the environment's own variables.
    if Path(".env").is_file():
        load_dotenv(".env", override=False)
    try:
        settings = Settings.from_env()
    except ConfigError as e:
        say(f"payhooks: {e}")
        return 2
    found = asyncio.run(problems(settings, args.port, args.wait))
    if found:
        say("payhooks: cannot start:\n" + "".join(f"  - {problem}\n" for problem in found))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
