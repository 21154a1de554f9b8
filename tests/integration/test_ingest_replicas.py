"""Several ingest replicas on one database and broker (SPEC section 3, the concurrent row).

A copy whose row another replica holds the publish claim on waits for that publish, or takes
the claim over when it is released or lapses: all 200, one row, one message.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from typing import Any

from aiohttp.test_utils import TestClient

from services.ingest.accept import AcceptorConfig
from services.ingest.app import create_app
from shared.broker import BROKER
from shared.config import Settings
from shared.topology import Topology
from tests.conftest import TEST_SECRETS
from tests.helpers import delivery, drain, payment_event

SECRET = TEST_SECRETS[0]
URL = "/webhooks/xhub"
# Keeps the sweepers out of the way where a test strands a claim on purpose.
NO_SWEEP_S = 3600.0


async def _replica(aiohttp_client: Any, settings: Settings, **app_kw: Any) -> TestClient:
    app = create_app(settings, **app_kw)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    return client


async def _post_all(
    clients: list[TestClient], body: bytes, headers: dict[str, str], copies: int
) -> list[tuple[int, str]]:
    async def one(client: TestClient) -> tuple[int, str]:
        response = await client.post(URL, data=body, headers=headers)
        return response.status, (await response.json())["status"]

    return await asyncio.gather(*(one(clients[i % len(clients)]) for i in range(copies)))


async def _hold_claim(db: Any, event_id: str, body: bytes, lease_s: float) -> None:
    """The row as another replica leaves it that stored the event and then went silent."""
    await db.execute(
        "INSERT INTO inbox (provider, event_id, event_type, body, headers, claim_token,"
        " claimed_until) VALUES ('xhub', $1, 'payment.status_changed', $2, '{}', $3,"
        " now() + make_interval(secs => $4))",
        event_id,
        body,
        uuid.uuid4(),
        lease_s,
    )


async def test_concurrent_copies_split_between_replicas_are_all_200_and_published_once(
    aiohttp_client: Any, settings: Settings, db: Any, amqp: Any, topology: Topology
) -> None:
    replicas = [await _replica(aiohttp_client, settings) for _ in range(2)]
    event_ids = [f"evt_split_{n}_{uuid.uuid4().hex[:8]}" for n in range(10)]

    for event_id in event_ids:
        body, headers = delivery(payment_event(), SECRET, event_id=event_id)
        answers = await _post_all(replicas, body, headers, copies=20)
        assert Counter(answers) == {(200, "accepted"): 1, (200, "duplicate"): 19}, event_id

    rows = await db.fetch("SELECT event_id, published_at FROM inbox")
    assert sorted(r["event_id"] for r in rows) == sorted(event_ids)
    assert all(r["published_at"] is not None for r in rows)
    messages = await drain(amqp, topology.work["orders"].name)
    assert sorted(m.message_id or "" for m in messages) == sorted(event_ids)


async def test_copy_takes_over_a_silent_replicas_claim_when_it_lapses_and_publishes_once(
    aiohttp_client: Any, settings: Settings, db: Any, amqp: Any, topology: Topology
) -> None:
    replicas = [
        await _replica(aiohttp_client, settings, sweep_interval_s=NO_SWEEP_S) for _ in range(2)
    ]
    event_id = f"evt_silent_{uuid.uuid4().hex}"
    body, headers = delivery(payment_event(), SECRET, event_id=event_id)
    await _hold_claim(db, event_id, body, lease_s=1.0)

    started = time.monotonic()
    answers = await _post_all(replicas, body, headers, copies=6)
    elapsed_s = time.monotonic() - started

    assert answers == [(200, "duplicate")] * 6
    assert elapsed_s >= 0.9  # they waited out the silent holder's lease
    messages = await drain(amqp, topology.work["orders"].name)
    assert [(m.message_id, m.body) for m in messages] == [(event_id, body)]
    [row] = await db.fetch("SELECT published_at FROM inbox")
    assert row["published_at"] is not None


async def test_copy_is_503_when_another_holder_neither_publishes_nor_lets_go_in_time(
    aiohttp_client: Any, settings: Settings, db: Any, amqp: Any, topology: Topology
) -> None:
    client = await _replica(
        aiohttp_client,
        settings,
        sweep_interval_s=NO_SWEEP_S,
        acceptor_config=AcceptorConfig(holder_wait_s=0.5),
    )
    event_id = f"evt_held_{uuid.uuid4().hex}"
    body, headers = delivery(payment_event(), SECRET, event_id=event_id)
    await _hold_claim(db, event_id, body, lease_s=30.0)

    started = time.monotonic()
    response = await client.post(URL, data=body, headers=headers)
    elapsed_s = time.monotonic() - started

    assert response.status == 503
    assert response.headers["Retry-After"]
    assert 0.4 <= elapsed_s < 3.0
    assert await drain(amqp, topology.work["orders"].name) == []
    [row] = await db.fetch("SELECT published_at FROM inbox")
    assert row["published_at"] is None
