"""The console's order registration (on the page of a payment with no order): the same
function as `POST /api/orders` and `payhooks order add` (shared/ops/operator_actions.py)."""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from services.api.console.guard import error
from services.api.console.pages import payment_page
from services.api.console.sessions import PREFIX, SIGNED_IN, see_other
from shared.db import DB_POOL
from shared.ops.operator_actions import (
    Edge,
    Operator,
    register_order_recorded,
)
from shared.ops.order_input import OrderValidationError, parse_new_order, text_problem
from shared.queries.orders import OrderConflictError

FIELDS = ("order_id", "user_id", "email", "amount", "currency")


async def register_page(request: web.Request) -> web.Response:
    """Register, then back to the payment's page (its parked events released); a refusal
    shows the page again with why, and what was typed."""
    payment_id = request.match_info["payment_id"]
    if text_problem(payment_id) is not None:
        return error(request, 404, "No payment has such an id.")
    form = await request.post()
    typed = {name: str(form.get(name, "")) for name in FIELDS}
    status, problem = 200, ""
    try:
        order = parse_new_order({**typed, "payment_id": payment_id})
        await register_order_recorded(
            request.config_dict[DB_POOL], order, Operator(request[SIGNED_IN].name, Edge.CONSOLE)
        )
    except OrderValidationError as e:
        status, problem = 400, str(e)
    except OrderConflictError as e:
        status, problem = 409, str(e)
    if not problem:
        return see_other(f"{PREFIX}/payments/{quote(payment_id, safe='')}#order")
    return await payment_page(
        request, payment_id, status, register_problem=problem, register_form=typed
    )
