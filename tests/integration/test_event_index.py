"""The event listing reads through an index, never the whole inbox: every filter's page on
20,000 rows is an index scan of the index made for it, and the outcome post-filter is bounded."""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson
import pytest

from shared.ops import inbox_view
from shared.ops.inbox_view import EventQuery
from shared.queries import inbox as inbox_sql

ROWS = 20_000
T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


@pytest.fixture
async def big_inbox(db: Any) -> Any:
    """20,000 webhooks a second apart over 2,000 payments and 4 types (one of them rare),
    every third processed, in their day's partition; ANALYZEd (autovacuum is off on our
    machines)."""
    await db.execute("SELECT payhooks_inbox_partition($1)", T0.date())
    await db.execute(
        "INSERT INTO inbox (provider, event_id, event_type, payment_id, body, headers,"
        " received_at)"
        " SELECT 'xhub', 'evt_' || g,"
        "  CASE WHEN g % 1000 = 0 THEN 'refund.failed' ELSE (ARRAY['payment.status_changed',"
        "   'refund.completed', 'kyc.changed'])[1 + g % 3] END,"
        "  'pay_' || (g % 2000), '{}'::bytea, '{}', $1::timestamptz + g * interval '1 second'"
        " FROM generate_series(1, $2::int) g",
        T0,
        ROWS,
    )
    await db.execute(
        "INSERT INTO processed_events (worker, event_id, outcome)"
        " SELECT 'orders', event_id, 'transitioned' FROM inbox WHERE id % 3 = 0"
    )
    await db.execute("ANALYZE inbox")
    await db.execute("ANALYZE processed_events")
    return db


async def plan(db: Any, query: EventQuery) -> dict[str, Any]:
    """The plan of a page's statement, with the page's values (as each call is planned)."""
    sql, args = inbox_sql.events_statement(query.where, query.after, query.limit + 1)
    [[text]] = await db.fetch("EXPLAIN (FORMAT JSON) " + sql, *args)
    found: dict[str, Any] = orjson.loads(text)[0]["Plan"]
    return found


def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]


# The partition that holds the rows (migration 021): its scans are the ones that read.
PARTITION = f"inbox_p{T0:%Y%m%d}"


def inbox_scans(node: dict[str, Any], parents: dict[str, str]) -> list[tuple[str, str | None]]:
    """How the plan reads the rows' partition: (node type, the inbox index of the partition's
    index it uses), a bitmap scan's index from its child."""
    found = [
        (n["Node Type"], n.get("Index Name") or next(iter(indexes(n)), None))
        for n in nodes(node)
        if n.get("Relation Name") == PARTITION
    ]
    return [(kind, None if index is None else parents[index]) for kind, index in found]


async def parent_indexes(db: Any) -> dict[str, str]:
    """Each index of the rows' partition, by the partitioned inbox index it belongs to."""
    rows = await db.fetch(
        "SELECT c.relname AS index, p.relname AS parent FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent"
        " WHERE c.relkind = 'i' AND c.relname LIKE $1",
        PARTITION + "%",
    )
    return {r["index"]: r["parent"] for r in rows}


def indexes(node: dict[str, Any]) -> list[str]:
    return [n["Index Name"] for n in nodes(node) if "Index Name" in n]


CURSOR = inbox_view.encode_cursor((T0 + dt.timedelta(seconds=15_000), 15_000))


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({}, "inbox_received_idx"),
        ({"cursor": CURSOR}, "inbox_received_idx"),
        ({"since": "2026-11-01T03:00:00Z", "until": "2026-11-01T04:00:00Z"}, "inbox_received_idx"),
        ({"payment_id": "pay_7", "cursor": CURSOR}, "inbox_payment_received_idx"),
        ({"event": "refund.failed", "cursor": CURSOR}, "inbox_event_type_received_idx"),
        ({"event": "kyc.changed", "since": "2026-11-01T03:00:00Z"}, None),
        ({"payment_id": "pay_7", "event": "refund.failed"}, "inbox_payment_received_idx"),
        ({"outcome": "transitioned", "cursor": CURSOR}, "inbox_received_idx"),
    ],
)
async def test_a_filtered_page_is_an_index_scan(
    big_inbox: Any, filters: dict[str, str], index: str | None
) -> None:
    query = EventQuery.parse(**filters)

    scans = inbox_scans(await plan(big_inbox, query), await parent_indexes(big_inbox))

    [(node_type, name)] = scans
    # A bitmap scan: few rows (a payment's), read through the index, then sorted.
    assert node_type in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan"), scans
    # None: either index serves it; the planner picks by the values.
    assert name == index if index else name is not None, scans


async def test_an_outcome_nothing_has_ends_after_a_bounded_read(big_inbox: Any) -> None:
    """No index holds the outcome: each page reads at most MAX_SCAN rows, then gives a cursor
    (an empty page that is not the last), so a page never reads the whole inbox."""
    query = EventQuery.parse(outcome="unpublished", limit="500")
    pages = 0
    while True:
        pages += 1
        page = await inbox_view.list_events(big_inbox, query)
        assert page["events"] == []
        if page["next_cursor"] is None:
            break
        query = EventQuery.parse(outcome="unpublished", limit="500", cursor=page["next_cursor"])
    assert pages == ROWS // inbox_view.MAX_SCAN + 1
    processed = await inbox_view.list_events(big_inbox, EventQuery.parse(outcome="processed"))
    assert len(processed["events"]) == 100
    assert processed["next_cursor"] is not None


async def test_the_listing_plans_each_page_for_its_values(db: Any) -> None:
    """A generic plan of a prepared statement walked the time index filtering by type (15,000
    rows read for 14 of a rare type, measured); a custom plan takes the type's index."""
    async with inbox_sql.planned_for_values(db) as conn:
        assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
    assert await db.fetchval("SHOW plan_cache_mode") == "auto"
