"""POST /webhooks/standard end to end (real PostgreSQL, RabbitMQ, SMTP sink): a Standard
Webhooks payment event, signed by the official `standardwebhooks` package, drives the same
effects as X-Hub's; a duplicate drives none; hostile input is never a 5xx and never stored."""

from __future__ import annotations

import base64
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook as OfficialSigner

from services.ingest.app import create_app
from shared.amqp.broker import BROKER
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.ops.operator_actions import Edge, Operator, replay_recorded
from shared.ops.payment_view import payment_view
from shared.ops.replay_selection import ReplayRequest
from shared.providers.standard.events import envelope
from shared.queries import inbox as inbox_sql
from tests.conftest import SmtpSink
from tests.integration.system import (
    System,
    effects,
    paid_once,
    post,
    quiescent,
    register,
    smtp_messages,
)
from tests.refusals import HOSTILE_EXAMPLES, assert_refused_and_unstored, received

URL = "/webhooks/standard"
SECRET = "whsec_" + base64.b64encode(b"payhooks standard webhooks test key").decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"the key before the rotation").decode()
SECRETS = f"{SECRET},{OLD_SECRET}"
MAX_BODY = 1024


def paid(payment_id: str, *, amount: str = "100.00") -> dict[str, Any]:
    """A payment.status_changed "paid" in the envelope docs/providers.md documents."""
    return envelope(
        "payment.status_changed",
        "2026-12-01T10:00:00Z",
        payment_id=payment_id,
        external_id=f"ord_{payment_id}",
        status="paid",
        amount=amount,
        currency="USD",
        created_at="2026-12-01T10:00:00Z",
    )


def signed(
    payload: dict[str, Any] | bytes, event_id: str, *, secret: str = SECRET, at: float = 0
) -> tuple[bytes, dict[str, str]]:
    """Body and headers as a Standard Webhooks sender sends them (the official signer)."""
    body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    moment = datetime.fromtimestamp(at or time.time(), tz=UTC)
    return body, {
        "webhook-id": event_id,
        "webhook-timestamp": str(int(moment.timestamp())),
        "webhook-signature": OfficialSigner(secret).sign(event_id, moment, body.decode()),
        "Content-Type": "application/json",
    }


async def send(client: TestClient, payload: dict[str, Any], event_id: str) -> Any:
    body, headers = signed(payload, event_id)
    response = await client.post(URL, data=body, headers=headers)
    assert response.status == 200, await response.text()
    return await response.json()


@pytest.fixture
def system_env() -> dict[str, str]:
    return {"STANDARD_WEBHOOK_SECRETS": SECRETS}


async def test_a_standard_payment_paid_pays_the_order_once_with_bonus_and_email(
    system: System, db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    payment_id = f"pay_std_{uuid.uuid4().hex[:10]}"
    event_id = f"msg_{uuid.uuid4().hex}"
    await register(db, payment_id)

    assert await send(system.ingest, paid(payment_id), event_id) == {"status": "accepted"}
    await quiescent(db, system)

    # The workers know the event by its message id: the provider's name before its id.
    await paid_once(db, smtp[0], payment_id, f"standard:{event_id}")
    stored = await db.fetchrow(
        "SELECT provider, event_type, payment_id FROM inbox WHERE event_id = $1", event_id
    )
    assert dict(stored) == {
        "provider": "standard",
        "event_type": "payment.status_changed",
        "payment_id": payment_id,
    }

    # The payment view finds what the orders worker decided about it.
    view = await payment_view(db, payment_id, [])
    assert view is not None
    assert [(e["event_id"], e["outcome"], e["status"]) for e in view["events"]] == [
        (event_id, "transitioned", "paid")
    ]

    # The same event again (a retry): a duplicate, and nothing more happens.
    assert await send(system.ingest, paid(payment_id), event_id) == {"status": "duplicate"}
    await quiescent(db, system)
    await paid_once(db, smtp[0], payment_id, f"standard:{event_id}")
    assert await db.fetchval("SELECT count(*) FROM inbox WHERE event_id = $1", event_id) == 1


async def test_a_refund_in_the_standard_envelope_refunds_and_claws_back(
    system: System, db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    payment_id = f"pay_std_{uuid.uuid4().hex[:10]}"
    await register(db, payment_id)
    refund = envelope(
        "refund.completed",
        "2026-12-01T11:00:00Z",
        refund_id=f"re_{payment_id}",
        payment_id=payment_id,
        amount="100.00",
        currency="USD",
    )  # no created_at in data: the envelope's timestamp stands in

    await send(system.ingest, paid(payment_id), f"msg_p_{payment_id}")
    await send(system.ingest, refund, f"msg_r_{payment_id}")
    await quiescent(db, system)

    assert await effects(db, payment_id) == {
        "status": "REFUNDED",
        "bonus": 0,
        "ledger": ["grant", "clawback"],
        "emails": ["payment_refunded", "payment_succeeded"],
    }
    assert smtp_messages(smtp[0], payment_id) == ["payment_refunded", "payment_succeeded"]


async def test_one_event_id_from_two_providers_is_two_events(
    system: System, db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    """Dedup is per (provider, event id), in the inbox and in the workers alike."""
    event_id = f"shared_id_{uuid.uuid4().hex}"
    by_xhub, by_standard = (f"pay_{p}_{uuid.uuid4().hex[:8]}" for p in ("xh", "std"))
    for payment_id in (by_xhub, by_standard):
        await register(db, payment_id)

    assert await post(
        system.ingest,
        {
            "event": "payment.status_changed",
            "payment_id": by_xhub,
            "status": "paid",
            "amount": "100.00",
            "currency": "USD",
            "created_at": "2026-12-01T10:00:00Z",
        },
        event_id,
    ) == {"status": "accepted"}
    assert await send(system.ingest, paid(by_standard), event_id) == {"status": "accepted"}
    await quiescent(db, system)

    await paid_once(db, smtp[0], by_xhub, event_id)
    await paid_once(db, smtp[0], by_standard, f"standard:{event_id}")


async def test_the_previous_secret_still_verifies_during_a_rotation(
    system: System, db: Any
) -> None:
    payment_id = f"pay_std_{uuid.uuid4().hex[:10]}"
    body, headers = signed(paid(payment_id), f"msg_{payment_id}", secret=OLD_SECRET)

    response = await system.ingest.post(URL, data=body, headers=headers)

    assert response.status == 200, await response.text()


async def test_a_provider_without_secrets_has_no_route(
    aiohttp_client: Any, make_settings: Any, amqp: Any
) -> None:
    app = create_app(make_settings())  # XHUB_WEBHOOK_SECRETS only
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    body, headers = signed(paid("pay_nowhere"), "msg_nowhere")

    assert (await client.post(URL, data=body, headers=headers)).status == 404
    metrics = await (await client.get("/metrics")).text()
    assert 'provider="standard"' not in metrics


# --- hostile input on /webhooks/standard ---------------------------------------------------


@pytest.fixture
async def client(aiohttp_client: Any, make_settings: Any, amqp: Any) -> TestClient:
    settings: Settings = make_settings(
        INGEST_MAX_BODY=str(MAX_BODY), STANDARD_WEBHOOK_SECRETS=SECRETS
    )
    app = create_app(settings, sweep_interval_s=0.2)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    return client


header_text = st.text(st.characters(exclude_categories=("Cc", "Cs")), max_size=60)
foreign_secrets = st.binary(min_size=1, max_size=32).map(
    lambda key: "whsec_" + base64.b64encode(key).decode()
)
bodies = st.one_of(
    st.binary(max_size=MAX_BODY),
    st.binary(min_size=MAX_BODY + 1, max_size=3 * MAX_BODY),
    st.uuids().map(lambda u: orjson.dumps(paid(f"pay_{u.hex[:12]}"))),
    st.fixed_dictionaries({"type": st.text(max_size=20), "data": st.just({})}).map(orjson.dumps),
)


@st.composite
def unsigned_deliveries(draw: st.DrawFn) -> tuple[dict[str, str], bytes]:
    """Headers and body of a Standard Webhooks delivery without a valid signature."""
    body = draw(bodies)
    event_id = draw(st.one_of(st.uuids().map(lambda u: f"msg_{u.hex}"), header_text))
    now = int(time.time())
    timestamp = draw(st.one_of(st.integers(-120, 120).map(lambda s: str(now + s)), header_text))
    moment = datetime.fromtimestamp(now, tz=UTC)
    signature = draw(
        st.one_of(
            header_text,
            st.from_regex(r"v1,[A-Za-z0-9+/]{43}=", fullmatch=True),
            st.from_regex(r"(v1a?,[A-Za-z0-9+/=]{0,90} ?){1,4}", fullmatch=True),
            # A real signature, from a key we don't hold...
            foreign_secrets.map(
                lambda s: OfficialSigner(s).sign(event_id, moment, body.decode(errors="replace"))
            ),
            # ... or from ours, over another event id (the id is signed too).
            st.just(
                OfficialSigner(SECRET).sign(f"{event_id}x", moment, body.decode(errors="replace"))
            ),
        )
    )
    known = {
        name: value
        for name, value in (
            ("webhook-id", event_id),
            ("webhook-timestamp", timestamp),
            ("webhook-signature", signature),
        )
        if draw(st.sampled_from(("keep", "keep", "keep", "keep", "drop"))) == "keep"
    }
    return known, body


@HOSTILE_EXAMPLES
@given(attempt=unsigned_deliveries())
async def test_an_unsigned_standard_delivery_is_rejected_and_stored_nowhere(
    client: TestClient, db: Any, attempt: tuple[dict[str, str], bytes]
) -> None:
    headers, body = attempt
    event_id = headers.get("webhook-id", "").strip()
    await assert_refused_and_unstored(client, db, URL, "standard", headers, body, event_id)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'"text"',
        b"{}",
        b'{"type":"payment.status_changed"}',
        b'{"type":"payment.status_changed","data":"x"}',
        b'{"type":"","data":{}}',
        b'{"type":7,"data":{}}',
        b'{"event":"payment.status_changed","payment_id":"pay_1"}',  # X-Hub's body
    ],
)
async def test_a_signed_body_that_is_no_envelope_is_400_and_stored_nowhere(
    client: TestClient, db: Any, body: bytes
) -> None:
    event_id = f"msg_{uuid.uuid4().hex}"
    body_, headers = signed(body, event_id)

    response = await client.post(URL, data=body_, headers=headers)

    assert response.status == 400, await response.text()
    assert (await response.json())["status"] == "rejected"
    assert await db.fetchval("SELECT count(*) FROM inbox WHERE event_id = $1", event_id) == 0
    assert received(await (await client.get("/metrics")).text(), "standard")["malformed"] >= 1


@pytest.mark.parametrize("offset_s", [-400, 400])
async def test_a_stale_or_future_standard_delivery_is_401_stale(
    client: TestClient, db: Any, offset_s: int
) -> None:
    event_id = f"msg_{uuid.uuid4().hex}"
    body, headers = signed(paid("pay_stale"), event_id, at=time.time() + offset_s)

    response = await client.post(URL, data=body, headers=headers)

    assert response.status == 401
    assert await db.fetchval("SELECT count(*) FROM inbox WHERE event_id = $1", event_id) == 0
    assert received(await (await client.get("/metrics")).text(), "standard")["stale"] >= 1


async def test_an_xhub_signed_delivery_is_refused_on_the_standard_route(
    client: TestClient, db: Any
) -> None:
    from tests.helpers import delivery, payment_event

    body, headers = delivery(payment_event(), "test-secret-new")

    response = await client.post(URL, data=body, headers=headers)

    assert response.status == 400  # no webhook-id: not a Standard Webhooks delivery at all
    assert await db.fetchval("SELECT count(*) FROM inbox WHERE body = $1", body) == 0


async def test_a_replayed_standard_event_reaches_the_orders_worker_as_ingest_sent_it(
    system: System, db: Any, channel: Any, topology: Topology, smtp: tuple[SmtpSink, int]
) -> None:
    """Replay sends the canonical event under the id the workers know (`standard:` + id): a
    processed one is counted as would-skip and skipped, one whose publish was lost takes
    effect once."""
    done, lost = (f"pay_std_{uuid.uuid4().hex[:10]}" for _ in range(2))
    done_id, lost_id = (f"msg_{uuid.uuid4().hex}" for _ in range(2))
    for payment_id in (done, lost):
        await register(db, payment_id)
    await send(system.ingest, paid(done), done_id)
    await quiescent(db, system)
    body, _ = signed(paid(lost), lost_id)  # stored, never published: only a replay sends it
    [stored] = await inbox_sql.store_batch(
        db, "standard", [inbox_sql.InboxEntry(lost_id, "payment.status_changed", lost, body, {})]
    )
    await db.execute("DELETE FROM inbox_unpublished WHERE id = $1", stored.id)

    request = ReplayRequest.parse(
        provider="standard", event_ids=[done_id, lost_id], workers=["orders"]
    )
    by = Operator("test", Edge.CLI)

    @contextlib.asynccontextmanager
    async def opened() -> AsyncIterator[Any]:
        yield channel

    # The outcome filter finds the orders worker's mark by the same prefixed id.
    processed = ReplayRequest.parse(
        provider="standard", event_ids=[done_id, lost_id], workers=["orders"], outcome="processed"
    )
    only = await replay_recorded(db, opened, topology, processed, by, db, dry_run=True)
    assert only.event_ids == [done_id]

    dry = (await replay_recorded(db, opened, topology, request, by, db, dry_run=True)).as_json()
    assert dry["workers"]["orders"]["messages"] == 2
    assert dry["workers"]["orders"]["would_skip"] == 1  # the processed one, by its prefixed id
    real = (await replay_recorded(db, opened, topology, request, by, db, dry_run=False)).as_json()
    assert real["workers"]["orders"]["messages"] == 2
    await quiescent(db, system, extra_orders_deliveries=1)  # the done one, a second time

    await paid_once(db, smtp[0], done, f"standard:{done_id}")
    await paid_once(db, smtp[0], lost, f"standard:{lost_id}")
