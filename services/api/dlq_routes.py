"""DLQ routes: list the DLQs, show one, requeue from one (SPEC section 7); and a look at
`unrouted`, the events no worker consumes (count and show only)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from services.api.dlq_access import DLQ_ACCESS
from services.api.responses import json_error, json_response
from shared import dlq, unrouted
from shared.dlq_moves import Selection, UnroutableError, requeue
from shared.http_limits import read_body

_MAX_PAGE = 1000


def _queue(request: web.Request) -> str | None:
    name = request.match_info["queue"]
    if name not in dlq.QUEUES:
        return None
    return dlq.dlq_name(request.app[DLQ_ACCESS].topology, name)


async def list_dlqs(request: web.Request) -> web.Response:
    access = request.app[DLQ_ACCESS]
    async with access.channel() as channel:
        stats = await dlq.stats(channel, access.topology)
    return json_response({"queues": [s.as_json() for s in stats]})


async def show_dlq(request: web.Request) -> web.Response:
    queue = _queue(request)
    if queue is None:
        return json_error(404, f"no such DLQ; one of {', '.join(dlq.QUEUES)}")
    try:
        limit = int(request.query.get("limit", "100"))
        offset = int(request.query.get("offset", "0"))
    except ValueError:
        return json_error(400, "limit and offset must be whole numbers")
    if not (1 <= limit <= _MAX_PAGE and offset >= 0):
        return json_error(400, f"limit must be 1-{_MAX_PAGE}, offset >= 0")
    async with request.app[DLQ_ACCESS].channel() as channel:
        letters = await dlq.show(channel, queue)
    page = letters[offset : offset + limit]
    return json_response(
        {
            "queue": queue,
            "total": len(letters),
            "offset": offset,
            "limit": limit,
            "messages": [letter.as_json() for letter in page],
        }
    )


class _BadRequest(ValueError):
    pass


def _optional_text(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise _BadRequest(f"{key} must be a string")
    return value


async def requeue_dlq(request: web.Request) -> web.Response:
    queue = _queue(request)
    if queue is None:
        return json_error(404, f"no such DLQ; one of {', '.join(dlq.QUEUES)}")
    try:
        data = orjson.loads(await read_body(request))
        if not isinstance(data, dict):
            raise _BadRequest("body must be a JSON object")
        ids = data.get("ids", [])
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise _BadRequest("ids must be a list of strings")
        everything = data.get("all", False)
        dry_run = data.get("dry_run", False)
        if not isinstance(everything, bool) or not isinstance(dry_run, bool):
            raise _BadRequest("all and dry_run must be true or false")
        limit = data.get("limit")
        # bool is an int in Python: `"limit": true` must not mean 1.
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise _BadRequest("limit must be a positive whole number")
        selection = Selection.parse(
            ids=ids,
            everything=everything,
            reason=_optional_text(data, "reason"),
            event_type=_optional_text(data, "event_type"),
            payment_id=_optional_text(data, "payment_id"),
            since=_optional_text(data, "since"),
            until=_optional_text(data, "until"),
        )
        if selection.says_nothing:
            raise _BadRequest('say what to requeue: "ids", "all": true, or a filter')
    except orjson.JSONDecodeError:
        return json_error(400, "body is not valid JSON")
    except ValueError as e:  # _BadRequest, a time that is not one
        return json_error(400, str(e))
    try:
        async with request.app[DLQ_ACCESS].channel() as channel:
            result = await requeue(channel, queue, selection, limit=limit, dry_run=dry_run)
    except UnroutableError as e:
        # What was moved before it stays moved; the rest is still in the DLQ.
        return json_error(409, str(e))
    return json_response(
        {
            "requeued": 0 if result.dry_run else len(result.requeued),
            "would_requeue": len(result.requeued) if result.dry_run else None,
            "dry_run": result.dry_run,
            "ids": [letter.id for letter in result.requeued],
            "not_found": result.not_found,
        }
    )


async def show_unrouted(request: web.Request) -> web.Response:
    """`GET /api/unrouted?limit=N`: its depth, the age of its oldest message, a count per
    event type, and its first N messages (default 100)."""
    try:
        limit = int(request.query.get("limit", "100"))
    except ValueError:
        return json_error(400, "limit must be a whole number")
    if not 1 <= limit <= unrouted.MAX_SHOWN:
        return json_error(400, f"limit must be 1-{unrouted.MAX_SHOWN}")
    access = request.app[DLQ_ACCESS]
    async with access.channel() as channel:
        seen = await unrouted.view(channel, access.topology.unrouted, limit=limit)
    return json_response(seen.as_json())
