"""The console's resolve form (on a payment's page) and its page of what is missing: the
same functions as the api and the CLI (shared/ops/operator_actions.py, shared/ops/missing.py)."""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from services.api.console.guard import error
from services.api.console.pages import payment_page
from services.api.console.render import render
from services.api.console.sessions import PREFIX, SIGNED_IN, see_other
from services.api.dlq_access import DLQ_ACCESS
from shared.db import DB_POOL
from shared.ops import missing
from shared.ops.operator_actions import (
    Edge,
    Operator,
    resolve_order_recorded,
)
from shared.ops.order_input import text_problem
from shared.ops.order_resolution import InFlightError, PaymentNotFoundError, orders_dead_letters
from shared.resolution import ResolveInputError, ResolveRefusedError, parse_request


async def resolve_page(request: web.Request) -> web.Response:
    """Resolve, then back to the payment's transitions; a refusal shows the payment's page
    again with why, and what was typed."""
    payment_id = request.match_info["payment_id"]
    if text_problem(payment_id) is not None:
        return error(request, 404, "No payment has such an id.")
    form = await request.post()
    to, reason = form.get("to", ""), form.get("reason", "")
    force = form.get("force") == "yes"
    access = request.config_dict[DLQ_ACCESS]
    status, problem = 200, ""
    try:
        asked = parse_request(to, reason, force)
        await resolve_order_recorded(
            request.config_dict[DB_POOL],
            payment_id,
            asked,
            Operator(request[SIGNED_IN].name, Edge.CONSOLE),
            orders_dead_letters(access.channel, access.topology, payment_id),
        )
    except ResolveInputError as e:
        status, problem = 400, str(e)
    except PaymentNotFoundError as e:
        return error(request, 404, str(e))
    except (InFlightError, ResolveRefusedError) as e:
        status, problem = 409, str(e)
    if not problem:
        return see_other(f"{PREFIX}/payments/{quote(payment_id, safe='')}#transitions")
    return await payment_page(
        request,
        payment_id,
        status,
        resolve_problem=problem,
        resolve_form={"to": to, "reason": reason, "force": force},
    )


async def missing_page(request: web.Request) -> web.Response:
    query = request.query
    try:
        window = missing.Window.parse(query.get("since"), query.get("until"), query.get("limit"))
    except missing.BadWindowError as e:
        return error(request, 400, str(e))
    found = await missing.missing(request.config_dict[DB_POOL], window)
    return render(request, "missing.html", found=found, query=dict(query))
