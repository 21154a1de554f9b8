"""The operator api (SPEC section 7): every route behind the admin token, 404 for unknown ids,
400 with a useful message for bad input, the support views after a real flow through ingest
and the workers, and the DLQ routes over a real RabbitMQ."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import orjson
import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient

from services.api.app import create_app
from shared.amqp.broker import BROKER
from shared.amqp.topology import Topology, WorkQueue
from shared.config import Settings
from shared.ops import dlq_lock
from shared.process.web import REGISTRY
from shared.vocabulary import ORIGINAL_QUEUE
from tests.conftest import TEST_AMQP_URL, TEST_DATABASE_URL, SmtpSink
from tests.helpers import eventually, payment_event
from tests.integration.system import (
    System,
    depths,
    paid_once,
    post,
    progress,
    smtp_messages,
    start_system,
    system_settings,
)
from tests.integration.test_dlq import (
    BASE_TIME,
    Letter,
    new_id,
    put_dead_letters,
    queue_ids,
    selection_letters,
)

TOKEN = "test-admin-token"  # tests.conftest make_settings: ADMIN_TOKEN
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ORDER_FIELDS = {
    "order_id",
    "payment_id",
    "user_id",
    "email",
    "amount",
    "currency",
    "status",
    "refunded_amount",
    "updated_at",
}
LETTER_FIELDS = {
    "id",
    "event_id",
    "event",
    "payment_id",
    "reason",
    "error",
    "attempts",
    "first_failed_at",
    "last_failed_at",
    "original_queue",
    "requeued",
    "provider",  # beyond SPEC's list: whose webhook it was (docs/providers.md)
}


def new_order(payment_id: str | None = None, user_id: str = "user_1") -> dict[str, str]:
    payment_id = payment_id or new_id("pay")
    return {
        "order_id": f"ord_{payment_id}",
        "payment_id": payment_id,
        "user_id": user_id,
        "email": f"{payment_id}@customer.test",
        "amount": "100.00",
        "currency": "USD",
    }


@pytest.fixture
def api_settings(make_settings: Any, smtp: tuple[SmtpSink, int]) -> Settings:
    return system_settings(make_settings, smtp[1])


@pytest.fixture
async def api(
    aiohttp_client: Any, api_settings: Settings, db: Any, channel: AbstractChannel
) -> TestClient:
    # The monitor reads the DLQs too: it runs once at startup (awaited here) and not again
    # during a test, so that what a test counts in a DLQ is never held by the monitor.
    app = create_app(api_settings, monitor_interval_s=3600)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    await eventually(
        lambda: metrics_text(client),
        lambda text: "payhooks_queue_oldest_message_age_seconds{" in text,
    )
    return client


async def metrics_text(client: TestClient) -> str:
    response = await client.get("/metrics")
    return await response.text()


@pytest.fixture
def orders(topology: Topology) -> WorkQueue:
    return topology.work["orders"]


async def answer(response: Any) -> tuple[int, Any]:
    return response.status, await response.json()


# --- the admin token ---------------------------------------------------------------------


PROTECTED = [
    ("POST", "/api/orders", new_order("pay_auth")),
    ("GET", "/api/orders/ord_pay_auth", None),
    ("GET", "/api/payments/pay_auth", None),
    ("GET", "/api/users/user_1/bonus", None),
    ("GET", "/api/dlq", None),
    ("GET", "/api/dlq/orders", None),
    ("POST", "/api/dlq/orders/requeue", {"all": True}),
]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"X-Admin-Token": TOKEN},
    ],
    ids=["missing", "wrong token", "basic scheme", "no scheme", "other header"],
)
async def test_every_operator_route_refuses_a_missing_or_wrong_token_and_changes_nothing(
    api: TestClient,
    db: Any,
    channel: AbstractChannel,
    orders: WorkQueue,
    headers: dict[str, str],
) -> None:
    letter = Letter()
    await put_dead_letters(channel, orders, [letter])

    for method, path, body in PROTECTED:
        response = await api.request(method, path, json=body, headers=headers)
        status, payload = await answer(response)
        assert status == 401, path
        assert (payload["code"], payload["error"]) == (
            "unauthorized",
            "missing or invalid admin token",
        ), path

    assert await db.fetchval("SELECT count(*) FROM orders") == 0
    expected = {orders.dlq: [letter.id], orders.name: []}
    assert await queue_ids(channel, expected) == expected


async def test_health_readiness_and_metrics_need_no_token(api: TestClient) -> None:
    assert await answer(await api.get("/healthz")) == (200, {"status": "ok"})
    ready = await eventually(lambda: api.get("/readyz"), lambda r: r.status == 200)
    # And which server of each dependency it is on (a cluster's node, the primary).
    body = await ready.json()
    assert body["status"] == "ready"
    ports = {name: server.rpartition(":")[2] for name, server in body["serving"].items()}
    assert ports == {
        "postgresql": str(urlsplit(TEST_DATABASE_URL).port or 5432),
        "rabbitmq": str(urlsplit(TEST_AMQP_URL).port or 5672),
    }
    metrics = await api.get("/metrics")
    assert metrics.status == 200
    assert "payhooks_queue_messages" in await metrics.text()


async def test_the_right_token_opens_every_operator_route(api: TestClient) -> None:
    statuses = {}
    for method, path, body in PROTECTED:
        response = await api.request(method, path, json=body, headers=AUTH)
        statuses[path] = response.status
    assert statuses == {
        "/api/orders": 201,
        "/api/orders/ord_pay_auth": 200,
        "/api/payments/pay_auth": 200,  # the order just registered
        "/api/users/user_1/bonus": 200,
        "/api/dlq": 200,
        "/api/dlq/orders": 200,
        "/api/dlq/orders/requeue": 200,
    }


# --- unknown ids and bad input ---------------------------------------------------------------


async def test_unknown_ids_are_404_with_an_error_message(api: TestClient) -> None:
    unknown = [
        ("GET", "/api/orders/ord_nope"),
        ("GET", "/api/payments/pay_nope"),
        ("GET", "/api/dlq/nope"),
        ("GET", "/api/dlq/orders.dlq"),
        ("POST", "/api/dlq/nope/requeue"),
    ]

    for method, path in unknown:
        response = await api.request(method, path, json={"all": True}, headers=AUTH)
        status, payload = await answer(response)
        assert status == 404, path
        assert payload["error"], path


async def test_unknown_dlq_name_lists_the_valid_ones(api: TestClient) -> None:
    _, payload = await answer(await api.get("/api/dlq/payments", headers=AUTH))

    assert all(name in payload["error"] for name in ("orders", "bonuses", "emails"))


async def test_unknown_user_has_a_zero_balance_and_no_entries(api: TestClient) -> None:
    response = await api.get("/api/users/user_nobody/bonus", headers=AUTH)

    assert await answer(response) == (
        200,
        {"user_id": "user_nobody", "balance": 0, "entries": []},
    )


async def test_registered_order_is_returned_with_every_spec_field(api: TestClient) -> None:
    order = new_order()

    created = await api.post("/api/orders", json=order, headers=AUTH)
    found = await api.get(f"/api/orders/{order['order_id']}", headers=AUTH)

    assert created.status == 201
    status, body = await answer(found)
    assert status == 200
    assert set(body) >= ORDER_FIELDS
    assert {k: body[k] for k in order} == order
    assert (body["status"], body["refunded_amount"]) == ("PENDING", "0.00")
    assert dt.datetime.fromisoformat(body["updated_at"]).tzinfo is not None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b'["ord_1"]', "JSON object"),
    ],
    ids=["not json", "not an object"],
)
async def test_unreadable_order_is_400_saying_why(
    api: TestClient, db: Any, body: bytes, message: str
) -> None:
    response = await api.post(
        "/api/orders", data=body, headers={**AUTH, "Content-Type": "application/json"}
    )

    status, payload = await answer(response)
    assert status == 400
    assert message in payload["error"]
    assert await db.fetchval("SELECT count(*) FROM orders") == 0


async def test_order_with_bad_fields_is_400_explaining_each_field(api: TestClient, db: Any) -> None:
    bad = {
        "order_id": "",
        "payment_id": 42,
        "email": "nobody",
        "amount": "-5",
        "currency": "dollars",
    }  # and no user_id at all

    response = await api.post("/api/orders", json=bad, headers=AUTH)

    status, payload = await answer(response)
    assert status == 400
    fields = payload["fields"]
    assert set(fields) == {"order_id", "payment_id", "user_id", "email", "amount", "currency"}
    assert "email" in fields["email"]
    assert "decimal" in fields["amount"]
    assert "USD" in fields["currency"]
    assert all(isinstance(problem, str) and problem for problem in fields.values())
    assert await db.fetchval("SELECT count(*) FROM orders") == 0


async def test_same_order_again_is_200_and_different_details_409(api: TestClient) -> None:
    order = new_order()

    first = await api.post("/api/orders", json=order, headers=AUTH)
    again = await api.post("/api/orders", json=order, headers=AUTH)
    conflict = await api.post("/api/orders", json={**order, "amount": "99.00"}, headers=AUTH)

    assert (first.status, again.status, conflict.status) == (201, 200, 409)
    assert (await again.json())["order_id"] == order["order_id"]
    assert (await conflict.json())["error"]


BAD_REQUEUES: list[tuple[bytes, str]] = [
    (b"{nope", "not valid JSON"),
    (b"[]", "JSON object"),
    (b"{}", '"ids"'),
    (b'{"all": false}', '"ids"'),
    (b'{"dry_run": true}', '"ids"'),
    (b'{"ids": "evt_1"}', "ids must be a list"),
    (b'{"ids": [1, 2]}', "ids must be a list"),
    (b'{"since": "yesterday"}', "since"),
    (b'{"since": "2026-01-01T00:00:00Z", "until": "soon"}', "until"),
    (b'{"all": true, "limit": 0}', "limit"),
    (b'{"all": true, "limit": "5"}', "limit"),
    (b'{"all": true, "limit": true}', "limit"),  # bool is an int in Python, not here
    (b'{"reason": 5}', "reason"),
]


async def test_requeue_with_bad_body_is_400_saying_why_and_moves_nothing(
    api: TestClient, channel: AbstractChannel, orders: WorkQueue
) -> None:
    letter = Letter()
    await put_dead_letters(channel, orders, [letter])

    answers = [
        await answer(
            await api.post(
                "/api/dlq/orders/requeue",
                data=body,
                headers={**AUTH, "Content-Type": "application/json"},
            )
        )
        for body, _ in BAD_REQUEUES
    ]

    for (body, message), (status, payload) in zip(BAD_REQUEUES, answers, strict=True):
        assert status == 400, body
        assert message in payload["error"], (body, payload)
    expected = {orders.dlq: [letter.id], orders.name: []}
    assert await queue_ids(channel, expected) == expected


@pytest.mark.parametrize("dry_run", ["true", 1, "yes"])
async def test_requeue_with_a_non_boolean_dry_run_is_400_and_moves_nothing(
    api: TestClient, channel: AbstractChannel, orders: WorkQueue, dry_run: object
) -> None:
    # An operator who meant a dry run must never get a real requeue instead.
    letter = Letter()
    await put_dead_letters(channel, orders, [letter])

    status, payload = await answer(
        await api.post(
            "/api/dlq/orders/requeue", json={"all": True, "dry_run": dry_run}, headers=AUTH
        )
    )

    assert status == 400
    assert "dry_run" in payload["error"]
    expected = {orders.dlq: [letter.id], orders.name: []}
    assert await queue_ids(channel, expected) == expected


async def test_dlq_page_outside_bounds_is_400(api: TestClient) -> None:
    for query in (
        "limit=abc",
        "limit=0",
        "limit=1001",
        "offset=-1",
        "offset=x",
        "offset=1_0",  # int() would take it
        "offset=99999999999999999999999",  # was a 500: too big for JSON's 64-bit numbers
    ):
        status, payload = await answer(await api.get(f"/api/dlq/orders?{query}", headers=AUTH))

        assert status == 400, query
        assert "limit" in payload["error"] or "offset" in payload["error"], query


# --- DLQ routes -------------------------------------------------------------------------------


async def test_dlq_list_counts_each_dlq_and_ages_its_oldest_message(
    api: TestClient, channel: AbstractChannel, topology: Topology
) -> None:
    two_hours_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
    await put_dead_letters(
        channel,
        topology.work["orders"],
        [
            Letter(failed_at=two_hours_ago + dt.timedelta(minutes=5)),
            Letter(failed_at=two_hours_ago),
        ],
    )
    await put_dead_letters(channel, topology.work["emails"], [Letter()])

    status, payload = await answer(await api.get("/api/dlq", headers=AUTH))

    assert status == 200
    queues = {q["queue"]: q for q in payload["queues"]}
    work = topology.work
    assert {q: v["messages"] for q, v in queues.items()} == {
        work["orders"].dlq: 2,
        work["bonuses"].dlq: 0,
        work["emails"].dlq: 1,
    }
    assert 7200 <= queues[work["orders"].dlq]["oldest_age_seconds"] < 7260
    assert queues[work["bonuses"].dlq]["oldest_age_seconds"] is None


async def test_dlq_show_pages_through_messages_in_order_without_moving_them(
    api: TestClient, channel: AbstractChannel, orders: WorkQueue
) -> None:
    letters = [
        Letter(reason="unknown_payment", failed_at=BASE_TIME + dt.timedelta(minutes=i))
        for i in range(5)
    ]
    await put_dead_letters(channel, orders, letters)

    everything = await answer(await api.get("/api/dlq/orders", headers=AUTH))
    page = await answer(await api.get("/api/dlq/orders?limit=2&offset=1", headers=AUTH))
    past_the_end = await answer(await api.get("/api/dlq/orders?offset=10", headers=AUTH))

    assert everything[0] == 200
    assert [m["id"] for m in everything[1]["messages"]] == [x.id for x in letters]
    assert all(set(m) == LETTER_FIELDS for m in everything[1]["messages"])
    first = everything[1]["messages"][0]
    assert (first["reason"], first["attempts"], first["original_queue"]) == (
        "unknown_payment",
        3,
        orders.name,
    )
    assert first["payment_id"] == letters[0].payment_id
    assert page[0] == 200
    assert [m["id"] for m in page[1]["messages"]] == [letters[1].id, letters[2].id]
    assert page[1]["total"] == 5
    assert past_the_end[1]["messages"] == []
    expected = {orders.dlq: [x.id for x in letters], orders.name: []}
    assert await queue_ids(channel, expected) == expected


async def pages(api: TestClient, first: str) -> list[dict[str, Any]]:
    """Every page from `first` on, following next_cursor."""
    found = []
    query: str | None = first
    while query is not None:
        status, page = await answer(await api.get(f"/api/dlq/orders?{query}", headers=AUTH))
        assert status == 200, page
        found.append(page)
        cursor = page["next_cursor"]
        query = None if cursor is None else f"limit={page['limit']}&cursor={cursor}"
    return found


async def test_dlq_cursor_pages_through_every_message_once_in_order(
    api: TestClient, channel: AbstractChannel, orders: WorkQueue
) -> None:
    letters = [Letter(failed_at=BASE_TIME + dt.timedelta(minutes=i)) for i in range(5)]
    await put_dead_letters(channel, orders, letters)

    by_cursor = await pages(api, "limit=2")
    by_offset = await pages(api, "limit=2&offset=1")  # deprecated, and given a cursor too

    assert [[m["id"] for m in p["messages"]] for p in by_cursor] == [
        [letters[0].id, letters[1].id],
        [letters[2].id, letters[3].id],
        [letters[4].id],
    ]
    assert [p["offset"] for p in by_cursor] == [0, 2, 4]
    assert [m["id"] for p in by_offset for m in p["messages"]] == [x.id for x in letters[1:]]
    expected = {orders.dlq: [x.id for x in letters], orders.name: []}
    assert await queue_ids(channel, expected) == expected


async def test_dlq_cursor_whose_message_left_starts_again_at_the_head(
    api: TestClient, channel: AbstractChannel, orders: WorkQueue
) -> None:
    # An operator requeueing each page as they read it: nothing left behind is skipped.
    letters = [Letter() for _ in range(5)]
    await put_dead_letters(channel, orders, letters)
    _, first = await answer(await api.get("/api/dlq/orders?limit=2", headers=AUTH))
    seen = [m["id"] for m in first["messages"]]
    requeued = await api.post("/api/dlq/orders/requeue", json={"ids": seen}, headers=AUTH)
    assert requeued.status == 200

    status, second = await answer(
        await api.get(f"/api/dlq/orders?limit=2&cursor={first['next_cursor']}", headers=AUTH)
    )

    assert status == 200
    assert [m["id"] for m in second["messages"]] == [letters[2].id, letters[3].id]
    assert (second["offset"], second["total"]) == (0, 3)


def encoded(value: object) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(value)).decode()


@pytest.mark.parametrize(
    "query",
    [
        "cursor=",
        "cursor=%00",
        "cursor=%C3%A9",
        f"cursor={base64.urlsafe_b64encode(b'nope').decode()}",
        f"cursor={encoded([0, 'evt'])}",
        f"cursor={encoded([True, 'evt'])}",
        f"cursor={encoded(['1', 'evt'])}",
        f"cursor={encoded([2**31, 'evt'])}",
        f"cursor={encoded([1, 2])}",
        f"cursor={encoded({'a': 1, 'b': 2})}",
        f"cursor={encoded([1, 'evt'])}&offset=0",
    ],
)
async def test_dlq_cursor_not_given_by_the_api_is_400(api: TestClient, query: str) -> None:
    status, payload = await answer(await api.get(f"/api/dlq/orders?{query}", headers=AUTH))

    assert status == 400, payload
    assert payload["code"] == "invalid_request"
    assert "cursor" in payload["error"]


@pytest.mark.parametrize(
    ("body", "moved", "not_found"),
    [
        ({"ids": ["b", "evt_gone"]}, "b", ["evt_gone"]),
        ({"all": True}, "abc", []),
        ({"reason": "retries_exhausted"}, "b", []),
        ({"event_type": "refund.completed"}, "c", []),
        ({"payment_id": "a"}, "a", []),
        ({"since": "2026-01-01T10:01:00+00:00", "until": "2026-01-01T10:02:00"}, "bc", []),
        ({"all": True, "limit": 2}, "ab", []),
    ],
    ids=["ids", "all", "reason", "event type", "payment id", "time range", "limit"],
)
async def test_requeue_route_moves_the_selected_messages_and_says_which(
    api: TestClient,
    channel: AbstractChannel,
    orders: WorkQueue,
    body: dict[str, Any],
    moved: str,
    not_found: list[str],
) -> None:
    letters = selection_letters()
    await put_dead_letters(channel, orders, list(letters.values()))
    if "ids" in body:
        body = {**body, "ids": [letters[i].id if i in letters else i for i in body["ids"]]}
    if "payment_id" in body:
        body = {**body, "payment_id": letters[body["payment_id"]].payment_id}

    status, payload = await answer(
        await api.post("/api/dlq/orders/requeue", json=body, headers=AUTH)
    )

    moved_ids = [letters[n].id for n in moved]
    assert status == 200
    assert {k: payload[k] for k in ("requeued", "ids", "not_found")} == {
        "requeued": len(moved),
        "ids": moved_ids,
        "not_found": not_found,
    }
    expected = {
        orders.name: moved_ids,
        orders.dlq: [x.id for n, x in letters.items() if n not in moved],
    }
    assert await queue_ids(channel, expected) == expected


async def test_requeue_route_dry_run_names_what_would_move_and_moves_nothing(
    api: TestClient, channel: AbstractChannel, orders: WorkQueue
) -> None:
    letters = [Letter(reason="unknown_payment"), Letter(reason="invalid_message")]
    await put_dead_letters(channel, orders, letters)

    status, payload = await answer(
        await api.post(
            "/api/dlq/orders/requeue",
            json={"reason": "unknown_payment", "dry_run": True},
            headers=AUTH,
        )
    )

    assert status == 200
    assert {k: payload[k] for k in ("requeued", "ids", "not_found")} == {
        "requeued": 0,
        "ids": [letters[0].id],
        "not_found": [],
    }
    expected = {orders.dlq: [x.id for x in letters], orders.name: []}
    assert await queue_ids(channel, expected) == expected


async def test_requeue_route_matching_nothing_requeues_nothing(
    api: TestClient, channel: AbstractChannel, orders: WorkQueue
) -> None:
    letter = Letter()
    await put_dead_letters(channel, orders, [letter])

    status, payload = await answer(
        await api.post("/api/dlq/orders/requeue", json={"reason": "no_such"}, headers=AUTH)
    )

    assert status == 200
    assert (payload["requeued"], payload["ids"]) == (0, [])
    expected = {orders.dlq: [letter.id], orders.name: []}
    assert await queue_ids(channel, expected) == expected


async def test_requeue_to_a_queue_that_no_longer_exists_is_409_and_keeps_the_message(
    api: TestClient, channel: AbstractChannel, orders: WorkQueue
) -> None:
    stranded = Letter(original_queue=f"{orders.name}-retired")
    await put_dead_letters(channel, orders, [stranded])

    status, payload = await answer(
        await api.post("/api/dlq/orders/requeue", json={"all": True}, headers=AUTH)
    )

    assert status == 409
    assert f"{orders.name}-retired" in payload["error"]
    expected = {orders.dlq: [stranded.id], orders.name: []}
    assert await queue_ids(channel, expected) == expected


async def test_requeue_by_event_id_does_not_report_it_not_found(
    api: TestClient, channel: AbstractChannel, topology: Topology
) -> None:
    bonuses = topology.work["bonuses"]
    event_id = new_id("evt")
    message = aio_pika.Message(
        orjson.dumps({"source_event_id": event_id, "event": "order.paid", "payment_id": "p"}),
        headers={ORIGINAL_QUEUE: bonuses.name},
        message_id=f"{event_id}:order.paid",
    )
    await channel.default_exchange.publish(message, bonuses.dlq, mandatory=True)

    status, payload = await answer(
        await api.post("/api/dlq/bonuses/requeue", json={"ids": [event_id]}, headers=AUTH)
    )

    assert status == 200
    assert (payload["ids"], payload["not_found"]) == ([f"{event_id}:order.paid"], [])


async def test_a_dlq_another_reader_holds_past_the_wait_is_503_with_retry_after(
    api: TestClient,
    channel: AbstractChannel,
    orders: WorkQueue,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Another api replica or an operator's command is requeueing thousands of messages.
    letter = Letter()
    await put_dead_letters(channel, orders, [letter])
    monkeypatch.setattr(dlq_lock, "LOCK_WAIT_S", 0.5)

    async with await aio_pika.connect(TEST_AMQP_URL) as other:
        holder = await other.channel()
        async with dlq_lock.reading(holder, orders.dlq):
            answers = [
                await api.get("/api/dlq/orders", headers=AUTH),
                await api.get("/api/dlq", headers=AUTH),
                await api.post("/api/dlq/orders/requeue", json={"all": True}, headers=AUTH),
            ]

    for response in answers:
        status, payload = await answer(response)
        assert status == 503, payload
        assert "busy" in payload["error"]
        assert int(response.headers["Retry-After"]) > 0
    expected = {orders.dlq: [letter.id], orders.name: []}
    assert await queue_ids(channel, expected) == expected


# --- support views after a real flow ---------------------------------------------------------


@pytest.fixture
async def system(
    aiohttp_client: Any,
    api_settings: Settings,
    channel: AbstractChannel,
    topology: Topology,
    db: Any,
    api: TestClient,
) -> System:
    return await start_system(aiohttp_client, api_settings, channel, topology)


async def done_with(
    db: Any,
    system: System,
    channel: AbstractChannel,
    topology: Topology,
    *,
    orders: int,
    transitions: int,
    dead: int,
) -> None:
    """Wait until the workers finished `orders` provider deliveries and `transitions` order
    transitions each, with `dead` messages in orders.dlq."""
    dlq = topology.work["orders"].dlq

    async def probe() -> tuple[dict[str, int], dict[str, int]]:
        return await progress(db, system), await depths(channel, [dlq])

    def done(value: tuple[dict[str, int], dict[str, int]]) -> bool:
        p, d = value
        return (
            p["orders_finished"] >= orders
            and p["outbox"] == transitions
            and p["outbox_unpublished"] == 0
            and p["bonuses_finished"] >= transitions
            and p["email_finished"] >= transitions
            and d[dlq] == dead
        )

    await eventually(probe, done, timeout_s=20)


async def test_payment_view_shows_order_webhooks_transitions_bonus_emails_and_dead_letters(
    system: System,
    api: TestClient,
    db: Any,
    channel: AbstractChannel,
    topology: Topology,
    smtp: tuple[SmtpSink, int],
) -> None:
    payment_id = new_id("pay")
    early, paid, settled = new_id("evt"), new_id("evt"), new_id("evt")
    # A settled event before the shop registered the order: parked, then dead-lettered (its
    # 1 s park in the tests ran out).
    await post(system.ingest, payment_event(payment_id, "settled"), early)
    await eventually(
        lambda: depths(channel, [topology.work["orders"].dlq]),
        lambda d: d == {topology.work["orders"].dlq: 1},
        timeout_s=15,
    )
    order = new_order(payment_id, user_id=new_id("user"))
    assert (await api.post("/api/orders", json=order, headers=AUTH)).status == 201
    for event_id in (paid, paid, paid):  # the provider retried twice
        await post(system.ingest, payment_event(payment_id, "paid"), event_id)
    await post(system.ingest, payment_event(payment_id, "settled"), settled)
    await done_with(db, system, channel, topology, orders=3, transitions=2, dead=1)

    status, view = await answer(await api.get(f"/api/payments/{payment_id}", headers=AUTH))

    assert status == 200
    assert {k: view["order"][k] for k in order} == order
    assert view["order"]["status"] == "SETTLED"
    events = view["events"]
    assert [(e["event_id"], e["event"], e["status"], e["duplicates"]) for e in events] == [
        (early, "payment.status_changed", "settled", 0),
        (paid, "payment.status_changed", "paid", 2),
        (settled, "payment.status_changed", "settled", 0),
    ]
    assert all(e["received_at"] and e["outcome"] for e in events)
    assert events[1]["outcome"] == events[2]["outcome"] == "transitioned"
    assert [(t["from"], t["to"], t["event_id"]) for t in view["transitions"]] == [
        ("PENDING", "PAID", paid),
        ("PAID", "SETTLED", settled),
    ]
    assert all(t["at"] for t in view["transitions"])
    assert [(b["kind"], b["points"]) for b in view["bonus"]] == [("grant", 500)]
    assert [e["template"] for e in view["emails"]] == ["payment_succeeded"]
    assert all(e["message_id"] and e["sent_at"] for e in view["emails"])
    [dead] = view["dead_letters"]
    assert (dead["id"], dead["payment_id"], dead["reason"], dead["attempts"]) == (
        early,
        payment_id,
        "unknown_payment",
        1,
    )
    assert dead["original_queue"] == topology.work["orders"].name
    assert smtp_messages(smtp[0], payment_id) == ["payment_succeeded"]


async def test_payment_view_lists_failed_refunds_and_the_orders_worker_counts_them(
    system: System,
    api: TestClient,
    db: Any,
    channel: AbstractChannel,
    topology: Topology,
) -> None:
    """Seed 000: refund.failed / refund.rejected move no money, but the merchant must know."""
    payment_id = new_id("pay")
    order = new_order(payment_id, user_id=new_id("user"))
    assert (await api.post("/api/orders", json=order, headers=AUTH)).status == 201
    paid, failed = new_id("evt"), new_id("evt")
    await post(system.ingest, payment_event(payment_id, "paid"), paid)
    refund = {"payment_id": payment_id, "refund_id": "r-1", "amount": "100.00", "currency": "USD"}
    await post(system.ingest, {"event": "refund.failed", **refund}, failed)
    await done_with(db, system, channel, topology, orders=2, transitions=1, dead=0)

    status, view = await answer(await api.get(f"/api/payments/{payment_id}", headers=AUTH))

    assert status == 200
    assert view["order"]["status"] == "PAID"  # no state change
    [failure] = view["refund_failures"]
    assert (failure["event_id"], failure["event"], failure["refund_id"]) == (
        failed,
        "refund.failed",
        "r-1",
    )
    assert view["events"][1]["outcome"] == "refund_failed"
    assert view["undecided"] is None
    registry = system.clients["orders"][0].app[REGISTRY]
    counted = registry.get_sample_value(
        "payhooks_refund_failures_total", {"event": "refund.failed"}
    )
    assert counted == 1


async def test_user_bonus_balance_is_the_sum_of_the_users_ledger_entries(
    system: System, api: TestClient, db: Any, channel: AbstractChannel, topology: Topology
) -> None:
    user_id = new_id("user")
    kept, refunded = new_id("pay"), new_id("pay")
    for payment_id in (kept, refunded):
        order = new_order(payment_id, user_id=user_id)
        assert (await api.post("/api/orders", json=order, headers=AUTH)).status == 201
    await post(system.ingest, payment_event(kept, "paid"), new_id("evt"))
    await post(system.ingest, payment_event(refunded, "paid"), new_id("evt"))
    await done_with(db, system, channel, topology, orders=2, transitions=2, dead=0)
    await post(system.ingest, payment_event(refunded, "refunded"), new_id("evt"))
    await done_with(db, system, channel, topology, orders=3, transitions=3, dead=0)

    status, bonus = await answer(await api.get(f"/api/users/{user_id}/bonus", headers=AUTH))

    assert status == 200
    assert bonus["user_id"] == user_id
    entries = sorted((e["payment_id"], e["kind"], e["points"]) for e in bonus["entries"])
    assert entries == sorted(
        [(kept, "grant", 500), (refunded, "grant", 500), (refunded, "clawback", -500)]
    )
    assert all(e["created_at"] for e in bonus["entries"])
    assert bonus["balance"] == 500 == sum(e["points"] for e in bonus["entries"])


async def test_requeued_unknown_payment_event_is_processed_once_after_the_order_is_registered(
    system: System,
    api: TestClient,
    db: Any,
    channel: AbstractChannel,
    topology: Topology,
    smtp: tuple[SmtpSink, int],
) -> None:
    payment_id, event_id = new_id("pay"), new_id("evt")
    work = topology.work["orders"]
    await post(system.ingest, payment_event(payment_id, "paid"), event_id)
    await done_with(db, system, channel, topology, orders=1, transitions=0, dead=1)
    _, shown = await answer(await api.get("/api/dlq/orders", headers=AUTH))
    assert [(m["id"], m["reason"]) for m in shown["messages"]] == [(event_id, "unknown_payment")]

    order = new_order(payment_id)
    assert (await api.post("/api/orders", json=order, headers=AUTH)).status == 201
    status, requeued = await answer(
        await api.post("/api/dlq/orders/requeue", json={"ids": [event_id]}, headers=AUTH)
    )

    assert status == 200
    assert {k: requeued[k] for k in ("requeued", "ids", "not_found")} == {
        "requeued": 1,
        "ids": [event_id],
        "not_found": [],
    }
    await done_with(db, system, channel, topology, orders=2, transitions=1, dead=0)
    assert system.finished("orders") == 2  # dead-lettered once, then processed once
    await paid_once(db, smtp[0], payment_id, event_id)
    _, view = await answer(await api.get(f"/api/payments/{payment_id}", headers=AUTH))
    assert view["dead_letters"] == []
    assert [(t["from"], t["to"]) for t in view["transitions"]] == [("PENDING", "PAID")]
    assert await depths(channel, [work.dlq, work.name]) == {work.dlq: 0, work.name: 0}
