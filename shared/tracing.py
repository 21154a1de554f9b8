"""OpenTelemetry traces of one payment, from the webhook's arrival to the email's acceptance by
the SMTP server (docs/observability.md). Off unless OTEL_EXPORTER_OTLP_ENDPOINT (or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set: then nothing from opentelemetry is imported and
every helper here costs one check of a module global.

The context travels as W3C trace context in AMQP message headers (`traceparent`), and through
the orders outbox in the row's headers. Workers consume in batches, so a batch gets a span of
its own (linked to every message's context) and each message a span that continues its
payment's trace (linked to the batch's); the next message published for it (the outbox's
`order.*`) carries that message span's context.

Attributes carry ids only (event, payment, queue, outcome): never a body, an email address, a
secret or a signature (tests/integration/test_traces.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import Sampler
    from opentelemetry.trace import Span, Tracer

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# When ingest received the webhook (Unix seconds, as text), carried by every message that
# follows from it, traced or not: the end-to-end latency histogram reads it.
RECEIVED_AT = "received-at"
# The headers a message passes on to the messages that follow from it (the outbox's).
CARRIED = (TRACEPARENT, TRACESTATE, RECEIVED_AT)

# The share of payments traced unless OTEL_TRACES_SAMPLER says otherwise (sampler()).
DEFAULT_RATIO = 0.01
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# Probes and scrapes are no part of a payment's story.
_UNTRACED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

_tracer: Tracer | None = None
_middleware: Any = None
_propagator: Any = None


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment turns tracing on: an OTLP endpoint, and the SDK not disabled."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(name) for name in _ENDPOINTS)


def enabled() -> bool:
    return _tracer is not None


def configure(service: str) -> bool:
    """At a service's start: tracing on if the environment wants it, spans exported over
    OTLP/HTTP in batches, sampled as sampler() says. The SDK reads the other OTEL_* variables
    itself (OTEL_SERVICE_NAME, which wins over `service`, OTEL_EXPORTER_OTLP_HEADERS, ...)."""
    if _tracer is not None or not wanted():
        return _tracer is not None
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service}
    provider = TracerProvider(resource=Resource.create(attributes), sampler=sampler())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    install(provider)
    return True


def sampler(env: Mapping[str, str] = os.environ) -> Sampler | None:
    """One payment in a hundred (DEFAULT_RATIO, decided at ingest and followed by the
    workers) unless OTEL_TRACES_SAMPLER chooses (None: the SDK reads it). Not the SDK's
    default of every payment, which costs about 30 % of the throughput, nor one in ten,
    about 10 %: one in a hundred stays within 10 % (docs/observability.md, "What it costs")."""
    if env.get("OTEL_TRACES_SAMPLER"):
        return None
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    return ParentBased(TraceIdRatioBased(DEFAULT_RATIO))


def install(provider: TracerProvider) -> None:
    """Trace with `provider` (configure's, or a test's with an in-memory exporter): our spans
    and our apps' server requests (middlewares()). Before the apps are made."""
    global _tracer, _middleware, _propagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _propagator = TraceContextTextMapPropagator()  # W3C trace context only: no baggage
    _tracer = provider.get_tracer("payhooks")
    _middleware = _server_spans(_tracer)


def _server_spans(tracer_: Tracer) -> Any:
    """The aiohttp middleware that gives each request a SERVER span, `POST
    /webhooks/{provider}` (method and route), continuing the caller's W3C context. Ours rather
    than opentelemetry-instrumentation-aiohttp-server's: that one costs ~50 µs on every
    request, sampled or not (semantic-convention attributes, URL filters, HTTP metrics),
    which was most of tracing's cost at a sampled rate (docs/observability.md). This one
    records the route (never the path or query, which may carry ids of people), the method
    and the status, and only on a sampled span."""
    from aiohttp import web
    from opentelemetry import context, trace
    from opentelemetry.trace import SpanKind, StatusCode

    @web.middleware
    async def server_span(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path in _UNTRACED_PATHS:
            return await handler(request)  # type: ignore[no-any-return]
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        span = tracer_.start_span(
            f"{request.method} {route}",
            context=_propagator.extract(request.headers),
            kind=SpanKind.SERVER,
        )
        status = 500
        token = context.attach(trace.set_span_in_context(span))
        try:
            response: web.StreamResponse = await handler(request)
            status = response.status
            return response
        except web.HTTPException as e:
            status = e.status
            raise
        finally:
            context.detach(token)
            if span.is_recording():
                span.set_attributes(
                    {
                        "http.request.method": request.method,
                        "http.route": route,
                        "http.response.status_code": status,
                    }
                )
                if status >= 500:
                    span.set_status(StatusCode.ERROR)
            span.end()

    return server_span


def middlewares() -> list[Any]:
    """The server-span middleware while tracing is on, else none."""
    return [] if _middleware is None else [_middleware]


def uninstall() -> None:
    """Tracing off again (tests)."""
    global _tracer, _middleware
    _tracer = _middleware = None


def tracer() -> Tracer:
    assert _tracer is not None, "tracing is off"
    return _tracer


def inject(headers: MutableMapping[str, str], span: Span | None = None) -> None:
    """Put `span`'s context (or the current one) in `headers` as W3C trace context. Only
    while tracing is on."""
    from opentelemetry import trace

    context = trace.set_span_in_context(span) if span is not None else None
    _propagator.inject(headers, context=context)


def current_headers() -> dict[str, str]:
    """The current span's context as message headers; {} while tracing is off."""
    if _tracer is None:
        return {}
    headers: dict[str, str] = {}
    inject(headers)
    return headers


def annotate(**attributes: str | None) -> None:
    """Set ids on the current span (ingest's request span): only while tracing is on."""
    if _tracer is None:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    if not span.is_recording():
        return
    for key, value in attributes.items():
        if value:
            span.set_attribute(f"payhooks.{key}", value)


def carried(headers: Mapping[str, Any]) -> dict[str, str]:
    """What a message passes on to the messages that follow from it (CARRIED), as text."""
    out: dict[str, str] = {}
    for name in CARRIED:
        value = headers.get(name)
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        if isinstance(value, str) and value:
            out[name] = value
    return out


def received_at(headers: Mapping[str, Any]) -> float | None:
    """The RECEIVED_AT header as Unix seconds; None without one (or a bad one)."""
    value = headers.get(RECEIVED_AT)
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    try:
        return float(value) if isinstance(value, str | int | float) else None
    except ValueError:
        return None


def worth_tracing(headers: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a batch gets spans: tracing is on, and a message of it is sampled (its
    `traceparent` flags) or starts a trace here (none: the sampler decides). Messages whose
    traces ingest's sampler left out cost nothing more: their headers pass on as they came,
    and so does the decision."""
    return _tracer is not None and not all(_left_out(h) for h in headers)


def _left_out(headers: Mapping[str, Any]) -> bool:
    """Whether the message carries a trace context whose sampled flag is off."""
    value = headers.get(TRACEPARENT)
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str) or len(value) < 55:
        return False  # none (or not one we read): a new trace, as the sampler decides
    try:
        return not int(value[53:55], 16) & 1
    except ValueError:
        return False


class BatchTrace:
    """The spans of one worker batch (only while tracing is on): `<worker> batch`, current
    while the batch is handled (its duration is the batch's transaction and publishes; a
    step span such as `smtp send` nests under it) and linked to every message's context;
    and `<worker> message` per message, a child of the context the message carries, linked
    to the batch span. `headers(i)` is message i's headers with the
    message span's context in place of the received one, for what the handler publishes
    from it."""

    def __init__(
        self,
        worker: str,
        queue: str,
        headers: Sequence[Mapping[str, Any]],
        ids: Callable[[int], tuple[str, str | None]],
    ) -> None:
        """`ids(i)`: message i's event id and payment id (read only for a traced message)."""
        from opentelemetry import trace
        from opentelemetry.trace import Link, SpanKind

        tracer_ = tracer()
        # A message whose trace ingest's sampler left out passes on as it came: no span.
        parents = [None if _left_out(h) else _propagator.extract(carried(h)) for h in headers]
        links = [
            Link(context)
            for parent in parents
            if parent is not None
            and (context := trace.get_current_span(parent).get_span_context()).is_valid
        ]
        self.batch = tracer_.start_span(
            f"{worker} batch",
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": "rabbitmq",
                "messaging.destination.name": queue,
                "messaging.batch.message_count": len(headers),
            },
        )
        self._finished = False
        batch_link = [Link(self.batch.get_span_context())]
        self.messages: list[Span | None] = []
        self._headers: list[Mapping[str, Any]] = []
        for i, (parent, h) in enumerate(zip(parents, headers, strict=True)):
            if parent is None:
                self.messages.append(None)
                self._headers.append(h)
                continue
            event_id, payment_id = ids(i)
            attributes = {
                "messaging.message.id": event_id,
                "payhooks.event_id": event_id,
            }
            if payment_id:
                attributes["payhooks.payment_id"] = payment_id
            span = tracer_.start_span(
                f"{worker} message",
                context=parent,
                kind=SpanKind.CONSUMER,
                links=batch_link,
                attributes=attributes,
            )
            self.messages.append(span)
            own = {k: v for k, v in h.items() if k not in (TRACEPARENT, TRACESTATE)}
            passed_on: dict[str, str] = {}
            inject(passed_on, span)
            self._headers.append({**own, **passed_on})

    def headers(self, i: int) -> Mapping[str, Any]:
        return self._headers[i]

    def use(self) -> Any:
        """The batch span as the current one (a context manager)."""
        from opentelemetry import trace

        return trace.use_span(self.batch, end_on_exit=False)

    def finish(self, outcomes: Sequence[str]) -> None:
        """End the spans, each message's with its outcome (once: later calls do nothing)."""
        from opentelemetry.trace import StatusCode

        if self._finished:
            return
        self._finished = True

        for span, outcome in zip(self.messages, outcomes, strict=True):
            if span is None:
                continue
            span.set_attribute("payhooks.outcome", outcome)
            if outcome not in ("ok", "skipped_duplicate", "parked"):
                span.set_status(StatusCode.ERROR, outcome)
            span.end()
        self.batch.end()


class StepSpan:
    """A span of our own around a step (the email worker's SMTP run), child of the current
    one; a no-op context manager while tracing is off."""

    __slots__ = ("_attributes", "_cm", "_name")

    def __init__(self, name: str, **attributes: str | int) -> None:
        self._name, self._attributes = name, attributes
        self._cm: Any = None

    def __enter__(self) -> None:
        if _tracer is not None:
            self._cm = _tracer.start_as_current_span(self._name, attributes=self._attributes)
            self._cm.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._cm is not None:
            self._cm.__exit__(*exc)
            self._cm = None
