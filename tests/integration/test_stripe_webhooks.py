"""POST /webhooks/stripe end to end (real PostgreSQL, RabbitMQ, SMTP sink): Stripe's events
(tests/fixtures/stripe/), signed by the official `stripe` package, drive the same effects as
X-Hub's; a duplicate drives none; disputes are stored and unrouted; hostile input is never a
5xx and never stored."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
import pytest
import stripe
from aiohttp.test_utils import TestClient
from hypothesis import given
from hypothesis import strategies as st

from services.ingest.app import create_app
from shared.amqp.broker import BROKER
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.ops.payment_view import payment_view
from tests.conftest import SmtpSink
from tests.helpers import eventually
from tests.integration.system import (
    System,
    effects,
    paid_once,
    quiescent,
    register,
    smtp_messages,
    start_system,
    system_settings,
)
from tests.refusals import HOSTILE_EXAMPLES, assert_refused_and_unstored, received
from tests.stripe_events import refund_entry, refunds_list, stripe_event

URL = "/webhooks/stripe"
SECRET = "whsec_payhooks_stripe_integration_key"
OLD_SECRET = "whsec_payhooks_stripe_key_before_the_roll"
SECRETS = f"{SECRET},{OLD_SECRET}"
MAX_BODY = 4096


def succeeded(payment_id: str, event_id: str, *, amount: int = 10_000) -> dict[str, Any]:
    """payment_intent.succeeded for a USD 100.00 order (Stripe's minor units)."""
    return stripe_event(
        "payment_intent.succeeded",
        event_id=event_id,
        payment_id=payment_id,
        created=int(time.time()) - 5,
        amount=amount,
        amount_received=amount,
        currency="usd",
    )


def refunded(payment_id: str, event_id: str, refund_id: str) -> dict[str, Any]:
    """charge.refunded, the whole USD 100.00 back in one refund."""
    now = int(time.time())
    return stripe_event(
        "charge.refunded",
        event_id=event_id,
        payment_id=payment_id,
        created=now,
        amount=10_000,
        amount_captured=10_000,
        amount_refunded=10_000,
        refunded=True,
        refunds=refunds_list(refund_entry(refund_id, 10_000, now - 1)),
    )


def signed(
    payload: dict[str, Any] | bytes, *, secret: str = SECRET, at: float = 0
) -> tuple[bytes, dict[str, str]]:
    """Body and headers as Stripe sends them (the official library's signer)."""
    body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    header = stripe.WebhookSignature.generate_signature_header(
        body.decode(errors="replace"), secret, timestamp=int(at or time.time())
    )
    return body, {"Stripe-Signature": header, "Content-Type": "application/json; charset=utf-8"}


async def send(client: TestClient, payload: dict[str, Any]) -> Any:
    body, headers = signed(payload)
    response = await client.post(URL, data=body, headers=headers)
    assert response.status == 200, await response.text()
    return await response.json()


@pytest.fixture
def system_env() -> dict[str, str]:
    return {"STRIPE_WEBHOOK_SECRETS": SECRETS}


async def test_a_stripe_payment_intent_succeeded_pays_the_order_once_with_bonus_and_email(
    system: System, db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    payment_id = f"pi_{uuid.uuid4().hex[:24]}"
    event_id = f"evt_{uuid.uuid4().hex[:24]}"
    await register(db, payment_id)  # the order names the PaymentIntent

    assert await send(system.ingest, succeeded(payment_id, event_id)) == {"status": "accepted"}
    await quiescent(db, system)

    await paid_once(db, smtp[0], payment_id, f"stripe:{event_id}")
    stored = await db.fetchrow(
        "SELECT provider, event_type, payment_id, body FROM inbox WHERE event_id = $1", event_id
    )
    assert (stored["provider"], stored["event_type"], stored["payment_id"]) == (
        "stripe",
        "payment.status_changed",
        payment_id,
    )
    assert orjson.loads(stored["body"])["type"] == "payment_intent.succeeded"  # as received

    view = await payment_view(db, payment_id, [])
    assert view is not None
    assert [(e["event_id"], e["outcome"], e["status"]) for e in view["events"]] == [
        (event_id, "transitioned", "paid")
    ]

    # Stripe sends the same event again (no 2xx seen, or its own duplicate): nothing more.
    assert await send(system.ingest, succeeded(payment_id, event_id)) == {"status": "duplicate"}
    await quiescent(db, system)
    await paid_once(db, smtp[0], payment_id, f"stripe:{event_id}")
    assert await db.fetchval("SELECT count(*) FROM inbox WHERE event_id = $1", event_id) == 1


async def test_a_charge_refunded_refunds_and_claws_back_once(
    system: System, db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    payment_id = f"pi_{uuid.uuid4().hex[:24]}"
    await register(db, payment_id)
    refund = refunded(payment_id, f"evt_r_{payment_id}", f"re_{payment_id}")

    await send(system.ingest, succeeded(payment_id, f"evt_p_{payment_id}"))
    await send(system.ingest, refund)
    await quiescent(db, system)
    await send(system.ingest, refund)  # a retry of the refund
    await quiescent(db, system)

    assert await effects(db, payment_id) == {
        "status": "REFUNDED",
        "bonus": 0,
        "ledger": ["grant", "clawback"],
        "emails": ["payment_refunded", "payment_succeeded"],
    }
    assert smtp_messages(smtp[0], payment_id) == ["payment_refunded", "payment_succeeded"]


async def test_partial_refunds_count_once_each_whichever_event_tells_them(
    system: System, db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    """refund.created (any API version) and charge.refunded (with its refunds list) may both
    tell one refund: it is counted once, by its re_ id; two partials refund the whole."""
    payment_id = f"pi_{uuid.uuid4().hex[:24]}"
    await register(db, payment_id)
    now = int(time.time())
    first, second = f"re_a_{payment_id}", f"re_b_{payment_id}"

    await send(system.ingest, succeeded(payment_id, f"evt_p_{payment_id}"))
    await send(
        system.ingest,
        stripe_event(
            "refund.created",
            event_id=f"evt_r1_{payment_id}",
            payment_id=payment_id,
            created=now,
            id=first,
            amount=3_000,
            status="succeeded",
        ),
    )
    await send(
        system.ingest,
        stripe_event(
            "charge.refunded",
            event_id=f"evt_c1_{payment_id}",
            payment_id=payment_id,
            created=now,
            amount=10_000,
            amount_refunded=3_000,
            refunded=False,
            refunds=refunds_list(refund_entry(first, 3_000, now)),
        ),
    )
    await quiescent(db, system)
    assert (await effects(db, payment_id))["status"] == "PAID"
    refunded = await db.fetchval(
        "SELECT refunded_amount FROM orders WHERE payment_id = $1", payment_id
    )
    assert str(refunded) == "30.00"

    await send(
        system.ingest,
        stripe_event(
            "refund.created",
            event_id=f"evt_r2_{payment_id}",
            payment_id=payment_id,
            created=now + 1,
            id=second,
            amount=7_000,
            status="succeeded",
        ),
    )
    await quiescent(db, system)
    assert await effects(db, payment_id) == {
        "status": "REFUNDED",
        "bonus": 0,
        "ledger": ["grant", "clawback"],
        "emails": ["payment_refunded", "payment_succeeded"],
    }


async def test_events_out_of_order_end_in_the_same_story(
    system: System, db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    """Stripe does not order its deliveries: the refund may come before the payment."""
    payment_id = f"pi_{uuid.uuid4().hex[:24]}"
    await register(db, payment_id)

    await send(system.ingest, refunded(payment_id, f"evt_r_{payment_id}", f"re_{payment_id}"))
    await quiescent(db, system)
    await send(system.ingest, succeeded(payment_id, f"evt_p_{payment_id}"))
    await quiescent(db, system)

    found = await effects(db, payment_id)
    assert found["status"] == "REFUNDED"
    assert found["bonus"] == 0  # never more points than the payment earns


async def test_a_dispute_is_stored_and_unrouted_with_its_payment(system: System, db: Any) -> None:
    payment_id = f"pi_{uuid.uuid4().hex[:24]}"
    event_id = f"evt_{uuid.uuid4().hex[:24]}"
    await register(db, payment_id)

    dispute = stripe_event("charge.dispute.created", event_id=event_id, payment_id=payment_id)
    assert await send(system.ingest, dispute) == {"status": "accepted"}
    await eventually(  # published (to `unrouted`: no worker takes it)
        lambda: db.fetchval(
            "SELECT count(*) FROM inbox_unpublished u JOIN inbox i ON i.id = u.id"
            " WHERE i.provider = 'stripe' AND i.event_id = $1",
            event_id,
        ),
        lambda n: n == 0,
    )

    stored = await db.fetchrow(
        "SELECT event_type, payment_id FROM inbox WHERE provider = 'stripe' AND event_id = $1",
        event_id,
    )
    assert dict(stored) == {
        "event_type": "stripe.charge.dispute.created",
        "payment_id": payment_id,
    }
    assert (await effects(db, payment_id))["status"] == "PENDING"  # no order change


async def test_a_live_deployment_stores_a_test_mode_event_and_applies_nothing(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
    db: Any,
) -> None:
    settings = system_settings(
        make_settings, smtp[1], STRIPE_WEBHOOK_SECRETS=SECRETS, STRIPE_LIVEMODE="live"
    )
    live = await start_system(aiohttp_client, settings, amqp, topology)
    payment_id = f"pi_{uuid.uuid4().hex[:24]}"
    test_event, live_event = (f"evt_{m}_{uuid.uuid4().hex[:20]}" for m in ("t", "l"))
    await register(db, payment_id)

    in_test_mode = succeeded(payment_id, test_event)  # the fixtures are test mode
    assert await send(live.ingest, in_test_mode) == {"status": "accepted"}
    await eventually(
        lambda: db.fetchval(
            "SELECT count(*) FROM inbox_unpublished u JOIN inbox i ON i.id = u.id"
            " WHERE i.provider = 'stripe' AND i.event_id = $1",
            test_event,
        ),
        lambda n: n == 0,
    )
    stored = await db.fetchval(
        "SELECT event_type FROM inbox WHERE provider = 'stripe' AND event_id = $1", test_event
    )
    assert stored == "stripe.payment_intent.succeeded"  # Stripe's type: unrouted
    assert (await effects(db, payment_id))["status"] == "PENDING"

    in_live_mode = succeeded(payment_id, live_event) | {"livemode": True}
    assert await send(live.ingest, in_live_mode) == {"status": "accepted"}
    await eventually(lambda: effects(db, payment_id), lambda e: e["status"] == "PAID")


async def test_the_previous_secret_still_verifies_during_a_roll(system: System) -> None:
    payment_id = f"pi_{uuid.uuid4().hex[:24]}"
    body, headers = signed(succeeded(payment_id, f"evt_{payment_id}"), secret=OLD_SECRET)

    response = await system.ingest.post(URL, data=body, headers=headers)

    assert response.status == 200, await response.text()


async def test_stripe_without_secrets_has_no_route(
    aiohttp_client: Any, make_settings: Any, amqp: Any
) -> None:
    app = create_app(make_settings())  # XHUB_WEBHOOK_SECRETS only
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    body, headers = signed(succeeded("pi_nowhere", "evt_nowhere"))

    assert (await client.post(URL, data=body, headers=headers)).status == 404
    metrics = await (await client.get("/metrics")).text()
    assert 'provider="stripe"' not in metrics


# --- hostile input on /webhooks/stripe -----------------------------------------------------


@pytest.fixture
async def client(aiohttp_client: Any, make_settings: Any, amqp: Any) -> TestClient:
    settings: Settings = make_settings(
        INGEST_MAX_BODY=str(MAX_BODY), STRIPE_WEBHOOK_SECRETS=SECRETS
    )
    app = create_app(settings, sweep_interval_s=0.2)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    return client


header_text = st.text(st.characters(exclude_categories=("Cc", "Cs")), max_size=80)
foreign_secrets = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=32).map(
    lambda s: f"whsec_{s}"
)
bodies = st.one_of(
    st.binary(max_size=MAX_BODY),
    st.binary(min_size=MAX_BODY + 1, max_size=3 * MAX_BODY),
    st.uuids().map(lambda u: orjson.dumps(succeeded(f"pi_{u.hex[:20]}", f"evt_{u.hex}"))),
    st.fixed_dictionaries(
        {"id": st.text(max_size=20), "type": st.text(max_size=20), "data": st.just({})}
    ).map(orjson.dumps),
)


@st.composite
def unsigned_deliveries(draw: st.DrawFn) -> tuple[dict[str, str], bytes]:
    """Headers and body of a Stripe delivery without a valid signature."""
    body = draw(bodies)
    text = body.decode(errors="replace")
    now = int(time.time())
    timestamp = draw(st.one_of(st.integers(-120, 120).map(lambda s: now + s), st.just(now)))
    signature = draw(
        st.one_of(
            header_text,
            st.from_regex(r"t=[0-9]{10},v1=[0-9a-f]{64}", fullmatch=True),
            st.from_regex(r"(t=[0-9]{0,12},)?(v[01]=[0-9a-f]{0,70},?){0,4}", fullmatch=True),
            # A real signature, from a secret we don't hold...
            foreign_secrets.map(
                lambda s: stripe.WebhookSignature.generate_signature_header(
                    text, s, timestamp=timestamp
                )
            ),
            # ... or from ours over another body (a replayed header, a tampered body).
            st.just(
                stripe.WebhookSignature.generate_signature_header(
                    text + " ", SECRET, timestamp=timestamp
                )
            ),
        )
    )
    keep = draw(st.sampled_from(("keep", "keep", "keep", "drop")))
    return ({"Stripe-Signature": signature} if keep == "keep" else {}), body


@HOSTILE_EXAMPLES
@given(attempt=unsigned_deliveries())
async def test_an_unsigned_stripe_delivery_is_rejected_and_stored_nowhere(
    client: TestClient, db: Any, attempt: tuple[dict[str, str], bytes]
) -> None:
    headers, body = attempt  # Stripe's event id is inside the body
    await assert_refused_and_unstored(client, db, URL, "stripe", headers, body)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'"text"',
        b"{}",
        b'{"id":"evt_1","type":"payment_intent.succeeded"}',
        b'{"id":"evt_1","type":"payment_intent.succeeded","data":"x"}',
        b'{"id":"evt_1","type":"payment_intent.succeeded","data":{"object":[]}}',
        b'{"type":"payment_intent.succeeded","data":{"object":{}}}',
        b'{"id":"","type":"x","data":{"object":{}}}',
        b'{"id":"evt_1","type":7,"data":{"object":{}}}',
        b'{"event":"payment.status_changed","payment_id":"pay_1"}',  # X-Hub's body
    ],
)
async def test_a_signed_body_that_is_no_stripe_event_is_400_and_stored_nowhere(
    client: TestClient, db: Any, body: bytes
) -> None:
    body_, headers = signed(body)

    response = await client.post(URL, data=body_, headers=headers)

    assert response.status == 400, await response.text()
    assert (await response.json())["status"] == "rejected"
    assert await db.fetchval("SELECT count(*) FROM inbox WHERE body = $1", body) == 0
    assert received(await (await client.get("/metrics")).text(), "stripe")["malformed"] >= 1


@pytest.mark.parametrize("offset_s", [-400, 400])
async def test_a_stale_or_future_stripe_delivery_is_401_stale(
    client: TestClient, db: Any, offset_s: int
) -> None:
    event_id = f"evt_{uuid.uuid4().hex}"
    body, headers = signed(succeeded("pi_stale", event_id), at=time.time() + offset_s)

    response = await client.post(URL, data=body, headers=headers)

    assert response.status == 401
    assert await db.fetchval("SELECT count(*) FROM inbox WHERE event_id = $1", event_id) == 0
    assert received(await (await client.get("/metrics")).text(), "stripe")["stale"] >= 1


async def test_an_xhub_signed_delivery_is_refused_on_the_stripe_route(
    client: TestClient, db: Any
) -> None:
    from tests.helpers import delivery, payment_event

    body, headers = delivery(payment_event(), "test-secret-new")

    response = await client.post(URL, data=body, headers=headers)

    assert response.status == 401  # no Stripe-Signature: unsigned, as Stripe's library says
    assert await db.fetchval("SELECT count(*) FROM inbox WHERE body = $1", body) == 0
