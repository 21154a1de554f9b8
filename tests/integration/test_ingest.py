"""The webhook endpoint against real PostgreSQL and RabbitMQ: every row of SPEC section 3."""

from __future__ import annotations

import asyncio
import gzip
import time
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from services.ingest.accept import AcceptorConfig
from services.ingest.app import create_app
from shared.amqp.broker import BROKER
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.queries import inbox as inbox_sql
from tests.conftest import TEST_SECRETS
from tests.helpers import delivery, drain, payment_event, signed_headers

SECRET = TEST_SECRETS[0]
URL = "/webhooks/xhub"


@pytest.fixture
async def client(aiohttp_client: Any, settings: Settings, amqp: Any) -> TestClient:
    app = create_app(settings, sweep_interval_s=0.2)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    return client


async def inbox_rows(db: Any) -> list[Any]:
    return list(await db.fetch("SELECT * FROM inbox ORDER BY id"))


async def test_new_event_is_stored_and_published_once(
    client: TestClient, db: Any, amqp: Any, topology: Topology
) -> None:
    payload = payment_event()
    body, headers = delivery(payload, SECRET, event_id="evt_new_1")

    response = await client.post(URL, data=body, headers=headers)

    assert response.status == 200
    assert await response.json() == {"status": "accepted"}
    rows = await inbox_rows(db)
    assert len(rows) == 1
    assert rows[0]["event_id"] == "evt_new_1"
    assert bytes(rows[0]["body"]) == body
    assert rows[0]["headers"]["X-Webhook-Signature"] == headers["X-Webhook-Signature"]
    assert rows[0]["payment_id"] == payload["payment_id"]
    messages = await drain(amqp, topology.work["orders"].name)
    assert [m.message_id for m in messages] == ["evt_new_1"]
    assert messages[0].body == body
    assert messages[0].delivery_mode == 2


async def test_duplicate_event_is_answered_duplicate_and_not_republished(
    client: TestClient, db: Any, amqp: Any, topology: Topology
) -> None:
    body, headers = delivery(payment_event(), SECRET, event_id="evt_dup")
    first = await client.post(URL, data=body, headers=headers)
    second = await client.post(URL, data=body, headers=headers)

    assert first.status == second.status == 200
    assert await second.json() == {"status": "duplicate"}
    rows = await inbox_rows(db)
    assert len(rows) == 1
    # Copies are counted on the event's dedup key (migration 021).
    assert await db.fetchval("SELECT duplicates FROM inbox_keys") == 1
    assert len(await drain(amqp, topology.work["orders"].name)) == 1


async def test_a_copy_confirmed_but_not_yet_marked_published_is_not_published_again(
    client: TestClient, db: Any, amqp: Any, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark after the confirm runs in the background: a copy whose INSERT reads the row
    before the mark commits finds the confirm in the process's memory instead."""
    mark = inbox_sql.mark_published_lazily
    marking = asyncio.Event()

    async def slow_mark(pool: Any, ids: Any) -> None:
        marking.set()
        await asyncio.sleep(1.0)
        await mark(pool, ids)

    monkeypatch.setattr(inbox_sql, "mark_published_lazily", slow_mark)
    body, headers = delivery(payment_event(), SECRET, event_id="evt_unmarked")
    first = await client.post(URL, data=body, headers=headers)
    await marking.wait()
    unmarked = await db.fetchval("SELECT count(*) FROM inbox_unpublished")
    second = await client.post(URL, data=body, headers=headers)

    assert unmarked == 1
    assert (first.status, second.status) == (200, 200)
    assert await second.json() == {"status": "duplicate"}
    assert len(await drain(amqp, topology.work["orders"].name, settle_s=1.2)) == 1
    assert await db.fetchval("SELECT count(*) FROM inbox_unpublished") == 0


async def test_fifty_concurrent_copies_make_one_row_and_one_message(
    client: TestClient, db: Any, amqp: Any, topology: Topology
) -> None:
    body, headers = delivery(payment_event(), SECRET, event_id="evt_storm")

    responses = await asyncio.gather(
        *(client.post(URL, data=body, headers=headers) for _ in range(50))
    )

    assert [r.status for r in responses] == [200] * 50
    outcomes = sorted([(await r.json())["status"] for r in responses])
    assert outcomes.count("accepted") == 1
    assert len(await inbox_rows(db)) == 1
    assert len(await drain(amqp, topology.work["orders"].name)) == 1


async def test_webhooks_arriving_a_few_ms_apart_at_an_idle_acceptor_share_one_batch(
    aiohttp_client: Any, settings: Settings, db: Any, amqp: Any
) -> None:
    """At a few hundred a second a batch waits for its oldest webhook to have waited
    gather_s (50 ms here, so a slow machine can't split it) instead of going with one each."""
    app = create_app(settings, acceptor_config=AcceptorConfig(gather_s=0.05))
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)

    async def post_after(delay_s: float, event_id: str) -> int:
        await asyncio.sleep(delay_s)
        body, headers = delivery(payment_event(), SECRET, event_id=event_id)
        async with client.post(URL, data=body, headers=headers) as response:
            return response.status

    statuses = await asyncio.gather(*(post_after(i * 0.003, f"evt_gather_{i}") for i in range(5)))

    assert statuses == [200] * 5
    metrics = await (await client.get("/metrics")).text()
    batches = _sample(metrics, "payhooks_ingest_batch_size_count")
    assert (batches, _sample(metrics, "payhooks_ingest_batch_size_sum")) == (1, 5)
    assert await db.fetchval("SELECT count(*) FROM inbox") == 5


async def test_a_batch_goes_without_waiting_out_gather_s_once_gather_enough_are_in(
    aiohttp_client: Any, settings: Settings, db: Any, amqp: Any
) -> None:
    """A closed loop of clients sends its next requests together once answered: a batch goes
    when gather_enough are waiting, not when the oldest has waited gather_s (30 s here)."""
    config = AcceptorConfig(gather_s=30.0, gather_enough=4)
    app = create_app(settings, acceptor_config=config)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)

    async def post(event_id: str) -> int:
        body, headers = delivery(payment_event(), SECRET, event_id=event_id)
        async with client.post(URL, data=body, headers=headers) as response:
            return response.status

    started = time.monotonic()
    statuses = await asyncio.wait_for(
        asyncio.gather(*(post(f"evt_enough_{i}") for i in range(4))), timeout=10
    )

    assert statuses == [200] * 4
    assert time.monotonic() - started < 10
    metrics = await (await client.get("/metrics")).text()
    assert _sample(metrics, "payhooks_ingest_batch_size_count") == 1
    assert _sample(metrics, "payhooks_ingest_batch_size_sum") == 4


def _sample(metrics_text: str, name: str) -> float:
    [line] = [line for line in metrics_text.splitlines() if line.startswith(name + " ")]
    return float(line.rpartition(" ")[2])


async def test_unknown_event_type_is_accepted_into_unrouted(
    client: TestClient, db: Any, amqp: Any, topology: Topology
) -> None:
    body, headers = delivery({"event": "kyc.status_changed", "status": "approved"}, SECRET)

    response = await client.post(URL, data=body, headers=headers)

    assert response.status == 200
    assert await response.json() == {"status": "accepted"}
    assert len(await inbox_rows(db)) == 1
    assert len(await drain(amqp, topology.unrouted)) == 1
    assert await drain(amqp, topology.work["orders"].name, settle_s=0.1) == []


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda h, b: (h.pop("X-Webhook-Id"), b)[1], "missing X-Webhook-Id"),
        (lambda h, b: (h.pop("X-Webhook-Timestamp"), b)[1], "missing X-Webhook-Timestamp"),
        (lambda h, b: (h.update({"X-Webhook-Timestamp": "soon"}), b)[1], "Unix seconds"),
        (lambda h, b: b"{not json", "not valid JSON"),
        (lambda h, b: b"[1, 2]", "JSON object"),
        (lambda h, b: b'{"payment_id": "p"}', '"event"'),
    ],
)
async def test_malformed_request_is_400_and_stored_nowhere(
    client: TestClient, db: Any, amqp: Any, topology: Topology, mutate: Any, reason: str
) -> None:
    headers = signed_headers(b"", SECRET)
    body = mutate(headers, orjson.dumps(payment_event()))
    if "X-Webhook-Timestamp" in headers and headers["X-Webhook-Timestamp"].isdigit():
        headers = {**headers, **_resign(body, headers)}

    with capture_logs() as logs:
        response = await client.post(URL, data=body, headers=headers)
        await response.read()

    assert response.status == 400
    assert reason in (await response.json())["error"]
    (line,) = [entry for entry in logs if entry["event"] == "webhook.received"]
    assert (line["outcome"], line["status"]) == ("malformed", 400)
    assert reason in line["error"]  # the runbook's "why" for PayhooksWebhooksRejected
    assert await inbox_rows(db) == []
    assert await drain(amqp, topology.work["orders"].name, settle_s=0.1) == []


def _resign(body: bytes, headers: dict[str, str]) -> dict[str, str]:
    fresh = signed_headers(body, SECRET, timestamp=int(headers["X-Webhook-Timestamp"]))
    return {"X-Webhook-Signature": fresh["X-Webhook-Signature"]}


async def test_bad_signature_is_401(client: TestClient, db: Any) -> None:
    body, headers = delivery(payment_event(), "not-our-secret")

    response = await client.post(URL, data=body, headers=headers)

    assert response.status == 401
    assert await inbox_rows(db) == []


@pytest.mark.parametrize("skew_s", [-301, 301])
async def test_timestamp_outside_tolerance_is_401_stale(
    client: TestClient, db: Any, skew_s: int
) -> None:
    body, headers = delivery(payment_event(), SECRET, timestamp=int(time.time()) + skew_s)

    response = await client.post(URL, data=body, headers=headers)

    assert response.status == 401
    metrics = await (await client.get("/metrics")).text()
    assert 'payhooks_webhooks_received_total{outcome="stale",provider="xhub"} 1.0' in metrics
    assert await inbox_rows(db) == []


async def test_body_over_limit_is_413(
    aiohttp_client: Any, make_settings: Any, db: Any, amqp: Any
) -> None:
    app = create_app(make_settings(INGEST_MAX_BODY="1024"))
    client = await aiohttp_client(app)
    body, headers = delivery(payment_event(padding="x" * 2000), SECRET)

    with capture_logs() as logs:
        response = await client.post(URL, data=body, headers=headers)
        await response.read()

    assert response.status == 413
    (line,) = [entry for entry in logs if entry["event"] == "webhook.received"]
    assert (line["outcome"], line["error"]) == ("too_large", "body over 1024 bytes")
    assert await inbox_rows(db) == []


@pytest.mark.parametrize("corrupt", [False, True], ids=["gzip", "corrupt_gzip"])
async def test_compressed_body_is_checked_as_sent_and_never_inflated(
    client: TestClient, db: Any, corrupt: bool
) -> None:
    """SPEC: the signature covers the exact bytes received. A gzip body is verified as sent
    (so a signature over the inflated JSON fails) and, being no JSON, is 400; never a 500."""
    raw = orjson.dumps(payment_event())
    sent = gzip.compress(raw)[:-8] + b"\x00" * 8 if corrupt else gzip.compress(raw)
    encoding = {"Content-Encoding": "gzip"}

    over_sent = await client.post(URL, data=sent, headers=signed_headers(sent, SECRET) | encoding)
    over_inflated = await client.post(
        URL, data=sent, headers=signed_headers(raw, SECRET) | encoding
    )

    assert over_sent.status == 400
    assert (await over_sent.json())["error"] == "body is not valid JSON"
    assert over_inflated.status == 401
    assert await inbox_rows(db) == []


async def test_payment_id_too_long_for_any_order_is_stored_without_a_lookup_key(
    client: TestClient, db: Any, amqp: Any, topology: Topology
) -> None:
    """An 8,000-character payment id (beyond what a btree index holds) neither fails the
    batch it joins nor gets lost: stored and published; the orders worker will dead-letter
    it as an unknown payment."""
    strange = delivery(payment_event(payment_id="p" * 8000), SECRET, event_id="evt_long_pay")
    normal = [delivery(payment_event(), SECRET, event_id=f"evt_next_{i}") for i in range(10)]

    responses = await asyncio.gather(
        *(client.post(URL, data=body, headers=headers) for body, headers in [strange, *normal])
    )

    assert [r.status for r in responses] == [200] * 11
    row = await db.fetchrow("SELECT payment_id, body FROM inbox WHERE event_id = 'evt_long_pay'")
    assert row["payment_id"] is None
    assert bytes(row["body"]) == strange[0]
    ids = {m.message_id for m in await drain(amqp, topology.work["orders"].name)}
    assert ids == {"evt_long_pay", *(f"evt_next_{i}" for i in range(10))}
