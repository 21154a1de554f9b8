"""bench.trace_view decodes what the SDK's own OTLP/HTTP exporter sends (no service needed: the
viewer on a loopback port) and prints one payment's trace as a tree: each span under its
parent, with its service's name, payhooks.* attributes and links by name."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, StatusCode

from bench.trace_view import Span, Store, app


def _provider(service: str) -> tuple[TracerProvider, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


async def test_a_real_otlp_export_becomes_one_payment_tree_with_service_names(
    aiohttp_server: Any, aiohttp_client: Any
) -> None:
    server = await aiohttp_server(app())
    ingest, ingest_spans = _provider("payhooks-ingest")
    orders, orders_spans = _provider("payhooks-orders")
    ids = {"payhooks.payment_id": "pay_1", "payhooks.event_id": "evt_1"}
    with ingest.get_tracer("t").start_as_current_span("POST /webhooks/xhub", attributes=ids):
        parent = trace.set_span_in_context(trace.get_current_span())
    other = {"payhooks.payment_id": "pay_2"}
    ingest.get_tracer("t").start_span("POST /webhooks/xhub", attributes=other).end()
    batch = orders.get_tracer("t").start_span("orders batch")
    batch.end()
    message = orders.get_tracer("t").start_span(
        "orders message",
        context=parent,
        links=[Link(batch.get_span_context())],
        attributes={**ids, "payhooks.outcome": "failed", "messaging.system": "rabbitmq"},
    )
    message.set_status(StatusCode.ERROR, "failed")
    message.end()

    # The exporter is synchronous (requests): off the loop that serves the viewer.
    for memory in (ingest_spans, orders_spans):
        exporter = OTLPSpanExporter(endpoint=str(server.make_url("/v1/traces")), timeout=5)
        result = await asyncio.to_thread(exporter.export, memory.get_finished_spans())
        assert result is SpanExportResult.SUCCESS
        exporter.shutdown()  # type: ignore[no-untyped-call]  # the SDK's, unannotated

    client = await aiohttp_client(server)
    response = await client.get("/traces", params={"payment_id": "pay_1"})
    assert response.status == 200
    lines = (await response.text()).splitlines()
    assert lines[0] == "payment pay_1: 1 trace(s)"
    assert re.fullmatch(r"trace [0-9a-f]{32}", lines[1])
    ms = r"\+\d+\.\d ms  \d+\.\d ms"
    assert re.fullmatch(
        rf"  POST /webhooks/xhub  \[payhooks-ingest\]  {ms}  payhooks.event_id=evt_1",
        lines[2],
    )
    assert re.fullmatch(
        rf"    orders message  \[payhooks-orders\]  {ms}  payhooks.event_id=evt_1  "
        r"payhooks.outcome=failed  link -> orders batch  ERROR failed",
        lines[3],
    )
    assert len(lines) == 4
    first = await client.get("/traces", params={"first": "2"})
    assert "payment pay_1: 1 trace(s)" in (text := await first.text())
    assert "payment pay_2: 1 trace(s)" in text
    assert (await client.get("/traces", params={"payment_id": "pay_x"})).status == 404
    assert (await client.post("/v1/traces", data=b"{}")).status == 415
    garbage = {"Content-Type": "application/x-protobuf"}
    assert (await client.post("/v1/traces", data=b"\xff\xff", headers=garbage)).status == 400
    assert (await client.get("/traces", params={"first": "x"})).status == 400


def test_the_store_keeps_the_last_spans_only() -> None:
    store = Store(max_spans=2)
    spans = [Span("t", f"s{i}", "", "n", "svc", i, i + 1, {}, (), None) for i in range(3)]
    store.add(spans)
    assert list(store.spans) == ["s1", "s2"]
