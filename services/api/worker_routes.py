"""Workers' operator controls: `GET /api/workers`, `POST /api/workers/{worker}/pause`
{"reason"}, `POST .../resume`, `POST .../throttle` {"per_second"}, `DELETE .../throttle`
(operator scope; each action audited by shared/ops/operator_actions.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from services.api.auth import actor
from services.api.responses import json_response, problem
from shared.db import DB_POOL
from shared.ops.operator_actions import (
    Edge,
    Operator,
    WorkerChanged,
    WorkerStateError,
    pause_worker_recorded,
    resume_worker_recorded,
    throttle_worker_recorded,
    unthrottle_worker_recorded,
)
from shared.ops.worker_input import WORKERS, WorkerInputError, parse_rate, parse_reason, worker_name
from shared.process.http_limits import read_body
from shared.queries import worker_controls as worker_sql


async def list_workers(request: web.Request) -> web.Response:
    rows = await worker_sql.every(request.app[DB_POOL])
    return json_response(
        {"workers": [rows.get(w, worker_sql.Controls(w)).as_json() for w in WORKERS]}
    )


async def _body(request: web.Request) -> dict[str, Any] | web.Response:
    raw = await read_body(request)
    if not raw.strip():
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return problem(400, "invalid_request", "body is not valid JSON")
    if not isinstance(data, dict):
        return problem(400, "invalid_request", "body must be a JSON object")
    return data


async def _act(
    request: web.Request,
    act: Callable[[str, Operator], Awaitable[WorkerChanged]],
) -> web.Response:
    worker = worker_name(request.match_info["worker"])
    if worker is None:
        return problem(404, "not_found", f"no worker {request.match_info['worker']!r}")
    try:
        changed = await act(worker, Operator(actor(request).name, Edge.API))
    except WorkerStateError as e:
        return problem(409, "worker_state", str(e))
    return json_response(changed.as_json())


async def pause_worker(request: web.Request) -> web.Response:
    data = await _body(request)
    if isinstance(data, web.Response):
        return data
    try:
        reason = parse_reason(data.get("reason"))
    except WorkerInputError as e:
        return problem(400, "invalid_request", str(e))
    pool = request.app[DB_POOL]
    return await _act(request, lambda w, by: pause_worker_recorded(pool, w, reason, by))


async def resume_worker(request: web.Request) -> web.Response:
    pool = request.app[DB_POOL]
    return await _act(request, lambda w, by: resume_worker_recorded(pool, w, by))


async def throttle_worker(request: web.Request) -> web.Response:
    data = await _body(request)
    if isinstance(data, web.Response):
        return data
    if isinstance(data.get("per_second"), str):
        return problem(400, "invalid_request", "per_second must be a number")
    try:
        rate = parse_rate(data.get("per_second"))
    except WorkerInputError as e:
        return problem(400, "invalid_request", str(e))
    pool = request.app[DB_POOL]
    return await _act(request, lambda w, by: throttle_worker_recorded(pool, w, rate, by))


async def unthrottle_worker(request: web.Request) -> web.Response:
    pool = request.app[DB_POOL]
    return await _act(request, lambda w, by: unthrottle_worker_recorded(pool, w, by))
