"""Operators' worker controls in PostgreSQL (shared/queries/worker_controls.py,
shared/ops/operator_actions.py): each action audited and NOTIFYed, a pause never
overwritten, and the rate cap's shared token bucket holding its rate for takers on two
connection pools at once (two replicas)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from shared.db import create_pool
from shared.ops.operator_actions import (
    Edge,
    Operator,
    WorkerStateError,
    pause_worker_recorded,
    resume_worker_recorded,
    throttle_worker_recorded,
    unthrottle_worker_recorded,
)
from shared.queries import worker_controls as worker_sql

OPERATOR = Operator("alice", Edge.API)


@pytest.fixture
async def controls(db: Any) -> AsyncIterator[Any]:
    await db.execute("TRUNCATE worker_controls")
    yield db
    await db.execute("TRUNCATE worker_controls")


async def test_a_pause_is_recorded_notified_and_never_overwritten(
    controls: Any, migrated_database: str
) -> None:
    heard: list[str] = []
    listener = await asyncpg.connect(migrated_database)
    await listener.add_listener(worker_sql.CHANNEL, lambda *args: heard.append(args[3]))
    try:
        paused = await pause_worker_recorded(controls, "email", "SMTP provider incident", OPERATOR)
        assert paused.controls.paused_by == "alice"
        with pytest.raises(WorkerStateError, match="paused already, by alice"):
            await pause_worker_recorded(controls, "email", "another reason", OPERATOR)
        now = await worker_sql.controls(controls, "email")
        assert now.paused_reason == "SMTP provider incident"
        resumed = await resume_worker_recorded(controls, "email", Operator("bob", Edge.CLI))
        assert resumed.previous["paused_by"] == "alice"
        assert not resumed.controls.paused
        with pytest.raises(WorkerStateError, match="not paused"):
            await resume_worker_recorded(controls, "email", OPERATOR)
        await asyncio.sleep(0.2)
    finally:
        await listener.close()
    assert heard == ["email", "email"]
    rows = await controls.fetch(
        "SELECT actor, source, action, target, filter FROM operator_actions ORDER BY id"
    )
    assert [(r["actor"], r["source"], r["action"], r["target"]) for r in rows] == [
        ("alice", "api", "worker.pause", "email"),
        ("bob", "cli", "worker.resume", "email"),
    ]
    assert rows[0]["filter"] == {"reason": "SMTP provider incident"}
    assert rows[1]["filter"]["paused_by"] == "alice"


async def test_a_throttle_replaces_a_cap_and_unthrottle_lifts_it(controls: Any) -> None:
    await throttle_worker_recorded(controls, "orders", 5.0, OPERATOR)
    changed = await throttle_worker_recorded(controls, "orders", 8.0, OPERATOR)
    assert changed.previous == {"rate_limit_per_second": 5.0}
    assert changed.controls.per_second == 8.0
    lifted = await unthrottle_worker_recorded(controls, "orders", OPERATOR)
    assert lifted.previous == {"rate_limit_per_second": 8.0}
    assert await worker_sql.take(controls, "orders", 10) is None
    with pytest.raises(WorkerStateError, match="no rate limit"):
        await unthrottle_worker_recorded(controls, "orders", OPERATOR)
    actions = await controls.fetchval("SELECT array_agg(action ORDER BY id) FROM operator_actions")
    assert actions == ["worker.throttle", "worker.throttle", "worker.unthrottle"]


async def test_two_replicas_taking_from_one_bucket_share_its_rate(
    controls: Any, migrated_database: str
) -> None:
    rate, run_s = 40.0, 3.0
    await throttle_worker_recorded(controls, "bonuses", rate, OPERATOR)
    pools = [await create_pool(migrated_database, max_size=2) for _ in range(2)]
    granted = [0, 0]

    async def replica(n: int) -> None:
        deadline = time.monotonic() + run_s
        while time.monotonic() < deadline:
            taken = await worker_sql.take(pools[n], "bonuses", 7)
            assert taken is not None
            granted[n] += taken.granted
            await asyncio.sleep(0.005)

    try:
        await asyncio.gather(replica(0), replica(1))
    finally:
        for pool in pools:
            await pool.close()
    # At most the rate times the time plus the one bucketful it may have filled to before the
    # first take (it starts empty when the cap is set), and close to the rate.
    assert sum(granted) <= rate * run_s + rate
    assert sum(granted) >= rate * run_s * 0.8
    assert min(granted) > 0, granted
