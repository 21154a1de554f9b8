"""`payhooks run all`: every configured service as its own process on one machine, output
prefixed by service, restarted with a growing backoff, all stopped together on Ctrl-C/SIGTERM.
`--replicas N` runs N copies of each, competing for the same work (docs/configuration.md)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.cli.registry import SERVICES
from shared.config import Settings, is_set

_COLOURS = ("36", "33", "35", "32", "34", "31")
_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
# A run this long counts as healthy again: the next crash starts the backoff from the top.
_STABLE_AFTER_S = 60.0
_STOP_GRACE_S = 20.0
# Replica r (counted from 0) of a service listens on its port + REPLICA_PORT_STEP * r: with the
# defaults (8080, 8081, 9101-9104) up to ten replicas never share a port.
REPLICA_PORT_STEP = 10
MAX_REPLICAS = 10
# The variable naming each service's port (shared/config.py reads it).
PORT_VARIABLES = {
    "ingest": "INGEST_PORT",
    "orders": "ORDERS_PORT",
    "bonuses": "BONUSES_PORT",
    "email": "EMAIL_PORT",
    "api": "API_PORT",
    "reconciler": "RECONCILER_PORT",
}


@dataclass(frozen=True, slots=True)
class Program:
    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()  # set for this program only (a replica's port)


def left_out(env: Mapping[str, str]) -> dict[str, list[str]]:
    """Services that would only fail on their configuration, with the variables they lack
    (the reconciler without the provider's API, in local development)."""
    missing = {
        name: [v for v in service.required_env(env) if not is_set(env, v)]
        for name, service in SERVICES.items()
    }
    return {name: lacking for name, lacking in missing.items() if lacking}


def programs(env: Mapping[str, str], replicas: int = 1) -> list[Program]:
    payhooks = (sys.executable, "-m", "services.cli")
    skipped = left_out(env)
    settings = Settings.from_env(env)
    found = [
        replica
        for name in SERVICES
        if name not in skipped
        for replica in _replicas(name, (*payhooks, "run", name), settings, replicas)
    ]
    if _wants_dev_smtp(env):
        port = env.get("SMTP_PORT", "1025")
        found.append(
            Program(
                "smtp",
                (
                    sys.executable,
                    "-m",
                    "aiosmtpd",
                    "-n",
                    "-l",
                    f"127.0.0.1:{port}",
                    "-c",
                    "services.cli.dev_smtp.Printer",
                ),
            )
        )
    return found


def _replicas(name: str, argv: tuple[str, ...], settings: Settings, replicas: int) -> list[Program]:
    if replicas == 1:
        return [Program(name, argv)]
    port = SERVICES[name].port(settings)
    return [
        Program(
            f"{name}#{r + 1}", argv, ((PORT_VARIABLES[name], str(port + REPLICA_PORT_STEP * r)),)
        )
        for r in range(replicas)
    ]


def _wants_dev_smtp(env: Mapping[str, str]) -> bool:
    """A local SMTP sink only when SMTP points at this machine, nothing listens there, and
    aiosmtpd is installed (the dev dependencies)."""
    if env.get("SMTP_HOST", "127.0.0.1") not in ("127.0.0.1", "localhost"):
        return False
    try:
        import aiosmtpd  # noqa: F401  (only checking that it is installed)
    except ImportError:
        return False
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", int(env.get("SMTP_PORT", "1025")))) != 0


def dev_environment(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The environment for the children; generated secrets for what is missing (announced
    once, never logged by the services)."""
    child = dict(env)
    announced = []
    for name in ("XHUB_WEBHOOK_SECRETS", "ADMIN_TOKEN|ADMIN_TOKENS"):
        if not is_set(child, name):
            first = name.split("|")[0]
            child[first] = secrets.token_urlsafe(24)
            announced.append(f"{first}={child[first]}")
    return child, announced


async def _pump(stream: asyncio.StreamReader, label: str) -> None:
    while line := await stream.readline():
        sys.stdout.write(f"{label} {line.decode(errors='replace')}")
        sys.stdout.flush()


async def _keep_running(
    program: Program, colour: str, env: Mapping[str, str], stopping: asyncio.Event
) -> None:
    label = (
        f"\033[{colour}m{program.name:>8} |\033[0m"
        if sys.stdout.isatty()
        else (f"{program.name:>8} |")
    )
    failures = 0
    while not stopping.is_set():
        started = asyncio.get_running_loop().time()
        process = await asyncio.create_subprocess_exec(
            *program.argv,
            env={**env, **dict(program.env)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the supervisor only; it stops the children
        )
        assert process.stdout is not None  # we asked for a pipe
        pump = asyncio.create_task(_pump(process.stdout, label))
        waiter = asyncio.create_task(process.wait())
        stop = asyncio.create_task(stopping.wait())
        await asyncio.wait({waiter, stop}, return_when=asyncio.FIRST_COMPLETED)
        if stopping.is_set() and process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(_STOP_GRACE_S):
                    await waiter
            except TimeoutError:
                process.kill()
                await waiter
        stop.cancel()
        await pump
        if stopping.is_set():
            return
        ran_s = asyncio.get_running_loop().time() - started
        failures = 0 if ran_s > _STABLE_AFTER_S else failures + 1
        delay = _BACKOFF_S[min(failures, len(_BACKOFF_S)) - 1] if failures else _BACKOFF_S[0]
        print(f"{label} exited with {process.returncode}; restarting in {delay:.0f}s", flush=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await stopping.wait()


async def run_all(env: Mapping[str, str], announce: Sequence[str] = (), replicas: int = 1) -> int:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    for line in announce:
        print(f"payhooks: generated for this run (dev only): {line}", flush=True)
    found = programs(env, replicas)
    print("payhooks: starting " + ", ".join(p.name for p in found), flush=True)
    for name, lacking in left_out(env).items():
        print(f"payhooks: not starting {name}: {', '.join(lacking)} not set", flush=True)
    await asyncio.gather(
        *(_keep_running(p, _COLOURS[i % len(_COLOURS)], env, stopping) for i, p in enumerate(found))
    )
    print("payhooks: all services stopped", flush=True)
    return 0


def main(env: Mapping[str, str] | None = None, replicas: int = 1) -> int:
    child, announce = dev_environment(os.environ if env is None else env)
    if sys.stdout.isatty():
        # The children write into a pipe (to be prefixed) but a person reads the terminal.
        child.setdefault("LOG_FORMAT", "console")
    return asyncio.run(run_all(child, announce, replicas))
