"""Order, payment and bonus routes: the shop registers orders, support looks at payments."""

from __future__ import annotations

import orjson
from aiohttp import web

from services.api.auth import actor
from services.api.dlq_access import DLQ_ACCESS, payment_dead_letters
from services.api.responses import json_response, problem
from shared.db import DB_POOL
from shared.http_limits import read_body
from shared.order_input import OrderValidationError, order_json, parse_new_order
from shared.payment_view import payment_view, user_bonus
from shared.queries import audit
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
    try:
        row, created = await orders_sql.register_order(request.app[DB_POOL], order)
    except orders_sql.OrderConflictError as e:
        return problem(409, "order_conflict", str(e))
    if created:
        registered = audit.Action(
            actor(request).name, "api", audit.ORDER_REGISTER, order.order_id, [order.payment_id], 1
        )
        await audit.record(request.app[DB_POOL], registered)
    return json_response(order_json(row), status=201 if created else 200)


async def get_order(request: web.Request) -> web.Response:
    row = await orders_sql.order_by_id(request.app[DB_POOL], request.match_info["order_id"])
    if row is None:
        return problem(404, "not_found", "order not found")
    return json_response(order_json(row))


async def get_payment(request: web.Request) -> web.Response:
    payment_id = request.match_info["payment_id"]
    letters, missing = await payment_dead_letters(request.app[DLQ_ACCESS], payment_id)
    view = await payment_view(request.app[DB_POOL], payment_id, letters)
    if view is None:
        return problem(404, "not_found", "payment not found")
    if missing is not None:
        view["dead_letters_unavailable"] = missing
    return json_response(view)


async def get_user_bonus(request: web.Request) -> web.Response:
    return json_response(await user_bonus(request.app[DB_POOL], request.match_info["user_id"]))
