"""A local trace viewer for a machine without Jaeger: an OTLP/HTTP receiver that keeps the last
spans in memory and prints one payment's traces as indented trees (docs/observability.md,
"Viewing a trace in the demo"). It reads only the OTLP wire format, whatever spans arrive.

    python -m bench.trace_view serve [--port 4318] [--max-spans 50000]
    python -m bench.trace_view show PAYMENT_ID [--url http://127.0.0.1:4318]
    python -m bench.trace_view first [N] [--url ...]   # the first N payments received
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

PAYMENT_KEY = "payhooks.payment_id"
ERROR = 2  # Status.STATUS_CODE_ERROR
PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class Span:
    """One received span, ids as hex; `parent_id` is "" for a root."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    service: str
    start_ns: int
    end_ns: int
    attributes: dict[str, str]
    links: tuple[str, ...]  # the linked spans' ids
    error: str | None


def _text(value: AnyValue) -> str:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return "[" + ", ".join(_text(v) for v in value.array_value.values) + "]"
    return "" if kind is None else str(getattr(value, kind))


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, str]:
    return {kv.key: _text(kv.value) for kv in pairs}


def decode(body: bytes) -> list[Span]:
    """The spans of one `ExportTraceServiceRequest`, each with its resource's service.name;
    ValueError if `body` is not one."""
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except Exception as e:  # protobuf's DecodeError, whose module ships no types
        raise ValueError(f"not an ExportTraceServiceRequest: {e}") from e
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = resource.get("service.name", "?")
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                failed = s.status.code == ERROR
                spans.append(
                    Span(
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        name=s.name,
                        service=service,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes=_attributes(s.attributes),
                        links=tuple(link.span_id.hex() for link in s.links),
                        error=(s.status.message or "error") if failed else None,
                    )
                )
    return spans


class Store:
    """The last `max_spans` spans by span id, oldest dropped first."""

    def __init__(self, max_spans: int) -> None:
        self.max_spans = max_spans
        self.spans: dict[str, Span] = {}

    def add(self, spans: Iterable[Span]) -> None:
        for span in spans:
            self.spans.pop(span.span_id, None)
            self.spans[span.span_id] = span
            while len(self.spans) > self.max_spans:
                del self.spans[next(iter(self.spans))]

    def payments(self) -> list[str]:
        """Payment ids in the order their first span arrived."""
        seen = (s.attributes.get(PAYMENT_KEY) for s in self.spans.values())
        return list(dict.fromkeys(p for p in seen if p))

    def traces(self, payment_id: str) -> list[list[Span]]:
        """Every trace holding a span of the payment (one per webhook), earliest first."""
        ids = {
            s.trace_id for s in self.spans.values() if s.attributes.get(PAYMENT_KEY) == payment_id
        }
        found: dict[str, list[Span]] = {trace_id: [] for trace_id in ids}
        for span in self.spans.values():
            if span.trace_id in found:
                found[span.trace_id].append(span)
        return sorted(found.values(), key=lambda spans: min(s.start_ns for s in spans))

    def tree(self, spans: list[Span], payment_id: str = "") -> Iterator[str]:
        """One line per span, indented under its parent: name, service, start offset from the
        trace's first span and duration in ms, payhooks.* attributes (but `payment_id`, which
        the heading names), links by name."""
        ids = {s.span_id for s in spans}
        children: dict[str, list[Span]] = {}
        for span in sorted(spans, key=lambda s: s.start_ns):
            parent = span.parent_id if span.parent_id in ids else ""
            children.setdefault(parent, []).append(span)
        t0 = min(s.start_ns for s in spans)
        yield f"trace {spans[0].trace_id}"

        def lines(parent: str, depth: int) -> Iterator[str]:
            for span in children.get(parent, []):
                orphan = bool(span.parent_id) and span.parent_id not in ids
                yield "  " * depth + self._line(span, t0, orphan, payment_id)
                yield from lines(span.span_id, depth + 1)

        yield from lines("", 1)

    def _line(self, span: Span, t0: int, orphan: bool, payment_id: str) -> str:
        parts = [
            f"{span.name}  [{span.service}]",
            f"+{(span.start_ns - t0) / 1e6:.1f} ms",
            f"{(span.end_ns - span.start_ns) / 1e6:.1f} ms",
        ]
        parts += [
            f"{k}={v}"
            for k, v in sorted(span.attributes.items())
            if k.startswith("payhooks.") and (k, v) != (PAYMENT_KEY, payment_id)
        ]
        for link in span.links:
            linked = self.spans.get(link)
            parts.append(f"link -> {linked.name if linked else link + ' (not received)'}")
        if span.error is not None:
            parts.append(f"ERROR {span.error}")
        if orphan:
            parts.append("(its parent span was not received)")
        return "  ".join(parts)

    def report(self, payment_ids: Iterable[str]) -> str:
        out = []
        for payment_id in payment_ids:
            traces = self.traces(payment_id)
            out.append(f"payment {payment_id}: {len(traces)} trace(s)")
            for spans in traces:
                out.extend(self.tree(spans, payment_id))
            out.append("")
        return "\n".join(out)


def app(max_spans: int = 50_000) -> web.Application:
    """POST /v1/traces stores; GET /traces?payment_id=ID (or ?first=N) answers trees as text."""
    store = Store(max_spans)

    async def export(request: web.Request) -> web.Response:
        if request.content_type != PROTOBUF:
            raise web.HTTPUnsupportedMediaType(text=f"OTLP/HTTP protobuf only ({PROTOBUF})")
        try:
            store.add(decode(await request.read()))
        except ValueError as e:
            raise web.HTTPBadRequest(text=f"{e}\n") from e
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type=PROTOBUF)

    async def traces(request: web.Request) -> web.Response:
        if payment_id := request.query.get("payment_id"):
            chosen = [payment_id]
        else:
            first = request.query.get("first", "1")
            if not first.isdigit():
                raise web.HTTPBadRequest(text="first: a number of payments\n")
            chosen = store.payments()[: int(first)]
        if not chosen or not store.traces(chosen[0]):
            return web.Response(text=f"no span of payment {chosen or '(none yet)'}\n", status=404)
        return web.Response(text=store.report(chosen))

    application = web.Application(client_max_size=64 * 1024**2)
    application.router.add_post("/v1/traces", export)
    application.router.add_get("/traces", traces)
    return application


def ask(url: str, query: dict[str, str]) -> int:
    """Print a running viewer's answer; 0 if it found the payment."""
    address = f"{url.rstrip('/')}/traces?{urllib.parse.urlencode(query)}"
    try:
        with urllib.request.urlopen(address, timeout=10) as response:
            sys.stdout.write(response.read().decode())
            return 0
    except urllib.error.HTTPError as e:
        sys.stdout.write(e.read().decode())
        return 1
    except urllib.error.URLError as e:
        print(
            f"no trace viewer at {url} ({e.reason}): python -m bench.trace_view serve",
            file=sys.stderr,
        )
        return 1


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.trace_view",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    viewer = argparse.ArgumentParser(add_help=False)
    viewer.add_argument("--url", default="http://127.0.0.1:4318", help="the running viewer")
    commands = p.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="receive OTLP/HTTP on 127.0.0.1:PORT")
    serve.add_argument("--port", type=int, default=4318)
    serve.add_argument("--max-spans", type=int, default=50_000)
    show = commands.add_parser("show", parents=[viewer], help="one payment's traces")
    show.add_argument("payment_id")
    first = commands.add_parser("first", parents=[viewer], help="the first N payments' traces")
    first.add_argument("n", type=int, nargs="?", default=1)
    args = p.parse_args()
    if args.command == "serve":
        web.run_app(app(args.max_spans), host="127.0.0.1", port=args.port, print=None)
    elif args.command == "show":
        sys.exit(ask(args.url, {"payment_id": args.payment_id}))
    else:
        sys.exit(ask(args.url, {"first": str(args.n)}))


if __name__ == "__main__":
    main()
