"""The naive benchmark baseline (bench/naive_ingest.py) is ingest's own app but for its accept
path: the two are built here (nothing runs) and compared piece by piece."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bench import naive_ingest
from services.ingest import app as ingest
from services.ingest.endpoint import METRICS, SETTINGS
from shared.config import Settings
from shared.process.http_limits import HTTP_LIMITS


def _name(thing: Any) -> str:
    return f"{thing.__module__}.{thing.__qualname__}"


def describe(app: web.Application) -> dict[str, Any]:
    """What a request meets, except the accept path (the last cleanup context)."""
    return {
        "routes": sorted((r.method, r.get_info().get("path", "")) for r in app.router.routes()),
        "handlers": sorted(_name(r.handler) for r in app.router.routes()),
        "client_max_size": app._client_max_size,
        "handler_args": app._handler_args,
        "middlewares": [_name(m) for m in app.middlewares],
        "http_limits": app[HTTP_LIMITS],
        "metrics": sorted(app[METRICS].registry._names_to_collectors),
        "settings": app[SETTINGS],
        "resources": [_name(ctx) for ctx in list(app.cleanup_ctx)[:-1]],
    }


def test_the_naive_baseline_is_ingest_but_for_its_accept_path() -> None:
    settings = Settings.from_env({"XHUB_WEBHOOK_SECRETS": "new,old"})
    service, baseline = ingest.create_app(settings), naive_ingest.create_app(settings)

    assert describe(baseline) == describe(service)
    # Things that drifted once, named: bodies read as sent, a metric per secret.
    assert describe(baseline)["handler_args"] == {"auto_decompress": False}
    assert "payhooks_webhook_secret_matched_total" in describe(baseline)["metrics"]
    # The one difference: the accept path behind the endpoint.
    accept_paths = [list(app.cleanup_ctx)[-1].__module__ for app in (service, baseline)]
    assert accept_paths == ["services.ingest.app", "bench.naive_ingest"]
