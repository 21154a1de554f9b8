"""An OTLP/HTTP sink that accepts every export and keeps nothing: where bench.workers' traced
runs send their spans (docs/observability.md, "What it costs").

    python -m bench.otlp_sink [--port 4318]
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python -m bench.workers --n 4000
"""

from __future__ import annotations

import argparse

from aiohttp import web


def app() -> web.Application:
    """POST /v1/traces accepts; GET /stats says how many exports and bytes came."""
    received = {"exports": 0, "bytes": 0}

    async def export(request: web.Request) -> web.Response:
        received["exports"] += 1
        received["bytes"] += len(await request.read())
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(received)

    application = web.Application(client_max_size=64 * 1024**2)
    application.router.add_post("/v1/traces", export)
    application.router.add_get("/stats", stats)
    return application


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.otlp_sink", description=__doc__)
    p.add_argument("--port", type=int, default=4318)
    web.run_app(app(), host="127.0.0.1", port=p.parse_args().port, print=None)


if __name__ == "__main__":
    main()
