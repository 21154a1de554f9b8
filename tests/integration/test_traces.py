"""One payment through the system (real PostgreSQL, RabbitMQ and SMTP sink) with tracing on and
an in-memory exporter: one trace from ingest's request through the orders, bonuses and email
workers (the outbox's `order.paid` continues it), batch spans linked to it, no email address,
secret or signature in any attribute; and the end-to-end latency histogram observed."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from shared import tracing
from shared.amqp.topology import Topology
from shared.process.web import REGISTRY, base_app
from tests.conftest import TEST_SECRETS, SmtpSink
from tests.helpers import delivery, eventually, payment_event
from tests.integration.system import (
    SECRET,
    System,
    effects,
    quiescent,
    register,
    start_system,
    system_settings,
)

EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")


@pytest.fixture
def spans(request: pytest.FixtureRequest) -> Iterator[InMemorySpanExporter]:
    """Tracing on, into memory, before the apps are made; off again after. A test may give
    the sampler (indirect parameter)."""
    exporter = InMemorySpanExporter()
    sampler = getattr(request, "param", None)
    provider = TracerProvider() if sampler is None else TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.uninstall()
        provider.shutdown()


@pytest.fixture
async def system(
    spans: InMemorySpanExporter,
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: Any,
    topology: Topology,
) -> System:
    return await start_system(
        aiohttp_client, system_settings(make_settings, smtp[1]), amqp, topology
    )


def _effect_count(system: System, worker: str) -> float:
    client = system.clients[worker][0]
    assert client.app is not None
    value = client.app[REGISTRY].get_sample_value(
        "payhooks_payment_effect_latency_seconds_count", {"worker": worker}
    )
    return value or 0.0


async def test_one_payment_is_one_trace_across_every_service(
    system: System, spans: InMemorySpanExporter, db: Any
) -> None:
    payment_id = f"pay_traced_{uuid.uuid4().hex[:8]}"
    event_id = f"evt_{uuid.uuid4().hex}"
    await register(db, payment_id)
    body, headers = delivery(payment_event(payment_id, "paid"), SECRET, event_id=event_id)
    response = await system.ingest.post("/webhooks/xhub", data=body, headers=headers)
    assert response.status == 200, await response.text()
    await quiescent(db, system)
    assert (await effects(db, payment_id))["emails"] == ["payment_succeeded"]

    def by_name(name: str) -> list[ReadableSpan]:
        return [s for s in spans.get_finished_spans() if s.name == name]

    await eventually(
        lambda: _async(by_name("email message")), lambda found: len(found) >= 1, timeout_s=10
    )
    [request] = [
        s
        for s in spans.get_finished_spans()
        if s.kind is SpanKind.SERVER and (s.attributes or {}).get("payhooks.event_id") == event_id
    ]
    assert request.context is not None
    trace_id = request.context.trace_id
    assert (request.attributes or {}).get("payhooks.payment_id") == payment_id

    messages = {
        worker: [
            s
            for s in by_name(f"{worker} message")
            if (s.attributes or {}).get("payhooks.payment_id") == payment_id
        ]
        for worker in ("orders", "bonuses", "email")
    }
    for worker, found in messages.items():
        assert found, worker
        for span in found:
            assert span.context is not None
            assert span.context.trace_id == trace_id, worker
            assert (span.attributes or {}).get("payhooks.outcome") == "ok", worker
            # Linked to its batch's span, which links back to the message's context.
            [link] = span.links
            [batch] = [
                b
                for b in by_name(f"{worker} batch")
                if b.context is not None and b.context.span_id == link.context.span_id
            ]
            assert any(lk.context.trace_id == trace_id for lk in batch.links), worker
    # orders' span is the request's child; bonuses' and email's, orders' (through the outbox).
    [orders] = messages["orders"]
    assert orders.parent is not None
    assert orders.parent.span_id == request.context.span_id
    assert orders.context is not None
    for worker in ("bonuses", "email"):
        assert {s.parent.span_id for s in messages[worker] if s.parent} == {
            orders.context.span_id
        }, worker
    # The SMTP conversation has a span of its own, in the email batch's trace.
    email_batches = {link.context.trace_id for s in messages["email"] for link in s.links}
    assert any(
        s.context is not None and s.context.trace_id in email_batches for s in by_name("smtp send")
    )

    # Ids only: no email address, secret or signature anywhere in a span's attributes.
    secrets = [*TEST_SECRETS, *headers.values()]
    forbidden = [v for v in secrets if len(v) >= 16 and v != event_id]
    for span in spans.get_finished_spans():
        values = [str(v) for v in (span.attributes or {}).values()]
        values += [str(v) for e in span.events for v in (e.attributes or {}).values()]
        for value in values:
            assert not EMAIL.search(value), (span.name, value)
            assert not any(secret in value for secret in forbidden), span.name

    # The end-to-end latency: observed at each effect, tracing or not.
    for worker in ("orders", "bonuses", "email"):
        assert _effect_count(system, worker) >= 1, worker


@pytest.mark.parametrize("spans", [ParentBased(ALWAYS_OFF)], indirect=True)
async def test_a_payment_ingest_did_not_sample_leaves_no_span_in_any_worker(
    system: System, spans: InMemorySpanExporter, db: Any
) -> None:
    """The decision travels in `traceparent`: the workers make no span of their own for it
    (no batch span either: nothing in the batch is sampled), and the latency still counts."""
    payment_id = f"pay_unsampled_{uuid.uuid4().hex[:8]}"
    await register(db, payment_id)
    body, headers = delivery(payment_event(payment_id, "paid"), SECRET)
    response = await system.ingest.post("/webhooks/xhub", data=body, headers=headers)
    assert response.status == 200, await response.text()
    await quiescent(db, system)
    assert (await effects(db, payment_id))["emails"] == ["payment_succeeded"]
    names = {s.name for s in spans.get_finished_spans()}
    assert not {n for n in names if n.endswith((" message", " batch")) or n == "smtp send"}
    for worker in ("orders", "bonuses", "email"):
        assert _effect_count(system, worker) >= 1, worker


async def test_a_request_span_is_named_by_route_continues_the_caller_and_skips_probes(
    spans: InMemorySpanExporter, aiohttp_client: Any
) -> None:
    """The server-span middleware (shared/tracing.py): `METHOD route`, the caller's W3C
    context continued, method, route and status only (no path: it may carry a person's id),
    an error status for a 5xx; no span for /healthz, /readyz or /metrics."""

    async def found(request: web.Request) -> web.Response:
        return web.Response(text=request.match_info["user_id"])

    async def broken(_: web.Request) -> web.Response:
        raise web.HTTPServiceUnavailable()

    app = base_app(CollectorRegistry())
    app.router.add_get("/users/{user_id:[^/]+}", found)
    app.router.add_post("/broken", broken)
    client = await aiohttp_client(app)
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert (await client.get("/users/someone@example.com", headers={"traceparent": caller})).ok
    assert (await client.post("/broken")).status == 503
    for probe in ("/healthz", "/metrics"):
        assert (await client.get(probe)).status == 200
    user, failed = spans.get_finished_spans()
    assert user.name == "GET /users/{user_id}"
    assert user.kind is SpanKind.SERVER
    assert user.context is not None
    assert user.parent is not None
    assert user.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert user.parent.span_id == 0xB7AD6B7169203331
    assert dict(user.attributes or {}) == {
        "http.request.method": "GET",
        "http.route": "/users/{user_id}",
        "http.response.status_code": 200,
    }
    assert failed.name == "POST /broken"
    assert (failed.attributes or {})["http.response.status_code"] == 503
    assert failed.status.status_code is StatusCode.ERROR


async def _async(value: Any) -> Any:
    return value
