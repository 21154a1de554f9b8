"""`GET /api/audit?limit=&cursor=`: the operator actions, newest first (operator scope)."""

from __future__ import annotations

from aiohttp import web

from services.api.responses import json_response, problem
from shared.db import DB_POOL
from shared.queries import audit


async def list_actions(request: web.Request) -> web.Response:
    query = request.query
    text = query.get("limit", str(audit.DEFAULT_LIMIT))
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= audit.MAX_LIMIT):
        return problem(400, "invalid_request", f"limit must be 1-{audit.MAX_LIMIT}")
    limit = int(text)
    try:
        before = audit.parse_cursor(query["cursor"]) if "cursor" in query else None
    except ValueError as e:
        return problem(400, "invalid_request", str(e))
    actions = await audit.page(request.app[DB_POOL], limit, before)
    return json_response({"actions": actions, "next_cursor": audit.next_cursor(actions, limit)})
