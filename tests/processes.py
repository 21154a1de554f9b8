"""Real service processes for crash tests: `payhooks run <service>` started, killed, awaited.

Each process gets its own HTTP port (so parallel processes never clash) and its own
PostgreSQL `application_name` (so a test can find that very process's sessions in
pg_stat_activity). Output goes to a log file the failure messages quote.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.processes import free_port, ports_for
from shared.config import Settings
from tests.helpers import eventually

PORT_VARIABLES = {
    "ingest": "INGEST_PORT",
    "orders": "ORDERS_PORT",
    "bonuses": "BONUSES_PORT",
    "email": "EMAIL_PORT",
}
# Passed through from the test's own environment; everything payhooks reads is set explicitly.
_INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH")
_REPO = Path(__file__).resolve().parent.parent
_LOG_TAIL_CHARS = 4000


RUN_ALL_PORTS = (
    "INGEST_PORT",
    "API_PORT",
    "ORDERS_PORT",
    "BONUSES_PORT",
    "EMAIL_PORT",
    "SMTP_PORT",
)


def run_all_env(settings: Settings) -> tuple[dict[str, str], dict[str, int]]:
    """The environment for `payhooks run all` on the test's database and queue prefix, every
    service on a free port; and those ports."""
    ports = ports_for(RUN_ALL_PORTS)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "DATABASE_URL": settings.database_url,
        "AMQP_URL": settings.amqp_url,
        "AMQP_PREFIX": settings.amqp_prefix,
        "LOG_LEVEL": "WARNING",
        **{name: str(port) for name, port in ports.items()},
    }
    return env, ports


def payhooks_command() -> list[str]:
    """The console script pyproject installs, next to the interpreter running the tests."""
    script = Path(sys.executable).with_name("payhooks")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "services.cli"]


def with_application_name(database_url: str, name: str) -> str:
    """The URL with `application_name` set (asyncpg passes unknown query keys as settings)."""
    parts = urlsplit(database_url)
    query = "&".join(q for q in (parts.query, urlencode({"application_name": name})) if q)
    return urlunsplit(parts._replace(query=query))


class ServiceProcess:
    """One running `payhooks run <service>`."""

    def __init__(self, service: str, label: str, port: int, env: Mapping[str, str], log: Path):
        self.service = service
        self.label = label  # its PostgreSQL application_name
        self.port = port
        self.log_path = log
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                [*payhooks_command(), "run", service],
                env=dict(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=_REPO,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def output(self) -> str:
        text = self.log_path.read_text(errors="replace")
        return text[-_LOG_TAIL_CHARS:]

    def describe(self) -> str:
        return f"{self.label} (pid {self.pid}, rc {self.popen.poll()}), output:\n{self.output()}"

    async def _get(self, path: str) -> tuple[int, str] | None:
        """Status and body of GET path; None while nothing listens on the port."""
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session,
                session.get(self.url(path)) as response,
            ):
                return response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Poll GET /readyz until 200 (PostgreSQL and RabbitMQ connected, topology declared)."""

        async def probe() -> int | None:
            if not self.running:
                raise AssertionError(f"{self.describe()}\nexited before it was ready")
            answer = await self._get("/readyz")
            return None if answer is None else answer[0]

        try:
            await eventually(probe, lambda status: status == 200, timeout_s=timeout_s)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.describe()}") from None

    async def listening(self) -> bool:
        return await self._get("/healthz") is not None

    async def processed(self, outcome: str) -> float:
        """This process's payhooks_messages_processed_total for `outcome`."""
        answer = await self._get("/metrics")
        if answer is None:
            return 0.0
        for family in text_string_to_metric_families(answer[1]):
            for sample in family.samples:
                if (
                    sample.name == "payhooks_messages_processed_total"
                    and sample.labels.get("outcome") == outcome
                ):
                    return sample.value
        return 0.0

    def kill(self) -> None:
        """SIGKILL and reap: the process gets no chance to ack, commit or close anything."""
        if self.running:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def terminate(self) -> None:
        self.popen.send_signal(signal.SIGTERM)

    async def wait_exit(self, timeout_s: float) -> int:
        async def probe() -> int | None:
            return await asyncio.sleep(0, self.popen.poll())

        try:
            code = await eventually(probe, lambda rc: rc is not None, timeout_s=timeout_s)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.describe()}") from None
        assert code is not None
        return code


class ServiceProcesses:
    """Starts services with a shared base environment; `close()` kills every one still alive."""

    def __init__(self, base_env: Mapping[str, str], log_dir: Path, *, tag: str) -> None:
        self._base_env = dict(base_env)
        self._log_dir = log_dir
        self._tag = tag  # unique per test: labels never collide with another test's sessions
        self.started: list[ServiceProcess] = []

    def start(self, service: str, **env: str) -> ServiceProcess:
        """Start `payhooks run <service>`; keyword arguments override environment variables."""
        label = f"{self._tag}{service}-{len(self.started)}"
        port = free_port()
        full_env = {k: os.environ[k] for k in _INHERITED if k in os.environ}
        full_env.update(self._base_env)
        full_env["DATABASE_URL"] = with_application_name(full_env["DATABASE_URL"], label)
        full_env[PORT_VARIABLES[service]] = str(port)
        full_env.update(env)
        process = ServiceProcess(service, label, port, full_env, self._log_dir / f"{label}.log")
        self.started.append(process)
        return process

    async def start_ready(self, service: str, **env: str) -> ServiceProcess:
        process = self.start(service, **env)
        await process.wait_ready()
        return process

    def close(self) -> None:
        for process in self.started:
            process.kill()
