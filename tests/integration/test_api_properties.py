"""Hostile requests with the admin token against the real api: never a 5xx, and every answer
one the OpenAPI document gives for that operation (an unknown path: a problem+json 404)."""

from __future__ import annotations

import base64
import io
import re
from typing import Any
from urllib.parse import quote, quote_from_bytes

import orjson
import pytest
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from services.api.openapi import DOCUMENT
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.ops import dlq
from tests.integration.api_contract import AUTH, check_problem, documented, running_api
from tests.integration.inbox_events import store_events
from tests.integration.test_dlq import Letter, put_dead_letters

NASTY = [
    "\x00",
    "a\x00b",
    "99999999999999999999999",
    "-1",
    "0",
    "1_0",
    " 5",
    "٣",
    "1e3",
    "null",
    "' OR 1=1 --",
    "x" * 300,
    "\ufeff",
    "%00",
]
texts = st.one_of(st.sampled_from(NASTY), st.text(max_size=40))


def sent(min_size: int) -> st.SearchStrategy[str]:
    """A path segment or query value as sent: any text, or bytes that are not UTF-8 at all."""
    return st.one_of(
        st.sampled_from(NASTY).map(lambda s: quote(s, safe="")),
        st.text(min_size=min_size, max_size=40).map(lambda s: quote(s, safe="")),
        st.binary(min_size=min_size, max_size=12).map(lambda b: quote_from_bytes(b, safe="")),
        st.sampled_from(["%FF", "%ED%A0%80", "%C3", "%2F"]),
    ).filter(lambda s: s not in {".", ".."})  # the client would resolve them away


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)  # what orjson writes
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
ORDER_KEYS = ["order_id", "payment_id", "user_id", "email", "amount", "currency"]
REQUEUE_KEYS = ["ids", "all", "dry_run", "limit", "reason", "event_type", "payment_id", "since"]
GOOD_ORDER = {
    "order_id": "ord_hostile",
    "payment_id": "pay_hostile",
    "user_id": "user_hostile",
    "email": "buyer@example.test",
    "amount": "100.00",
    "currency": "USD",
}
bodies = st.one_of(
    # A good order with some fields replaced, so most get past the first checks.
    st.dictionaries(st.sampled_from(ORDER_KEYS), json_values | texts, max_size=3).map(
        lambda changes: orjson.dumps(GOOD_ORDER | changes)
    ),
    st.dictionaries(st.sampled_from(REQUEUE_KEYS), json_values, max_size=4).map(orjson.dumps),
    json_values.map(orjson.dumps),
    st.binary(max_size=200),
    st.sampled_from(
        [
            b'{"all": true, "limit": 99999999999999999999999}',
            b'{"all": true, "dry_run": true, "since": "\\u0000"}',
            b'{"order_id": "\\u0000", "payment_id": "p", "user_id": "u", "email": "a@b.cd",'
            b' "amount": "1.00", "currency": "USD"}',
        ]
    ),
)
# The routes behind the token, the ones that take input (the probes and this document don't).
OPERATIONS = sorted(
    (method.upper(), path)
    for path, ops in DOCUMENT["paths"].items()
    for method, op in ops.items()
    if op.get("security") != []
)


cursors = st.one_of(
    st.tuples(st.integers(-5, 2**32), texts),
    # The events' cursors: two integers, near and far beyond what a timestamp and an id hold.
    st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1)),
).map(lambda pair: base64.urlsafe_b64encode(orjson.dumps(list(pair))).decode().rstrip("="))
# Query values: near the bounds, far beyond them, or anything at all.
numbers = st.one_of(st.integers(-10, 2000).map(str), st.just("99999999999999999999999"))
query_values = st.one_of(numbers, cursors, sent(0))


@st.composite
def hostile_requests(draw: st.DrawFn) -> tuple[str, str | None, str, bytes | None]:
    """(method, the documented path it aims at or None, the URL, the body)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(["GET", "POST"])), None, f"/api/{draw(sent(0))}", None
    method, template = draw(st.sampled_from(OPERATIONS))
    path = template
    for name in re.findall(r"{(\w+)}", template):
        # Half the time a queue that exists, so the request gets as far as its other checks.
        real = name == "queue" and draw(st.booleans())
        value = draw(st.sampled_from(list(dlq.QUEUES))) if real else draw(sent(1))
        path = path.replace(f"{{{name}}}", value)
    parameters = DOCUMENT["paths"][template][method.lower()].get("parameters", [])
    known_names = [p["name"] for p in parameters if p["in"] == "query"]
    names = st.sampled_from([*known_names, draw(sent(0))])
    query = draw(st.lists(st.tuples(names, query_values), max_size=3))
    if query:
        path += "?" + "&".join(f"{k}={v}" for k, v in query)
    return method, template, path, draw(bodies) if method == "POST" else None


@pytest.fixture
async def api(
    aiohttp_client: Any, settings: Settings, db: Any, channel: AbstractChannel, topology: Topology
) -> TestClient:
    # Something to page through and requeue (until a generated requeue takes it).
    await put_dead_letters(channel, topology.work["orders"], [Letter() for _ in range(3)])
    await store_events(db, 3)
    return await running_api(aiohttp_client, settings)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(attempt=hostile_requests())
async def test_hostile_requests_never_get_a_5xx_and_get_documented_answers(
    api: TestClient, attempt: tuple[str, str | None, str, bytes | None]
) -> None:
    method, template, url, body = attempt

    response = await api.request(
        method, url, data=None if body is None else io.BytesIO(body), headers=AUTH
    )

    assert response.status < 500, (url, await response.text())
    event(f"{method} {template} answered {response.status}")  # --hypothesis-show-statistics
    if template is not None:
        await documented(response, method, template)
    elif response.status >= 400:  # an unknown path, or by chance one that exists
        check_problem(response.status, response.content_type, await response.json())
