"""`payhooks run all`: every service as its own process, restarted when it dies, all stopped
together on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp

from services.cli.run_all import dev_environment, left_out
from shared.config import Settings
from tests.helpers import eventually
from tests.processes import payhooks_command, run_all_env


async def ready(session: aiohttp.ClientSession, port: int) -> int:
    try:
        async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
            return response.status
    except aiohttp.ClientError:
        return 0


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode(errors="replace")


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


async def test_run_all_starts_every_service_restarts_a_dead_one_and_stops_them_all(
    settings: Settings, amqp: object, db: object
) -> None:
    env, ports = run_all_env(settings)
    process = await asyncio.create_subprocess_exec(
        *payhooks_command(),
        "run",
        "all",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with aiohttp.ClientSession() as session:
            services = [p for name, p in ports.items() if name != "SMTP_PORT"]
            for port in services:
                await eventually(
                    lambda port=port: ready(session, port),  # type: ignore[misc]
                    lambda s: s == 200,
                    timeout_s=30,
                )
            assert len(children_of(process.pid)) == 6  # five services and the SMTP sink

            # Kill one service the hard way: the supervisor brings it back.
            victim = next(pid for pid in children_of(process.pid) if "orders" in cmdline(pid))
            os.kill(victim, signal.SIGKILL)
            await eventually(
                lambda: ready(session, ports["ORDERS_PORT"]), lambda s: s == 0, timeout_s=10
            )
            await eventually(
                lambda: ready(session, ports["ORDERS_PORT"]), lambda s: s == 200, timeout_s=30
            )
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(40):
            output, _ = await process.communicate()
    text = output.decode(errors="replace")
    assert process.returncode == 0, text[-2000:]
    assert "generated for this run (dev only): XHUB_WEBHOOK_SECRETS=" in text
    assert "orders | " in text or "exited with -9" in text
    assert "exited with -9; restarting" in text
    assert children_of(process.pid) == []


def test_secrets_given_as_files_are_neither_generated_nor_missing() -> None:
    files = {
        "XHUB_WEBHOOK_SECRETS_FILE": "/run/secrets/xhub",
        "ADMIN_TOKEN_FILE": "/run/secrets/admin",
        "XHUB_API_URL": "http://127.0.0.1:8090",
        "XHUB_API_KEY_FILE": "/run/secrets/xhub-api",
    }

    child, announced = dev_environment(files)

    assert child == files  # a generated XHUB_WEBHOOK_SECRETS beside its _FILE would be refused
    assert announced == []
    assert left_out(files) == {}  # the reconciler has its key
    # X-Hub's webhooks without its API: the reconciler would only fail on its configuration.
    assert left_out({"XHUB_WEBHOOK_SECRETS": "s", "ADMIN_TOKEN": "t"}) == {
        "reconciler": ["XHUB_API_URL", "XHUB_API_KEY"]
    }
    # No X-Hub at all (Stripe's API alone): it starts, asks Stripe and keeps the retention.
    assert "reconciler" not in left_out({"STRIPE_API_KEY": "sk", "ADMIN_TOKEN": "t"})
