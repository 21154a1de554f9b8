"""The console's Workers page: each worker's operator pause and rate cap (who, why, since
when, the cap), with forms to pause, resume, throttle and lift the cap, each through the one
audited function of shared/ops/operator_actions.py the api and the CLI use."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from services.api.console import sessions
from services.api.console.guard import error
from services.api.console.render import render
from services.api.console.sessions import SIGNED_IN
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
from shared.queries import worker_controls as worker_sql

PAGE = f"{sessions.PREFIX}/workers"


async def workers_page(request: web.Request) -> web.Response:
    rows = await worker_sql.every(request.config_dict[DB_POOL])
    workers = [rows.get(w, worker_sql.Controls(w)).as_json() for w in WORKERS]
    return render(request, "workers.html", workers=workers, done=request.query.get("done"))


def _field(form: Mapping[str, object], name: str) -> str:
    value = form.get(name, "")
    return value if isinstance(value, str) else ""


async def _act(
    request: web.Request, act: Callable[[str, Operator], Awaitable[WorkerChanged]], done: str
) -> web.Response:
    worker = worker_name(request.match_info["worker"])
    if worker is None:
        return error(request, 404, f"No worker {request.match_info['worker']}.")
    try:
        await act(worker, Operator(request[SIGNED_IN].name, Edge.CONSOLE))
    except (WorkerStateError, WorkerInputError) as e:
        return error(request, 409 if isinstance(e, WorkerStateError) else 400, f"{e}.")
    return sessions.see_other(f"{PAGE}?done={done}-{worker}")


async def pause(request: web.Request) -> web.Response:
    form = await request.post()
    try:
        reason = parse_reason(_field(form, "reason"))
    except WorkerInputError as e:
        return error(request, 400, f"{e}.")
    pool = request.config_dict[DB_POOL]
    return await _act(request, lambda w, by: pause_worker_recorded(pool, w, reason, by), "paused")


async def resume(request: web.Request) -> web.Response:
    pool = request.config_dict[DB_POOL]
    return await _act(request, lambda w, by: resume_worker_recorded(pool, w, by), "resumed")


async def throttle(request: web.Request) -> web.Response:
    form = await request.post()
    try:
        rate = parse_rate(_field(form, "per_second").strip())
    except WorkerInputError as e:
        return error(request, 400, f"{e}.")
    pool = request.config_dict[DB_POOL]
    return await _act(
        request, lambda w, by: throttle_worker_recorded(pool, w, rate, by), "throttled"
    )


async def unthrottle(request: web.Request) -> web.Response:
    pool = request.config_dict[DB_POOL]
    return await _act(request, lambda w, by: unthrottle_worker_recorded(pool, w, by), "unthrottled")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/workers", workers_page)
    app.router.add_post("/workers/{worker}/pause", pause)
    app.router.add_post("/workers/{worker}/resume", resume)
    app.router.add_post("/workers/{worker}/throttle", throttle)
    app.router.add_post("/workers/{worker}/unthrottle", unthrottle)
