"""JSON answers of the api: a body, or an error with its message."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def json_error(status: int, message: str, **extra: Any) -> web.Response:
    return json_response({"error": message, **extra}, status=status)
