"""Order, payment and bonus routes: the shop registers orders, support looks at payments."""

from __future__ import annotations

import orjson
from aiohttp import web

from services.api.auth import actor
from services.api.dlq_access import DLQ_ACCESS
from services.api.responses import json_response, problem
from shared.db import DB_POOL
from shared.ops.operator_actions import (
    Edge,
    Operator,
    dead_letters_or_reason,
    register_order_recorded,
)
from shared.ops.order_input import OrderValidationError, order_json, parse_new_order
from shared.ops.payment_view import payment_view, user_bonus
from shared.process.http_limits import read_body
from shared.queries import orders as orders_sql


async def register_order(request: web.Request) -> web.Response:
    try:
        data = orjson.loads(await read_body(request))
    except orjson.JSONDecodeError:
        return problem(400, "invalid_request", "body is not valid JSON")
    if not isinstance(data, dict):
        return problem(400, "invalid_request", "body must be a JSON object")
    try:
        order = parse_new_order(data)
    except OrderValidationError as e:
        return problem(400, "invalid_order", "invalid order", detail=str(e), fields=e.fields)
    by = Operator(actor(request).name, Edge.API)
    try:
        registered = await register_order_recorded(request.app[DB_POOL], order, by)
    except orders_sql.OrderConflictError as e:
        return problem(409, "order_conflict", str(e))
    return json_response(registered.as_json(), status=201 if registered.created else 200)


async def get_order(request: web.Request) -> web.Response:
    row = await orders_sql.order_by_id(request.app[DB_POOL], request.match_info["order_id"])
    if row is None:
        return problem(404, "not_found", "order not found")
    return json_response(order_json(row))


async def get_payment(request: web.Request) -> web.Response:
    payment_id = request.match_info["payment_id"]
    access = request.app[DLQ_ACCESS]
    letters, missing = await dead_letters_or_reason(access.channel, access.topology, payment_id)
    view = await payment_view(request.app[DB_POOL], payment_id, letters)
    if view is None:
        return problem(404, "not_found", "payment not found")
    if missing is not None:
        view["dead_letters_unavailable"] = missing
    return json_response(view)


async def get_user_bonus(request: web.Request) -> web.Response:
    return json_response(await user_bonus(request.app[DB_POOL], request.match_info["user_id"]))
