"""`POST /api/replay`: stored inbox events sent again to chosen workers, or counted with
`"dry_run": true` (shared/ops/replay.py, through operator_actions.replay_recorded)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from services.api.auth import actor
from services.api.dlq_access import DLQ_ACCESS
from services.api.responses import json_response, problem
from shared.db import DB_POOL
from shared.errors import UnavailableError
from shared.ops.operator_actions import Edge, Operator, replay_recorded
from shared.ops.replay import ReplayPublishError, ReplayTooLargeError
from shared.ops.replay_selection import ReplayInputError, ReplayRequest
from shared.process.http_limits import read_body

TEXTS = ("event_type", "since", "until", "payment_id", "provider", "outcome", "reason")
LISTS = ("event_ids", "workers")
FLAGS = ("reprocess", "dry_run")
FIELDS = frozenset((*TEXTS, *LISTS, *FLAGS, "limit"))


def parse_body(data: Any) -> tuple[ReplayRequest, bool]:
    """The request and whether it is a dry run; ReplayInputError names the bad field."""
    if not isinstance(data, dict):
        raise ReplayInputError("body", "must be a JSON object")
    if unknown := sorted(set(data) - FIELDS):
        raise ReplayInputError(unknown[0], "is not a field of a replay")
    for name in TEXTS:
        if data.get(name) is not None and not isinstance(data[name], str):
            raise ReplayInputError(name, "must be a string")
    for name in LISTS:
        value = data.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ReplayInputError(name, "must be a list of strings")
    for name in FLAGS:
        if not isinstance(data.get(name, False), bool):
            raise ReplayInputError(name, "must be true or false")
    limit = data.get("limit")
    # bool is an int in Python: `"limit": true` must not mean 1.
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise ReplayInputError("limit", "must be a whole number")
    request = ReplayRequest.parse(
        **{name: data.get(name) for name in TEXTS},
        event_ids=data.get("event_ids", []),
        workers=data.get("workers", []),
        reprocess=data.get("reprocess", False),
        limit=limit,
    )
    return request, bool(data.get("dry_run", False))


async def replay(request: web.Request) -> web.Response:
    try:
        asked, dry_run = parse_body(orjson.loads(await read_body(request)))
    except orjson.JSONDecodeError:
        return problem(400, "invalid_request", "body is not valid JSON")
    except ReplayInputError as e:
        return problem(400, "invalid_request", str(e), field=e.name)
    access = request.app[DLQ_ACCESS]
    by = Operator(actor(request).name, Edge.API)
    pool = request.app[DB_POOL]
    try:
        done = await replay_recorded(
            pool, access.channel, access.topology, asked, by, pool, dry_run=dry_run
        )
    except ReplayTooLargeError as e:
        return problem(422, "replay_too_large", str(e))
    except ReplayPublishError as e:
        if e.unroutable:
            return problem(409, "replay_unroutable", str(e), published=e.published)
        raise UnavailableError(str(e)) from e
    return json_response(done.as_json())
