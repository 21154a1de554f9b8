"""DLQ routes: list the DLQs, show one, requeue from one (SPEC section 7); and a look at
`unrouted`, the events no worker consumes (count and show only)."""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from services.api.auth import actor
from services.api.dlq_access import DLQ_ACCESS
from services.api.responses import json_response, problem
from shared.db import DB_POOL
from shared.ops import dlq, unrouted
from shared.ops.dlq_moves import FILTERS, Selection, UnroutableError
from shared.ops.operator_actions import Edge, Operator, requeue_recorded
from shared.process.http_limits import read_body

MAX_PAGE = 1000
# Far beyond any DLQ (a look reads at most 65,535 messages); unbounded, a huge offset went
# back in the answer and overflowed orjson's 64-bit integers (a 500).
MAX_OFFSET = 2**31 - 1
_WHOLE_NUMBER = re.compile(r"[0-9]+")


class _BadRequest(ValueError):
    pass


def _queue(request: web.Request) -> str | None:
    name = request.match_info["queue"]
    if name not in dlq.QUEUES:
        return None
    return dlq.dlq_name(request.app[DLQ_ACCESS].topology, name)


def _whole_number(text: str) -> int:
    """ASCII digits only: int() would also take " 5", "1_0" and other scripts' digits."""
    if not _WHOLE_NUMBER.fullmatch(text):
        raise ValueError(text)
    return int(text)


def _cursor(position: int, last_id: str) -> str:
    """Opaque to clients: where the next page starts and the id of the message before it."""
    return base64.urlsafe_b64encode(orjson.dumps([position, last_id])).decode().rstrip("=")


def _parse_cursor(text: str) -> tuple[int, str]:
    try:
        position, last_id = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, TypeError):  # not base64, not JSON, not a pair
        raise _BadRequest("cursor is not one this api gave") from None
    if (
        isinstance(position, bool)
        or not isinstance(position, int)
        or not 1 <= position <= MAX_OFFSET
        or not isinstance(last_id, str)
    ):
        raise _BadRequest("cursor is not one this api gave")
    return position, last_id


def _resume(letters: Sequence[dlq.DeadLetter], position: int, last_id: str) -> int:
    """Where a cursor's page starts in the DLQ as it is now."""
    if position <= len(letters) and letters[position - 1].id == last_id:
        return position  # nothing before it changed
    # It moved (messages before it left): after its copy nearest to where it was, since a
    # crash during a requeue can leave two messages with one id.
    found = [i for i, letter in enumerate(letters) if letter.id == last_id]
    if found:
        return min(found, key=lambda i: abs(i - (position - 1))) + 1
    # It left the DLQ (requeued, purged): from the head again, repeating rather than skipping
    # messages (a client requeueing each page it reads wants exactly that).
    return 0


async def list_dlqs(request: web.Request) -> web.Response:
    access = request.app[DLQ_ACCESS]
    async with access.channel() as channel:
        stats = await dlq.stats(channel, access.topology)
    return json_response({"queues": [s.as_json() for s in stats]})


async def show_dlq(request: web.Request) -> web.Response:
    """`GET /api/dlq/{queue}?limit=N&cursor=C[&provider=P]`: a page of its messages (only
    those from P's webhooks, with `provider`; `total` counts those) and the cursor of the next
    one; `offset=N` instead of `cursor` is deprecated."""
    queue = _queue(request)
    if queue is None:
        return problem(404, "not_found", f"no such DLQ; one of {', '.join(dlq.QUEUES)}")
    query = request.query
    try:
        limit = _whole_number(query.get("limit", "100"))
        offset = _whole_number(query.get("offset", "0"))
    except ValueError:
        return problem(400, "invalid_request", "limit and offset must be whole numbers")
    if not 1 <= limit <= MAX_PAGE:
        return problem(400, "invalid_request", f"limit must be 1-{MAX_PAGE}, offset >= 0")
    if offset > MAX_OFFSET:
        return problem(400, "invalid_request", f"offset must be at most {MAX_OFFSET}")
    cursor = None
    if "cursor" in query:
        if "offset" in query:
            return problem(400, "invalid_request", "give cursor or offset, not both")
        try:
            cursor = _parse_cursor(query["cursor"])
        except _BadRequest as e:
            return problem(400, "invalid_request", str(e))
    async with request.app[DLQ_ACCESS].channel() as channel:
        letters = await dlq.show(channel, queue)
    if provider := query.get("provider"):  # whose webhooks (the cursor resumes within them)
        letters = [letter for letter in letters if letter.provider == provider]
    start = offset if cursor is None else _resume(letters, *cursor)
    page = letters[start : start + limit]
    more = start + len(page) < len(letters)
    return json_response(
        {
            "queue": queue,
            "total": len(letters),
            "offset": start,
            "limit": limit,
            "messages": [letter.as_json() for letter in page],
            "next_cursor": _cursor(start + len(page), page[-1].id) if more and page else None,
        }
    )


def _optional_text(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise _BadRequest(f"{key} must be a string")
    return value


async def requeue_dlq(request: web.Request) -> web.Response:
    queue = _queue(request)
    if queue is None:
        return problem(404, "not_found", f"no such DLQ; one of {', '.join(dlq.QUEUES)}")
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
        filters = {f: _optional_text(data, f) for f in FILTERS}
        selection = Selection.parse(ids=ids, everything=everything, **filters)
        if selection.says_nothing:
            raise _BadRequest('say what to requeue: "ids", "all": true, or a filter')
    except orjson.JSONDecodeError:
        return problem(400, "invalid_request", "body is not valid JSON")
    except ValueError as e:  # _BadRequest, a time that is not one
        return problem(400, "invalid_request", str(e))
    by = Operator(actor(request).name, Edge.API)
    try:
        async with request.app[DLQ_ACCESS].channel() as channel:
            answer, _ = await requeue_recorded(
                channel, queue, selection, by, request.app[DB_POOL], limit=limit, dry_run=dry_run
            )
    except UnroutableError as e:
        # What was moved before it stays moved; the rest is still in the DLQ.
        return problem(409, "requeue_unroutable", str(e))
    return json_response(answer.as_json())


async def show_unrouted(request: web.Request) -> web.Response:
    """`GET /api/unrouted?limit=N`: its depth, the age of its oldest message, a count per
    event type, and its first N messages (default 100)."""
    try:
        limit = _whole_number(request.query.get("limit", "100"))
    except ValueError:
        return problem(400, "invalid_request", "limit must be a whole number")
    if not 1 <= limit <= unrouted.MAX_SHOWN:
        return problem(400, "invalid_request", f"limit must be 1-{unrouted.MAX_SHOWN}")
    access = request.app[DLQ_ACCESS]
    async with access.channel() as channel:
        seen = await unrouted.view(channel, access.topology.unrouted, limit=limit)
    return json_response(seen.as_json())
