"""The README's "Try it with curl" walkthrough, run as written against `payhooks run all`
(its own ids, ports and queue prefix): the commands a newcomer copies must work."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path

import aiohttp

from shared.config import Settings
from tests.helpers import eventually
from tests.processes import payhooks_command, run_all_env

README = Path(__file__).resolve().parents[2] / "README.md"


def walkthrough() -> list[str]:
    """The shell lines of the section's code block, comments and continuations joined."""
    section = README.read_text().split("\n## Try it with curl\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "the walkthrough lost its code block"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    return [line.split("  #")[0].strip() for line in lines if line and not line.startswith("#")]


async def _ready(session: aiohttp.ClientSession, port: int) -> int:
    try:
        async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
            return response.status
    except aiohttp.ClientError:
        return 0


async def test_the_readme_walkthrough_works_as_written(settings: Settings, db: object) -> None:
    lines = walkthrough()
    assert lines[0] == "make run"  # started below as what it is: payhooks run all
    suffix = uuid.uuid4().hex[:8]
    env, ports = run_all_env(settings)
    # What `make run` sets when nothing is configured.
    env |= {"XHUB_WEBHOOK_SECRETS": "dev-secret", "ADMIN_TOKEN": "dev-admin-token"}
    payhooks = " ".join(payhooks_command())

    def as_here(line: str) -> str:
        for old in ("pay_1", "ord_1", "evt_1"):
            line = line.replace(old, f"{old}_{suffix}")
        line = line.replace("localhost:8080", f"localhost:{ports['INGEST_PORT']}")
        return line.replace(".venv/bin/payhooks", payhooks)

    supervisor = await asyncio.create_subprocess_exec(
        *payhooks_command(),
        "run",
        "all",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        async with aiohttp.ClientSession() as session:

            async def every_service_ready() -> list[int]:
                wanted = [p for name, p in ports.items() if name != "SMTP_PORT"]
                return [await _ready(session, port) for port in wanted]

            await eventually(every_service_ready, lambda s: set(s) == {200}, timeout_s=30)
        show = next(i for i, line in enumerate(lines) if " payment show " in line)
        script = "set -e\n" + "\n".join(as_here(line) for line in lines[1:show]) + "\n"
        ran = await asyncio.to_thread(
            subprocess.run,
            ["bash", "-c", script],
            env={**env, "PYTHONPATH": str(README.parent)},
            cwd=README.parent,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
        # The `send`, and the settlement by hand (a new event id: not a duplicate of evt_1).
        assert ran.stdout.count('"status":"accepted"') == 2, ran.stdout
        assert '"status":"duplicate"' not in ran.stdout, ran.stdout

        async def shown() -> dict[str, object]:
            out = await asyncio.to_thread(
                subprocess.run,
                [*as_here(lines[show]).split(), "--json"],
                env={**env, "PYTHONPATH": str(README.parent)},
                cwd=README.parent,
                capture_output=True,
                text=True,
                timeout=30,
            )
            return dict(json.loads(out.stdout)) if out.returncode == 0 else {}

        # What the README promises: SETTLED, +500 bonus, one email (whichever of the two
        # events the orders worker took first).
        view = await eventually(
            shown,
            lambda v: (
                bool(v)
                and v["order"]["status"] == "SETTLED"  # type: ignore[index]
                and len(v["emails"]) == 1  # type: ignore[arg-type]
                and len(v["bonus"]) == 1  # type: ignore[arg-type]
            ),
            timeout_s=30,
            interval_s=0.5,
        )
        assert view["bonus"][0]["points"] == 500  # type: ignore[index]
    finally:
        os.killpg(supervisor.pid, signal.SIGTERM)
        async with asyncio.timeout(40):
            await supervisor.wait()
