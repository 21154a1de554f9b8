"""Several ingest replicas on one database and broker (SPEC section 3, the concurrent row).

Concurrent copies spread over replicas: all 200, one row, at most one message per replica
(consumers dedup by message id; one publish holds within a replica). A copy of an event that
another replica stored but never published publishes it at once; sweepers running side by side
publish each stranded row once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from typing import Any

import asyncpg
from aiohttp.test_utils import TestClient

from services.ingest.app import create_app
from shared.amqp.broker import BROKER
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.ops.payment_view import payment_view
from shared.queries import inbox as inbox_sql
from tests.conftest import TEST_SECRETS
from tests.helpers import delivery, drain, eventually, payment_event

SECRET = TEST_SECRETS[0]
URL = "/webhooks/xhub"
# Keeps the sweepers out of the way where a test strands a row on purpose.
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


async def _store_unpublished(db: Any, event_id: str, body: bytes) -> None:
    """The row as a replica leaves it that stored the event and died before the confirm."""
    await db.execute(
        "WITH i AS (INSERT INTO inbox (provider, event_id, event_type, body, headers)"
        " VALUES ('xhub', $1, 'payment.status_changed', $2, '{}') RETURNING id, received_at),"
        " k AS (INSERT INTO inbox_keys (provider, event_id, id, received_at)"
        " SELECT 'xhub', $1, id, received_at FROM i)"
        " INSERT INTO inbox_unpublished (id, received_at) SELECT id, received_at FROM i",
        event_id,
        body,
    )


async def test_copies_split_between_replicas_are_200_one_row_at_most_one_publish_per_replica(
    aiohttp_client: Any, settings: Settings, db: Any, amqp: Any, topology: Topology
) -> None:
    replicas = [await _replica(aiohttp_client, settings) for _ in range(2)]
    event_ids = [f"evt_split_{n}_{uuid.uuid4().hex[:8]}" for n in range(10)]

    for event_id in event_ids:
        body, headers = delivery(payment_event(), SECRET, event_id=event_id)
        answers = await _post_all(replicas, body, headers, copies=20)
        assert Counter(answers) == {(200, "accepted"): 1, (200, "duplicate"): 19}, event_id

    rows = await db.fetch(
        "SELECT i.event_id, k.duplicates FROM inbox i JOIN inbox_keys k USING (id, received_at)"
    )
    assert sorted(r["event_id"] for r in rows) == sorted(event_ids)
    assert all(r["duplicates"] == 19 for r in rows)
    await eventually(
        lambda: db.fetchval("SELECT count(*) FROM inbox_unpublished"),
        lambda unpublished: unpublished == 0,
    )
    messages = Counter(m.message_id for m in await drain(amqp, topology.work["orders"].name))
    # At least once, and at most once per replica: copies within one replica share its
    # publish; a copy at the other replica may publish again (consumers dedup by message id).
    assert set(messages) == set(event_ids)
    assert max(messages.values()) <= len(replicas), messages


async def test_a_copy_publishes_at_once_what_a_dead_replica_stored_but_never_published(
    aiohttp_client: Any, settings: Settings, db: Any, amqp: Any, topology: Topology
) -> None:
    replicas = [
        await _replica(aiohttp_client, settings, sweep_interval_s=NO_SWEEP_S) for _ in range(2)
    ]
    event_id = f"evt_orphan_{uuid.uuid4().hex}"
    body, headers = delivery(payment_event(), SECRET, event_id=event_id)
    await _store_unpublished(db, event_id, body)

    started = time.monotonic()
    answers = await _post_all(replicas, body, headers, copies=6)
    elapsed_s = time.monotonic() - started

    assert answers == [(200, "duplicate")] * 6
    assert elapsed_s < 2.0  # no lease to wait out: the copies publish it themselves
    messages = await drain(amqp, topology.work["orders"].name)
    # At least once: each replica publishes it once (copies within a replica share one
    # publish); consumers dedup by message id.
    assert {(m.message_id, m.body) for m in messages} == {(event_id, body)}
    assert 1 <= len(messages) <= len(replicas)
    [row] = await db.fetch("SELECT duplicates FROM inbox_keys")
    assert await db.fetchval("SELECT count(*) FROM inbox_unpublished") == 0
    assert row["duplicates"] == 6


async def test_replicas_sweeping_together_publish_each_stranded_row_once(
    aiohttp_client: Any, settings: Settings, db: Any, amqp: Any, topology: Topology
) -> None:
    stranded = [f"evt_stranded_{n}_{uuid.uuid4().hex[:8]}" for n in range(40)]
    for event_id in stranded:
        body, _ = delivery(payment_event(), SECRET, event_id=event_id)
        await _store_unpublished(db, event_id, body)
    await db.execute("UPDATE inbox_unpublished SET received_at = now() - interval '1 minute'")

    for _ in range(3):
        await _replica(aiohttp_client, settings, sweep_interval_s=0.1)

    await eventually(
        lambda: db.fetchval("SELECT count(*) FROM inbox_unpublished"),
        lambda unpublished: unpublished == 0,
    )
    messages = await drain(amqp, topology.work["orders"].name)
    assert sorted(m.message_id or "" for m in messages) == sorted(stranded)


async def test_the_payment_view_tells_a_stored_event_from_a_published_one(db: Any) -> None:
    """SPEC: the operator's view of a payment says whether each webhook is in the broker."""
    event_id = f"evt_view_{uuid.uuid4().hex}"
    body, _ = delivery(payment_event(), SECRET, event_id=event_id)
    await _store_unpublished(db, event_id, body)
    await db.execute("UPDATE inbox SET payment_id = 'pay_view' WHERE event_id = $1", event_id)

    async def event() -> dict[str, Any]:
        view = await payment_view(db, "pay_view", [])
        assert view is not None
        [only] = view["events"]
        return {k: only[k] for k in ("published", "outcome")}

    assert await event() == {"published": False, "outcome": "stored, not yet published"}
    [row_id] = [r["id"] for r in await db.fetch("SELECT id FROM inbox")]
    await inbox_sql.mark_published(db, [row_id])
    assert await event() == {"published": True, "outcome": "queued"}


async def test_a_copy_that_waited_for_another_replicas_insert_is_not_taken_as_published(
    migrated_database: str, db: Any
) -> None:
    """Two replicas store the same new event at once: the second INSERT waits for the first
    transaction, whose row (and its unpublished row) commit after the second statement's
    snapshot. The second must see it as not yet published (it publishes again), never as
    confirmed: a 200 for an event that may not be in the broker yet (SPEC 3)."""
    event_id = f"evt_race_{uuid.uuid4().hex}"
    body, _ = delivery(payment_event(), SECRET, event_id=event_id)
    entry = inbox_sql.InboxEntry(event_id, "payment.status_changed", None, body, {})
    first = await asyncpg.connect(migrated_database)
    second = await asyncpg.connect(migrated_database)
    try:
        async with first.transaction():
            [stored] = await inbox_sql.store_batch(first, "xhub", [entry])
            copy = asyncio.create_task(inbox_sql.store_batch(second, "xhub", [entry]))
            await eventually(
                lambda: db.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE '%INSERT INTO inbox%'"
                ),
                lambda waiting: waiting == 1,
            )
        [copied] = await copy
    finally:
        await first.close()
        await second.close()

    assert (stored.inserted, stored.published) == (True, False)
    assert (copied.id, copied.inserted, copied.published) == (stored.id, False, False)
    # Once stored and marked, a later copy is answered as published.
    await inbox_sql.mark_published(db, [stored.id])
    [later] = await inbox_sql.store_batch(db, "xhub", [entry])
    assert (later.inserted, later.published) == (False, True)
