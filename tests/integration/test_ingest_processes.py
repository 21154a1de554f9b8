"""INGEST_PROCESSES=2: `payhooks run ingest` runs two copies on one port (SO_REUSEPORT).

Connections spread over both copies, every 200 is one row and one message, /metrics on either
copy counts the webhooks of both, SIGTERM stops all of them gracefully; a copy that dies ends
the others (the process manager restarts the whole), and copies whose supervisor was killed
stop by themselves instead of serving on unseen.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aio_pika.abc import AbstractChannel
from prometheus_client.parser import text_string_to_metric_families

from shared.amqp.topology import Topology
from shared.config import Settings
from tests.conftest import TEST_SECRETS
from tests.helpers import delivery, drain, eventually, payment_event
from tests.processes import ServiceProcess, ServiceProcesses

WEBHOOKS = 40
STOP_TIMEOUT_S = 25.0  # the services' own graceful stop is bounded at 15 s


@pytest.fixture
async def processes(
    settings: Settings, topology: Topology, amqp: AbstractChannel, db: Any, tmp_path: Path
) -> AsyncIterator[ServiceProcesses]:
    env = {
        "DATABASE_URL": settings.database_url,
        "AMQP_URL": settings.amqp_url,
        "AMQP_PREFIX": settings.amqp_prefix,
        "XHUB_WEBHOOK_SECRETS": ",".join(TEST_SECRETS),
        "INGEST_PROCESSES": "2",
        "LOG_LEVEL": "WARNING",
    }
    started = ServiceProcesses(env, tmp_path, tag=settings.amqp_prefix)
    try:
        yield started
    finally:
        children = [pid for p in started.started for pid in _children(p.pid)]
        started.close()
        for pid in children:  # killed supervisor: its copies stop by themselves
            await _gone(pid)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


async def _gone(pid: int) -> None:
    await eventually(
        lambda: asyncio.sleep(0, _alive(pid)), lambda alive: not alive, timeout_s=STOP_TIMEOUT_S
    )


def _established_to(port: int) -> set[int]:
    """Socket inodes of the server ends of established TCP connections on `port`."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01":
                inodes.add(int(fields[9]))
    return inodes


def _sockets_of(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


async def _copies(ingest: ServiceProcess) -> list[int]:
    copies: list[int] = await eventually(
        lambda: asyncio.sleep(0, _children(ingest.pid)), lambda pids: len(pids) == 2
    )
    return copies


async def test_two_copies_share_the_port_the_work_and_the_metrics(
    processes: ServiceProcesses, settings: Settings, db: Any, amqp: Any, topology: Topology
) -> None:
    ingest = await processes.start_ready("ingest")
    copies = await _copies(ingest)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def post(n: int) -> int:
            body, headers = delivery(payment_event(), TEST_SECRETS[0], event_id=f"evt_{n}")
            async with session.post(ingest.url("/webhooks/xhub"), data=body, headers=headers) as r:
                return r.status

        statuses = await asyncio.gather(*(post(n) for n in range(WEBHOOKS)))
        assert Counter(statuses) == {200: WEBHOOKS}, ingest.describe()
        # The session keeps its connections open: each copy holds some of them.
        established = _established_to(ingest.port)
        held = {pid: len(_sockets_of(pid) & established) for pid in copies}
        assert all(n > 0 for n in held.values()), held

        for _ in range(4):  # whichever copy answers, it counts both copies' webhooks
            async with aiohttp.ClientSession() as fresh, fresh.get(ingest.url("/metrics")) as r:
                text = await r.text()
            accepted = [
                s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
                if s.name == "payhooks_webhooks_received_total"
                and s.labels["outcome"] == "accepted"
            ]
            assert accepted == [WEBHOOKS]
            assert "process_resident_memory_bytes" not in text
            assert text.count("payhooks_build_info{") == 1

    assert await db.fetchval("SELECT count(*) FROM inbox") == WEBHOOKS
    messages = await drain(amqp, topology.work["orders"].name)
    assert sorted(m.message_id or "" for m in messages) == sorted(
        f"evt_{n}" for n in range(WEBHOOKS)
    )

    ingest.terminate()
    assert await ingest.wait_exit(STOP_TIMEOUT_S) == 0
    assert not any(_alive(pid) for pid in copies)


async def test_a_copy_that_dies_ends_the_others_and_the_supervisor_fails(
    processes: ServiceProcesses,
) -> None:
    ingest = await processes.start_ready("ingest")
    first, second = await _copies(ingest)

    os.kill(first, signal.SIGKILL)

    assert await ingest.wait_exit(STOP_TIMEOUT_S) != 0
    assert not _alive(second)
    assert "service.process_exited" in ingest.output()


async def test_copies_of_a_killed_supervisor_stop_by_themselves(
    processes: ServiceProcesses,
) -> None:
    ingest = await processes.start_ready("ingest")
    copies = await _copies(ingest)

    ingest.kill()

    for pid in copies:
        await _gone(pid)
    assert "service.supervisor_gone" in ingest.output()
