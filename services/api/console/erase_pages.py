"""The console's erase form (on a payment's page): the same audited function as the api and
the CLI (shared/ops/operator_actions.py erase_recorded), by the payment's order id."""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from services.api.console.guard import error
from services.api.console.sessions import PREFIX, SIGNED_IN, see_other
from services.api.erasure_routes import ARCHIVE_DIR
from shared.db import DB_POOL
from shared.ops import archive, erasure
from shared.ops.archive_files import ArchiveCorruptError
from shared.ops.operator_actions import Edge, Operator, erase_recorded
from shared.ops.order_input import text_problem
from shared.queries import orders as orders_sql


async def erase_page(request: web.Request) -> web.Response:
    """Erase the customer of the payment's order (the address of that order, wherever it is
    held), then back to the payment's page; the box must be ticked."""
    payment_id = request.match_info["payment_id"]
    if text_problem(payment_id) is not None:
        return error(request, 404, "No payment has such an id.")
    form = await request.post()
    if form.get("confirm") != "yes":
        return error(request, 400, "Tick the box to confirm the erasure: it cannot be undone.")
    pool = request.config_dict[DB_POOL]
    order = await orders_sql.orders_for_payments(pool, [payment_id])
    if payment_id not in order:
        return error(request, 404, f"No order is registered for payment {payment_id}.")
    selector = erasure.Selector(erasure.By.ORDER, order[payment_id]["order_id"])
    try:
        await erase_recorded(
            pool,
            selector,
            Operator(request[SIGNED_IN].name, Edge.CONSOLE),
            request.config_dict[ARCHIVE_DIR],
        )
    except erasure.PersonNotFoundError as e:  # the order went away since
        return error(request, 404, str(e))
    except (ArchiveCorruptError, archive.ArchivesUnreachableError) as e:
        return error(request, 503, f"Nothing was erased: {e}")
    return see_other(f"{PREFIX}/payments/{quote(payment_id, safe='')}#order")
