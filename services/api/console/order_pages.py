"""The console's order registration (on the page of a payment with no order): the same
function as `POST /api/orders` and `payhooks order add` (shared/ops/operator_actions.py)."""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from services.api.console.guard import error
from services.api.console.render import render
from services.api.console.sessions import PREFIX, SIGNED_IN, see_other
from services.api.dlq_access import DLQ_ACCESS
from shared.db import DB_POOL
from shared.ops.operator_actions import (
    Edge,
    Operator,
    dead_letters_or_reason,
    register_order_recorded,
)
from shared.ops.order_input import OrderValidationError, parse_new_order, text_problem
from shared.ops.payment_view import payment_view
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
    access = request.config_dict[DLQ_ACCESS]
    letters, unread = await dead_letters_or_reason(access.channel, access.topology, payment_id)
    view = await payment_view(request.config_dict[DB_POOL], payment_id, letters)
    if view is None:
        view_status = 404 if status == 200 else status
        return error(request, view_status, problem)
    return render(
        request,
        "payment.html",
        status=status,
        payment_id=payment_id,
        view=view,
        missing=unread,
        work_queues={work.name: name for name, work in access.topology.work.items()},
        register_problem=problem,
        register_form=typed,
    )
