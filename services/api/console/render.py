"""The console's HTML: jinja2 templates (autoescaped, an unknown name an error rather than an
empty string) filled with what every page shows (the operator, the CSRF field)."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import quote

import jinja2
from aiohttp import web

from services.api.console.sessions import CSRF, PREFIX, SIGNED_IN

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("services.api.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _age(seconds: float | None) -> str:
    """1 h 5 min, 3 min 20 s, 12 s; a dash for none."""
    if seconds is None:
        return "—"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def _when(value: str | dt.datetime | None) -> str:
    """An ISO 8601 time as UTC to the second, e.g. 2026-12-03 08:15:02Z."""
    if value is None:
        return "—"
    at = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    if at.tzinfo is not None:
        at = at.astimezone(dt.UTC)
    return at.strftime("%Y-%m-%d %H:%M:%SZ")


def _path(value: str) -> str:
    """An id as one path segment (a "/" in it too)."""
    return quote(value, safe="")


_ENV.filters.update(age=_age, when=_when, path=_path)


def render(
    request: web.Request, template: str, *, status: int = 200, **context: Any
) -> web.Response:
    page = _ENV.get_template(template).render(
        prefix=PREFIX,
        path=request.path,
        signed_in=request.get(SIGNED_IN),
        csrf=request[CSRF],
        **context,
    )
    return web.Response(text=page, status=status, content_type="text/html", charset="utf-8")
