"""`GET /api/events` and `GET /api/events/{event_id}`: the inbox's webhooks filtered, paged by
cursor while new ones arrive, one in full; bad filters 400, unknown ids 404, the token needed."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import orjson
import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient

from shared.amqp.topology import Topology
from shared.config import Settings
from shared.ops import inbox_view
from shared.queries import inbox as inbox_sql
from shared.queries.inbox import InboxEntry
from tests.integration.api_contract import AUTH, documented, running_api
from tests.integration.inbox_events import store_events
from tests.integration.test_dlq import Letter, new_id, put_dead_letters

T0 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)


@pytest.fixture
async def api(
    aiohttp_client: Any, settings: Settings, db: Any, channel: AbstractChannel
) -> TestClient:
    return await running_api(aiohttp_client, settings)


async def listed(api: TestClient, query: str = "") -> dict[str, Any]:
    response = await api.get(f"/api/events{query}", headers=AUTH)
    assert response.status == 200, await response.text()
    page: dict[str, Any] = await documented(response, "GET", "/api/events")
    return page


async def test_events_need_the_admin_token(api: TestClient) -> None:
    for path in ("/api/events", "/api/events/evt_1"):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = await api.get(path, headers=headers)
            assert response.status == 401, path
            assert (await response.json())["code"] == "unauthorized"


async def test_filters_combine_and_events_come_newest_first(api: TestClient, db: Any) -> None:
    [paid] = await store_events(db, payment_id="pay_a", outcome="transitioned", at=T0)
    [failed] = await store_events(
        db, event="refund.failed", payment_id="pay_a", outcome="refund_failed", at=T0 + MINUTE
    )
    [queued] = await store_events(db, payment_id="pay_b", at=T0 + 2 * MINUTE)
    [stored] = await store_events(db, payment_id=None, published=False, at=T0 + 3 * MINUTE)

    async def ids(query: str) -> list[str]:
        return [e["event_id"] for e in (await listed(api, query))["events"]]

    everything = await listed(api)
    assert [e["event_id"] for e in everything["events"]] == [stored, queued, failed, paid]
    assert everything["next_cursor"] is None
    assert everything["events"][2] == {
        "event_id": failed,
        "provider": "xhub",
        "event": "refund.failed",
        "payment_id": "pay_a",
        "received_at": (T0 + MINUTE).isoformat(),
        "duplicates": 0,
        "published": True,
        "outcome": "refund_failed",
    }
    assert await ids("?payment_id=pay_a") == [failed, paid]
    assert await ids("?event=refund.failed") == [failed]
    assert await ids("?payment_id=pay_a&event=payment.status_changed") == [paid]
    assert await ids("?outcome=processed") == [failed, paid]
    assert await ids("?outcome=transitioned") == [paid]
    assert await ids("?outcome=queued") == [queued]
    assert await ids("?outcome=unpublished") == [stored]
    assert await ids("?since=2026-11-30T10:01:00Z") == [stored, queued, failed]
    assert await ids("?until=2026-11-30T10:01:00") == [failed, paid]  # UTC without an offset
    assert await ids("?since=2026-11-30T11:01:00%2B01:00&until=2026-11-30T10:02:00Z") == [
        queued,
        failed,
    ]
    assert await ids("?payment_id=pay_b&outcome=processed") == []
    assert await ids("?payment_id=nobody") == []


async def walk(api: TestClient, query: str, between_pages: Any = None) -> list[str]:
    """Every event id the pages of `query` give, following next_cursor to the end."""
    seen: list[str] = []
    cursor = None
    for _ in range(200):
        page = await listed(api, query + (f"&cursor={cursor}" if cursor else ""))
        seen += [e["event_id"] for e in page["events"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return seen
        if between_pages is not None:
            await between_pages()
    raise AssertionError("the cursor never ended")


async def test_the_cursor_walks_every_event_once_while_new_ones_arrive(
    api: TestClient, db: Any
) -> None:
    # Batches share a received_at (one statement): the id breaks the ties.
    before: list[str] = []
    for batch in range(10):
        before += await store_events(db, 5, at=T0 + batch * MINUTE, outcome="transitioned")
    arrived: list[str] = []

    async def arrive() -> None:
        arrived.extend(await store_events(db, 3, outcome="transitioned"))

    seen = await walk(api, "?limit=7", arrive)

    assert sorted(seen) == sorted(before)  # each once, none of those that came meanwhile
    assert seen == list(reversed(before))  # newest first: by received_at, then id
    assert arrived
    # With the outcome a post-filter, a page reads at most MAX_SCAN rows: pages can come
    # short or empty, with a cursor, and still give each match once.
    assert await walk(api, "?limit=4&outcome=unpublished") == []
    stored = await store_events(db, 3, published=False, at=T0 - MINUTE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inbox_view, "MAX_SCAN", 6)
        patch.setattr(inbox_view, "_CHUNK", 4)
        assert await walk(api, "?limit=2&outcome=unpublished") == list(reversed(stored))
        assert await walk(api, "?limit=2&outcome=queued") == []


def cursor_of(value: Any) -> str:
    # json: orjson refuses integers beyond 64 bits, and a client may send one.
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("limit=1e3", "limit"),
        ("limit=%D9%A3", "limit"),
        ("limit=1&limit=2", "limit"),
        ("cursor=nope", "cursor"),
        (f"cursor={cursor_of([1, 'x'])}", "cursor"),
        (f"cursor={cursor_of([10**30, 1])}", "cursor"),
        (f"cursor={cursor_of([0, 2**63])}", "cursor"),
        (f"cursor={cursor_of([True, 1])}", "cursor"),
        ("since=yesterday", "since"),
        ("until=0001-01-01T00:00:00%2B01:00", "until"),
        ("since=2026-11-30T10:00:00Z&until=2026-11-30T09:00:00Z", "until"),
        ("outcome=nope", "outcome"),
        ("payment_id=pay%00", "payment_id"),
        ("event=%00", "event"),
    ],
)
async def test_a_bad_filter_is_400_naming_it(api: TestClient, query: str, name: str) -> None:
    response = await api.get(f"/api/events?{query}", headers=AUTH)

    assert response.status == 400
    problem = await documented(response, "GET", "/api/events")
    assert problem["code"] == "invalid_request"
    assert problem["error"].startswith(name) or problem["error"] == f"give {name} once"


async def test_one_event_in_full(
    api: TestClient, db: Any, channel: AbstractChannel, topology: Topology
) -> None:
    [json_event] = await store_events(db, payment_id="pay_full", outcome="transitioned")
    [text_event] = await store_events(db, body=b"not json \xff", payment_id=None)
    dead = Letter(payment_id="pay_full")
    await store_events(db, payment_id="pay_full", event_ids=[dead.id])
    await put_dead_letters(channel, topology.work["orders"], [dead])

    async def shown(event_id: str) -> dict[str, Any]:
        response = await api.get(f"/api/events/{event_id}", headers=AUTH)
        assert response.status == 200
        view: dict[str, Any] = await documented(response, "GET", "/api/events/{event_id}")
        return view

    view = await shown(json_event)
    assert view["headers"] == {"Content-Type": "application/json", "X-Webhook-Id": json_event}
    assert (view["body"], view["body_format"]) == (
        {"event": "payment.status_changed", "payment_id": "pay_full"},
        "json",
    )
    assert (view["outcome"], view["dead_letters"]) == ("transitioned", [])
    text = await shown(text_event)
    assert (text["body"], text["body_format"]) == ("not json \ufffd", "text")
    letter = await shown(dead.id)
    assert letter["outcome"] == "dead_lettered: unknown_payment"
    assert [d["id"] for d in letter["dead_letters"]] == [dead.id]
    missing = await api.get("/api/events/evt_nobody", headers=AUTH)
    assert missing.status == 404
    assert (await documented(missing, "GET", "/api/events/{event_id}"))["code"] == "not_found"
    nul = await api.get("/api/events/evt%00", headers=AUTH)
    assert (nul.status, (await nul.json())["error"]) == (
        400,
        "event_id must not contain NUL characters",
    )


async def _standard_event(db: Any, payment_id: str) -> str:
    """A Standard Webhooks event of `payment_id`, stored as ingest stores one."""
    event_id = new_id("msg")
    body = orjson.dumps(
        {
            "type": "payment.status_changed",
            "timestamp": T0.isoformat(),
            "data": {"payment_id": payment_id},
        }
    )
    entry = InboxEntry(
        event_id, "payment.status_changed", payment_id, body, {"webhook-id": event_id}
    )
    [stored] = await inbox_sql.store_batch(db, "standard", [entry])
    await inbox_sql.mark_published(db, [stored.id])
    return event_id


async def test_events_name_their_provider_and_filter_and_show_by_it(
    api: TestClient, db: Any, channel: AbstractChannel, topology: Topology
) -> None:
    payment_id = new_id("pay")
    [xhub] = await store_events(db, payment_id=payment_id, at=T0)
    standard = await _standard_event(db, payment_id)
    dead = Letter(id=f"standard:{standard}", payment_id=payment_id)
    await put_dead_letters(channel, topology.work["orders"], [dead, Letter()])

    both = await listed(api, f"?payment_id={payment_id}")
    assert {(e["event_id"], e["provider"]) for e in both["events"]} == {
        (xhub, "xhub"),
        (standard, "standard"),
    }
    only = await listed(api, f"?payment_id={payment_id}&provider=standard")
    assert [e["event_id"] for e in only["events"]] == [standard]
    bad = await api.get("/api/events?provider=nobody", headers=AUTH)
    assert bad.status == 400

    # Event ids are unique per provider only: show takes the provider (default xhub).
    assert (await api.get(f"/api/events/{standard}", headers=AUTH)).status == 404
    response = await api.get(f"/api/events/{standard}?provider=standard", headers=AUTH)
    view = await documented(response, "GET", "/api/events/{event_id}")
    assert view["provider"] == "standard"
    assert [d["id"] for d in view["dead_letters"]] == [dead.id]  # found by its message id
    assert view["outcome"] == "dead_lettered: unknown_payment"

    # The DLQ names and filters by provider.
    page = await api.get("/api/dlq/orders?provider=standard", headers=AUTH)
    letters = (await documented(page, "GET", "/api/dlq/{queue}"))["messages"]
    assert [(d["id"], d["provider"]) for d in letters] == [(dead.id, "standard")]
    payment = await api.get(f"/api/payments/{payment_id}", headers=AUTH)
    events = (await documented(payment, "GET", "/api/payments/{payment_id}"))["events"]
    assert {e["provider"] for e in events} == {"xhub", "standard"}
