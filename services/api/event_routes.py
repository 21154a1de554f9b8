"""Event routes: the inbox's webhooks, filtered and paged (shared/ops/inbox_view.py), and one in
full; what `payhooks event list` and `event show` print."""

from __future__ import annotations

from aiohttp import web

from services.api.dlq_access import DLQ_ACCESS
from services.api.responses import json_response, problem
from shared.db import DB_POOL
from shared.ops import inbox_view
from shared.ops.dlq import DeadLetter
from shared.ops.inbox_view import BadQueryError, EventQuery
from shared.providers import registry

FILTERS = ("payment_id", "event", "outcome", "since", "until", "cursor", "limit", "provider")


async def list_events(request: web.Request) -> web.Response:
    """`GET /api/events?payment_id=&event=&outcome=&since=&until=&cursor=&limit=&provider=`."""
    given = {name: request.query.getall(name) for name in FILTERS if name in request.query}
    if repeated := [name for name, values in given.items() if len(values) > 1]:
        return problem(400, "invalid_request", f"give {', '.join(repeated)} once")
    try:
        query = EventQuery.parse(**{name: values[0] for name, values in given.items()})
    except BadQueryError as e:
        return problem(400, "invalid_request", str(e))
    return json_response(await inbox_view.list_events(request.app[DB_POOL], query))


async def get_event(request: web.Request) -> web.Response:
    access = request.app[DLQ_ACCESS]

    async def dead_letters(event_id: str) -> list[DeadLetter]:
        async with access.channel() as channel:
            return await inbox_view.dead_letters_for_event(channel, access.topology, event_id)

    try:  # `?provider=` (default xhub): event ids are unique per provider only
        view = await inbox_view.event_view(
            request.app[DB_POOL],
            request.match_info["event_id"],
            dead_letters,
            request.query.get("provider", registry.DEFAULT.name),
        )
    except BadQueryError as e:
        return problem(400, "invalid_request", str(e))
    if view is None:
        return problem(404, "not_found", "event not found")
    return json_response(view)
