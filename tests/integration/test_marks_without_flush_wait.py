"""The marks whose loss in a crash only sends something again commit without waiting for the
WAL flush, in one statement: synchronous_commit is off for that statement's transaction and
for nothing after it."""

from __future__ import annotations

from typing import Any

from shared.queries import inbox as inbox_sql
from shared.queries import outbox as outbox_sql


async def _setting(db: Any) -> str:
    return str(await db.fetchval("SELECT current_setting('synchronous_commit')"))


async def test_an_outbox_mark_commits_without_waiting_for_the_flush(db: Any) -> None:
    await db.execute(
        "INSERT INTO outbox (message_id, routing_key, body) VALUES ('m1', 'order.paid', '')"
    )
    assert await _setting(db) == "on"
    async with db.transaction():
        await outbox_sql.mark_outbox_published_lazily(db, ["m1"])
        assert await _setting(db) == "off"
    assert await _setting(db) == "on"
    assert await db.fetchval("SELECT published_at IS NOT NULL FROM outbox") is True


async def test_an_inbox_mark_commits_without_waiting_for_the_flush(db: Any) -> None:
    row_id = await db.fetchval(
        "INSERT INTO inbox (provider, event_id, event_type, body, headers)"
        " VALUES ('xhub', 'e1', 'payment.status_changed', '', '{}') RETURNING id"
    )
    await db.execute(
        "INSERT INTO inbox_unpublished (id, received_at) SELECT id, received_at FROM inbox"
    )
    async with db.transaction():
        await inbox_sql.mark_published_lazily(db, [row_id])
        assert await _setting(db) == "off"
    assert await _setting(db) == "on"
    assert await db.fetchval("SELECT count(*) FROM inbox_unpublished") == 0
