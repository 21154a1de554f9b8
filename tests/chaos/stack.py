"""The system a chaos round runs: `payhooks run all` on its own database and queue prefix,
reaching PostgreSQL, RabbitMQ and an SMTP sink that counts every message it receives through TCP
proxies (so a round can cut the network), and the simulator's payments API."""

from __future__ import annotations

import asyncio
import contextlib
import email
import itertools
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import aiohttp
import asyncpg
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP
from prometheus_client.parser import text_string_to_metric_families

from bench.processes import ports_for
from services.sim.api import PaymentBook, start_api
from shared.amqp.topology import Topology, build_topology, delete
from shared.config import Settings
from shared.migrate import migrate
from tests import dlx_guard
from tests.processes import payhooks_command
from tests.proxy import TcpProxy, via

SECRET = "chaos-secret"
# Standard Webhooks' (whsec_ + base64 of the key): every round serves /webhooks/standard too.
STANDARD_SECRET = "whsec_Y2hhb3Mtc3RhbmRhcmQtc2VjcmV0LWtleQ=="
# Stripe's (used as given): every round serves /webhooks/stripe too, and the simulator's API
# answers Stripe's questions (STRIPE_API_URL) with its own key.
STRIPE_SECRET = "whsec_chaos_stripe_secret"
API_KEY = "chaos-provider-key"
STRIPE_API_KEY = "sk_test_chaos_stripe_key"
ADMIN_TOKEN = "chaos-admin-token"
# Production's retry ladder: a 30 s outage must not exhaust it (a dead letter is a lost effect
# until an operator requeues it).
RETRY_DELAYS = "1,5,30,120,600"
SERVICES = ("ingest", "orders", "bonuses", "email", "reconciler", "api")
PORT_VARIABLES = {
    "ingest": "INGEST_PORT",
    "api": "API_PORT",
    "orders": "ORDERS_PORT",
    "bonuses": "BONUSES_PORT",
    "email": "EMAIL_PORT",
    "reconciler": "RECONCILER_PORT",
}


# A connection that ends without QUIT this soon after the server took a message may have lost
# the server's 250 on the way back: on 127.0.0.1 a reply takes well under a millisecond, so a
# message accepted longer ago than this before the cut had its 250 read by the client.
REPLY_IN_FLIGHT_S = 1.0


@dataclass
class Mail:
    message_id: str
    template: str
    received: float
    connection: int  # which SMTP connection carried it


@dataclass
class SmtpCounter:
    """aiosmtpd handler: every message received, in order (a second copy is a doubled email,
    unless the first copy's 250 may have been lost with its connection: see reply_maybe_lost)."""

    mails: list[Mail] = field(default_factory=list)
    # connection -> when it ended without a QUIT (a cut, a reset, a client that gave up)
    cut_at: dict[int, float] = field(default_factory=dict)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.content)
        self.mails.append(
            Mail(
                str(message["Message-ID"]),
                str(message["X-Payhooks-Template"]),
                time.time(),
                getattr(server, "connection", 0),
            )
        )
        return "250 Message accepted for delivery"

    def copies(self) -> Counter[str]:
        return Counter(m.message_id for m in self.mails)

    def reply_maybe_lost(self) -> set[int]:
        """The mails (by index) whose 250 may never have reached the client: the last one its
        connection carried, that connection ending without QUIT within REPLY_IN_FLIGHT_S of
        it. SMTP has no way to ask whether a message went through (RFC 1047): a client that
        did not read the 250 must send again, with the same Message-ID."""
        last: dict[int, int] = {}
        for index, mail in enumerate(self.mails):
            last[mail.connection] = index
        return {
            index
            for connection, index in last.items()
            if (cut := self.cut_at.get(connection)) is not None
            and cut - self.mails[index].received <= REPLY_IN_FLIGHT_S
        }


class _CountingSession(SMTP):
    """aiosmtpd's SMTP session, numbered, telling the counter when it ends without QUIT."""

    def __init__(self, counter: SmtpCounter, connection: int) -> None:
        super().__init__(counter)
        self.counter = counter
        self.connection = connection
        self.quit = False

    async def smtp_QUIT(self, arg: str) -> None:
        self.quit = True
        await super().smtp_QUIT(arg)

    def connection_lost(self, error: Exception | None) -> None:
        if not self.quit:
            self.counter.cut_at[self.connection] = time.time()
        super().connection_lost(error)


class CountingController(Controller):
    def __init__(self, counter: SmtpCounter, port: int) -> None:
        super().__init__(counter, hostname="127.0.0.1", port=port)
        self._counter = counter
        self._connections = itertools.count(1)

    def factory(self) -> SMTP:
        return _CountingSession(self._counter, next(self._connections))


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def _first_address(url: str, default_port: int) -> tuple[str, int]:
    """The first host of a URL that may name several (`postgresql://u@h1:1,h2:2/db`, or
    AMQP_URL's comma-separated nodes)."""
    parts = urlsplit(url.split(",")[0])  # the first node's URL, or the DSN up to its 2nd host
    host, port = parts.hostname, parts.port
    return host or "127.0.0.1", port or default_port


class Stack:
    """One round's system. `start()` brings it up; `close()` removes everything it made."""

    def __init__(
        self,
        database_url: str,
        amqp_url: str,
        workdir: Path,
        *,
        name: str = "chaos",
        proxied: bool = True,
        retry_delays: str = RETRY_DELAYS,
        rabbit_node: str | None = None,
        run_args: tuple[str, ...] = (),
    ) -> None:
        # Its own database (payhooks_<name>) and queue prefix (<name>.), removed at the end.
        self.database = f"payhooks_{name}"
        self.prefix = f"{name}."
        self.admin_url = _with_database(database_url, "postgres")
        self.database_url = _with_database(database_url, self.database)
        self.amqp_url = amqp_url
        self.workdir = workdir
        self.proxied = proxied  # through TCP proxies (to cut the network), or direct
        self.retry_delays = retry_delays
        self.rabbit_node = rabbit_node  # the node rabbitmqctl reaches (None: its default)
        self.run_args = run_args  # after `payhooks run all` (--replicas N)
        self.pg_proxy = TcpProxy(*_first_address(database_url, 5432))
        self.amqp_proxy = TcpProxy(*_first_address(amqp_url, 5672))
        self.smtp = SmtpCounter()
        ports = ports_for([*SERVICES, "smtp"])
        self.smtp_port = ports.pop("smtp")
        self.smtp_proxy = TcpProxy("127.0.0.1", self.smtp_port)
        self.book = PaymentBook()
        self.ports = ports
        self.topology: Topology = build_topology(
            self.prefix, Settings.from_env({"RETRY_DELAYS": retry_delays}).retry_delays_s
        )
        self.process: asyncio.subprocess.Process | None = None
        self._controller: Controller | None = None
        self._api: Any = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def ingest_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['ingest']}"

    async def start(self, log_path: Path) -> None:
        await self._fresh_database()
        await self.delete_queues()
        await self.guard_dead_lettering()
        if self.proxied:
            await self.pg_proxy.start()
            await self.amqp_proxy.start()
            await self.smtp_proxy.start()
        self._controller = CountingController(self.smtp, self.smtp_port)
        self._controller.start()
        self._api, api_url = await start_api(self.book, API_KEY, keys={"stripe": STRIPE_API_KEY})
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/root"),
            "DATABASE_URL": (
                via(self.database_url, self.pg_proxy) if self.proxied else self.database_url
            ),
            "AMQP_URL": (via(self.amqp_url, self.amqp_proxy) if self.proxied else self.amqp_url),
            "AMQP_PREFIX": self.prefix,
            "XHUB_WEBHOOK_SECRETS": SECRET,
            "STANDARD_WEBHOOK_SECRETS": STANDARD_SECRET,
            "STRIPE_WEBHOOK_SECRETS": STRIPE_SECRET,
            "XHUB_TIMESTAMP_TOLERANCE": "3600",
            "ADMIN_TOKEN": ADMIN_TOKEN,
            "XHUB_API_URL": api_url,
            "XHUB_API_KEY": API_KEY,
            "STRIPE_API_URL": api_url,
            "STRIPE_API_KEY": STRIPE_API_KEY,
            "RECONCILE_INTERVAL": "2",
            "RECONCILE_AFTER": "3",
            "RETRY_DELAYS": self.retry_delays,
            "SMTP_PORT": str(self.smtp_proxy.port if self.proxied else self.smtp_port),
            "EMAIL_FROM": "payments@chaos.test",
            "LOG_LEVEL": "WARNING",
            **{PORT_VARIABLES[name]: str(port) for name, port in self.ports.items()},
        }
        with log_path.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                *payhooks_command(),
                "run",
                "all",
                *self.run_args,
                env=env,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        await self.wait_ready(timeout_s=60)

    async def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            services = self.service_pids()
            self.process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(40):
                    await self.process.wait()
            except TimeoutError:
                # Each service runs in a session of its own: the supervisor's group is not theirs.
                for pid in [self.process.pid, *services.values()]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                await self.process.wait()
        if self._session is not None:
            await self._session.close()
        if self._api is not None:
            await self._api.cleanup()
        if self._controller is not None:
            self._controller.stop()
        if self.proxied:
            await self.pg_proxy.close()
            await self.amqp_proxy.close()
            await self.smtp_proxy.close()
        with contextlib.suppress(Exception):
            await self.delete_queues()
            await asyncio.sleep(1)  # the dead-letter workers of deleted queues stop meanwhile
            await self.guard_dead_lettering()
        with contextlib.suppress(Exception):
            await self._drop_database()

    def kill_now(self) -> None:
        """Without the event loop: every process of `payhooks run all` killed at once (an
        interrupted run; its database and queues go with the private servers)."""
        if self.process is None or self.process.returncode is not None:
            return
        # The supervisor starts each service in a session of its own: kill them by pid.
        services = list(self.service_pids().values())
        for pid in [self.process.pid, *services]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.process.pid, 0)
        if self._controller is not None:
            with contextlib.suppress(Exception):
                self._controller.stop()

    # --- the database and the queues -----------------------------------------------------

    async def _fresh_database(self) -> None:
        await self._drop_database()
        admin = await asyncpg.connect(self.admin_url, timeout=10)
        try:
            await admin.execute(f"CREATE DATABASE {self.database}")
        finally:
            await admin.close()
        await migrate(self.database_url)

    async def _drop_database(self) -> None:
        admin = await asyncpg.connect(self.admin_url, timeout=10)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
        finally:
            await admin.close()

    def admin_amqp_url(self) -> str:
        """The broker the harness itself declares, deletes and counts on."""
        return self.amqp_url

    async def guard_dead_lettering(self) -> None:
        await asyncio.to_thread(dlx_guard.ensure, self.rabbit_node)

    async def delete_queues(self) -> None:
        connection = await aio_pika.connect(self.admin_amqp_url(), timeout=10)
        async with connection:
            await delete(await connection.channel(), self.topology)

    async def dead_letters(self) -> dict[str, int]:
        connection = await aio_pika.connect(self.admin_amqp_url(), timeout=10)
        async with connection:
            channel = await connection.channel()
            depths = {}
            for base, work in self.topology.work.items():
                queue = await channel.declare_queue(work.dlq, passive=True)
                depths[base] = queue.declaration_result.message_count or 0
            return depths

    # --- the services ----------------------------------------------------------------------

    async def readiness(self) -> dict[str, int]:
        """/readyz status per service (0: no answer)."""
        assert self._session is not None

        async def one(port: int) -> int:
            try:
                async with self._session.get(f"http://127.0.0.1:{port}/readyz") as response:  # type: ignore[union-attr]
                    return response.status
            except (aiohttp.ClientError, TimeoutError):
                return 0

        statuses = await asyncio.gather(*(one(p) for p in self.ports.values()))
        return dict(zip(self.ports, statuses, strict=True))

    async def wait_ready(self, timeout_s: float) -> float:
        """Seconds until every service answered ready."""
        started = time.monotonic()
        while True:
            statuses = await self.readiness()
            if all(s == 200 for s in statuses.values()):
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"not ready after {timeout_s:g} s: {statuses}")
            if self.process is not None and self.process.returncode is not None:
                raise RuntimeError(f"payhooks run all exited with {self.process.returncode}")
            await asyncio.sleep(0.25)

    def copies(self, service: str) -> list[int]:
        """The pids of every running `payhooks run <service>` child of the supervisor."""
        assert self.process is not None
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                argv = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent == self.process.pid and argv[-2:] == [b"run", service.encode()]:
                found.append(int(entry.name))
        return sorted(found)

    def service_pid(self, service: str) -> int:
        """The pid of the running `payhooks run <service>` child of the supervisor (its
        first copy)."""
        if found := self.copies(service):
            return found[0]
        raise LookupError(f"no running {service} process")

    async def monitored_consumers(self) -> dict[str, float]:
        """`payhooks_queue_consumers` per work queue as the api's monitor last saw it."""
        assert self._session is not None
        url = f"http://127.0.0.1:{self.ports['api']}/metrics"
        async with self._session.get(url) as response:
            text = await response.text()
        return {
            s.labels["queue"]: s.value
            for family in text_string_to_metric_families(text)
            if family.name == "payhooks_queue_consumers"
            for s in family.samples
        }

    def kill(self, service: str) -> None:
        os.kill(self.service_pid(service), signal.SIGKILL)

    def service_pids(self) -> dict[str, int]:
        found = {}
        for service in SERVICES:
            with contextlib.suppress(LookupError):
                found[service] = self.service_pid(service)
        return found
