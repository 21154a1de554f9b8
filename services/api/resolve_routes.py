"""An operator's resolution of an order (POST /api/payments/{payment_id}/resolve) and what
the merchant is missing (GET /api/missing): parse, call the one shared function, answer."""

from __future__ import annotations

import orjson
from aiohttp import web

from services.api.auth import actor
from services.api.dlq_access import DLQ_ACCESS
from services.api.responses import json_response, problem
from shared.db import DB_POOL
from shared.ops import missing
from shared.ops.operator_actions import Edge, Operator, resolve_order_recorded
from shared.ops.order_resolution import InFlightError, PaymentNotFoundError, orders_dead_letters
from shared.process.http_limits import read_body
from shared.resolution import ResolveInputError, ResolveRefusedError, parse_request

REFUSED_CODES = {"forbidden_move": "resolve_forbidden", "no_change": "resolve_no_change"}


async def resolve_order(request: web.Request) -> web.Response:
    payment_id = request.match_info["payment_id"]
    try:
        data = orjson.loads(await read_body(request))
    except orjson.JSONDecodeError:
        return problem(400, "invalid_request", "body is not valid JSON")
    if not isinstance(data, dict):
        return problem(400, "invalid_request", "body must be a JSON object")
    unknown = sorted(set(data) - {"to", "reason", "force"})
    try:
        if unknown:
            raise ResolveInputError(dict.fromkeys(unknown, "is not a field of a resolve"))
        asked = parse_request(data.get("to"), data.get("reason"), data.get("force", False))
    except ResolveInputError as e:
        return problem(
            400, "invalid_resolution", "invalid resolution", detail=str(e), fields=e.fields
        )
    access = request.app[DLQ_ACCESS]
    try:
        resolved = await resolve_order_recorded(
            request.app[DB_POOL],
            payment_id,
            asked,
            Operator(actor(request).name, Edge.API),
            orders_dead_letters(access.channel, access.topology, payment_id),
        )
    except PaymentNotFoundError as e:
        return problem(404, "not_found", str(e))
    except InFlightError as e:
        return problem(409, "resolve_in_flight", str(e), in_flight=[x.as_json() for x in e.events])
    except ResolveRefusedError as e:
        return problem(409, REFUSED_CODES[e.code], str(e))
    return json_response(resolved.as_json())


async def get_missing(request: web.Request) -> web.Response:
    query = request.query
    try:
        window = missing.Window.parse(query.get("since"), query.get("until"), query.get("limit"))
    except missing.BadWindowError as e:
        return problem(400, "invalid_request", str(e))
    return json_response(await missing.missing(request.app[DB_POOL], window))
