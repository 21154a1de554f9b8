"""X-Hub's breaker-release burst (seed 000) against a real `payhooks run ingest` process, with
real PostgreSQL and RabbitMQ: the simulator's merchant breaker is open (as after an outage of
ours), every delivery is held behind it, its probe passes after the 5-minute pause, and the
backlog of 10,000 goes at once, each delivery on its own connection and timed from the
release (sent by bench/raw_http.py's lean client: aiohttp's would measure mostly itself).
Every one must be answered 200 within X-Hub's 10 s, none FAILED at the simulator, each stored
once and published once (docs/ingest-burst.md).

Before admission by predicted wait, ingest refused all but 1,024 requests in flight and 512
waiting for a batch with an immediate 503: most of this burst (measured: 9,033 of 10,000).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aio_pika.abc import AbstractChannel
from prometheus_client.parser import text_string_to_metric_families

from bench.raw_http import OneShotSender
from services.sim.burst import BUDGET_S, LARGEST_BACKLOG, figures
from services.sim.deliverer import TIMEOUT_S, Deliverer, Result, SimWebhook
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.process.file_limit import raise_to_hard_limit
from shared.providers.xhub.events import status_changed
from tests.conftest import TEST_SECRETS
from tests.helpers import eventually
from tests.processes import ServiceProcess, ServiceProcesses

# The probe goes first, alone; the rest of the backlog then goes at once.
HELD = LARGEST_BACKLOG + 1
# Provider time 100x faster: the breaker's 5-minute pause takes 3 s.
TIME_SCALE = 100.0
# This process holds a connection per released delivery, ingest one per request.
FILES_NEEDED = HELD + 1_000


@pytest.fixture
async def processes(
    settings: Settings, topology: Topology, amqp: AbstractChannel, db: Any, tmp_path: Path
) -> AsyncIterator[ServiceProcesses]:
    env = {
        "DATABASE_URL": settings.database_url,
        "AMQP_URL": settings.amqp_url,
        "AMQP_PREFIX": settings.amqp_prefix,
        "XHUB_WEBHOOK_SECRETS": ",".join(TEST_SECRETS),
        "LOG_LEVEL": "WARNING",
    }
    started = ServiceProcesses(env, tmp_path, tag=settings.amqp_prefix)
    try:
        yield started
    finally:
        started.close()


def _backlog(prefix: str) -> list[SimWebhook]:
    return [
        SimWebhook(
            event_id=f"evt_{prefix}{n:05d}",
            merchant_id="merchant_burst",
            payload=status_changed(
                f"pay_{prefix}{n:05d}",
                "paid",
                "100.00",
                "USD",
                "2026-12-05T10:00:00+00:00",
                external_id=f"ord_{prefix}{n:05d}",
            ),
        )
        for n in range(HELD)
    ]


async def _received(ingest: ServiceProcess) -> Counter[str]:
    """payhooks_webhooks_received_total by outcome, from the process's /metrics."""
    async with aiohttp.ClientSession() as session, session.get(ingest.url("/metrics")) as r:
        text = await r.text()
    return Counter(
        {
            s.labels["outcome"]: int(s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "payhooks_webhooks_received_total"
        }
    )


@pytest.mark.timeout(150)
async def test_a_breaker_release_burst_of_10000_is_answered_200_within_the_budget(
    processes: ServiceProcesses,
    settings: Settings,
    db: Any,
    amqp: AbstractChannel,
    topology: Topology,
) -> None:
    open_files = raise_to_hard_limit()
    assert open_files >= FILES_NEEDED, (
        f"the burst needs {FILES_NEEDED} open files in this process and in ingest; the limit is"
        f" {open_files} (ulimit -n)"
    )
    ingest = await processes.start_ready("ingest")
    prefix = settings.amqp_prefix.replace(".", "_")
    backlog = _backlog(prefix)

    async with Deliverer(
        ingest.url(""),
        TEST_SECRETS[0].encode(),
        time_scale=TIME_SCALE,
        breakers_open=True,
        # aiohttp's client would spend more of the two cores than ingest does (bench.burst).
        sender=OneShotSender(TIMEOUT_S),
    ) as deliverer:
        records = await asyncio.gather(*(deliverer.deliver(w) for w in backlog))

    burst = figures(records)
    results = Counter(r.result for r in records)
    answers = Counter(code for r in records for code in r.http_statuses)
    story = f"{burst.render()}; answers {dict(answers)}; releases {len(deliverer.releases)}"
    assert len(deliverer.releases) == 1, story  # one probe passed, one release
    assert burst.released == LARGEST_BACKLOG, story
    assert results == {Result.DELIVERED: HELD}, story
    assert answers == {200: HELD}, (story, ingest.describe())  # no 5xx, no timeout
    assert burst.max_latency_s < BUDGET_S, story
    assert (await _received(ingest))["accepted"] == HELD

    ids = [w.event_id for w in backlog]
    stored = await db.fetchrow(
        "SELECT count(*) AS rows, count(DISTINCT event_id) AS events FROM inbox"
        " WHERE event_id = ANY($1::text[])",
        ids,
    )
    assert (stored["rows"], stored["events"]) == (HELD, HELD)
    # Published: every confirm marked in the inbox, and one message per event in the queue.
    await eventually(
        lambda: db.fetchval("SELECT count(*) FROM inbox_unpublished"),
        lambda unpublished: unpublished == 0,
        timeout_s=15,
    )
    queue = await amqp.declare_queue(topology.work["orders"].name, passive=True)
    assert queue.declaration_result.message_count == HELD
