"""Junk against the real ingest app: never a 5xx, never accepted, never stored.

Every delivery generated here lacks a valid signature from a configured secret, whatever else
it gets right, so the only acceptable answers are 400, 401 and 413.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient
from hypothesis import given
from hypothesis import strategies as st

from services.ingest.app import create_app
from shared.amqp.broker import BROKER
from shared.config import Settings
from shared.providers.xhub import ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER
from shared.providers.xhub.signatures import sign
from tests.conftest import TEST_SECRETS
from tests.helpers import delivery, payment_event
from tests.refusals import HOSTILE_EXAMPLES, assert_refused_and_unstored

URL = "/webhooks/xhub"
MAX_BODY = 1024
SECRET = TEST_SECRETS[0].encode()

# What aiohttp's client will put in a header value: no control characters, no lone surrogates.
header_text = st.text(st.characters(exclude_categories=("Cc", "Cs")), max_size=60)
event_ids = st.one_of(
    st.uuids().map(lambda u: f"evt_{u.hex}"), header_text.filter(lambda s: s.strip() != "")
)
json_bodies = st.one_of(
    st.builds(payment_event, payment_id=st.uuids().map(lambda u: f"pay_{u.hex[:12]}")),
    st.fixed_dictionaries({"event": st.text(min_size=1, max_size=40)}),
).map(orjson.dumps)
bodies = st.one_of(
    st.binary(max_size=MAX_BODY),
    st.binary(min_size=MAX_BODY + 1, max_size=3 * MAX_BODY),
    json_bodies,
)


@st.composite
def unsigned_deliveries(draw: st.DrawFn) -> tuple[dict[str, str], bytes]:
    """Headers and body of a delivery that carries no valid signature."""
    body = draw(bodies)
    now = int(time.time())
    timestamp = draw(
        st.one_of(
            st.integers(-120, 120).map(lambda skew: str(now + skew)),
            st.integers(-(10**6), 10**6).map(lambda skew: str(now + skew)),
            header_text,
        )
    )
    signature = draw(
        st.one_of(
            header_text,
            st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
            # A real HMAC, but from a secret we don't hold...
            st.binary(min_size=1, max_size=32)
            .filter(lambda s: s not in {t.encode() for t in TEST_SECRETS})
            .map(lambda secret: sign(secret, timestamp, body)),
            # ... or from our secret over other bytes or another timestamp.
            st.binary(max_size=64)
            .filter(lambda other: other != body)
            .map(lambda other: sign(SECRET, timestamp, other)),
            st.just(sign(SECRET, str(now - 1), body) if timestamp != str(now - 1) else ""),
        )
    )
    # Mostly present, so most deliveries get as far as the signature check.
    known = {
        name: value
        for name, value in (
            (ID_HEADER, draw(event_ids)),
            (TIMESTAMP_HEADER, timestamp),
            (SIGNATURE_HEADER, signature),
        )
        if draw(st.sampled_from(("keep", "keep", "keep", "keep", "keep", "drop"))) == "keep"
    }
    extra = draw(
        st.dictionaries(st.from_regex(r"X-[A-Za-z0-9]{1,12}", fullmatch=True), header_text)
    )
    return extra | known, body


@pytest.fixture
async def client(aiohttp_client: Any, make_settings: Any, amqp: Any) -> TestClient:
    settings: Settings = make_settings(INGEST_MAX_BODY=str(MAX_BODY))
    app = create_app(settings, sweep_interval_s=0.2)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    return client


@HOSTILE_EXAMPLES
@given(attempt=unsigned_deliveries())
async def test_unsigned_delivery_is_rejected_and_stored_nowhere(
    client: TestClient, db: Any, attempt: tuple[dict[str, str], bytes]
) -> None:
    headers, body = attempt
    event_id = headers.get(ID_HEADER, "").strip()
    await assert_refused_and_unstored(client, db, URL, "xhub", headers, body, event_id)


# Signed deliveries that PostgreSQL or AMQP cannot carry as they are (over-long AMQP short
# strings, NUL, undecodable header bytes). Each once got 503 for ever - 30 days of provider
# retries - and failed its whole batch; now each is accepted.


async def forget(db: Any, event_ids: list[str]) -> None:
    await db.execute("DELETE FROM inbox WHERE event_id = ANY($1::text[])", event_ids)


async def test_signed_event_type_over_255_bytes_is_accepted_into_unrouted(
    client: TestClient, db: Any
) -> None:
    body, headers = delivery({"event": "x" * 300}, TEST_SECRETS[0])
    try:
        response = await client.post(URL, data=body, headers=headers)

        assert response.status == 200
    finally:
        await forget(db, [headers[ID_HEADER]])


async def test_signed_event_id_of_255_non_ascii_characters_is_accepted(
    client: TestClient, db: Any
) -> None:
    event_id = "é" * 200
    body, headers = delivery(payment_event(), TEST_SECRETS[0], event_id=event_id)
    try:
        response = await client.post(URL, data=body, headers=headers)

        assert response.status == 200
    finally:
        await forget(db, [event_id])


async def test_signed_delivery_with_a_nul_in_payment_id_is_not_503(
    client: TestClient, db: Any
) -> None:
    body, headers = delivery(
        {"event": "payment.status_changed", "payment_id": "pay\u0000"}, TEST_SECRETS[0]
    )
    try:
        response = await client.post(URL, data=body, headers=headers)

        assert response.status < 500
    finally:
        await forget(db, [headers[ID_HEADER]])


async def test_signed_delivery_with_a_non_utf8_header_byte_is_not_503(
    client: TestClient, db: Any
) -> None:
    body, headers = delivery(payment_event(), TEST_SECRETS[0])
    request = b"POST %s HTTP/1.1\r\nHost: test\r\nConnection: close\r\n" % URL.encode()
    request += b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
    request += b"Content-Length: %d\r\nX-Note: caf\xe9\r\n\r\n%s" % (len(body), body)
    assert client.server.host is not None
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    try:
        writer.write(request)
        await writer.drain()
        status_line = await reader.readline()

        assert status_line.split()[1] == b"200"
    finally:
        writer.close()
        await writer.wait_closed()
        await forget(db, [headers[ID_HEADER]])
