"""The console's replay: a form (the selection, the workers, reprocess and its reason), a dry
run that counts per worker and lists the events, then a confirmation that replays exactly
those events (those still matching the selection), through operator_actions.replay_recorded
like the api and the CLI."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from services.api.console.guard import error
from services.api.console.render import render
from services.api.console.sessions import SIGNED_IN
from services.api.dlq_access import DLQ_ACCESS
from shared.db import DB_POOL
from shared.ops import inbox_view
from shared.ops.operator_actions import Edge, Operator, replay_recorded
from shared.ops.replay import ReplayPublishError, ReplayTooLargeError
from shared.ops.replay_selection import WORKERS, ReplayInputError, ReplayRequest

# Events one confirmation replays (the confirmation names each of them); more: narrow the
# selection, or use the CLI or the api with a limit.
MAX_CONFIRM = 1000
FIELDS = ("event_type", "since", "until", "payment_id", "provider", "outcome", "reason")


def _form(values: Mapping[str, object]) -> dict[str, str]:
    fields = {}
    for name in FIELDS:
        value = values.get(name, "")
        fields[name] = value.strip() if isinstance(value, str) else ""
    return fields


def _request(
    fields: Mapping[str, str], workers: list[str], reprocess: bool, ids: tuple[str, ...] = ()
) -> ReplayRequest:
    given = {name: (fields[name] or None) for name in FIELDS}
    return ReplayRequest.parse(
        **given, workers=workers, reprocess=reprocess, event_ids=ids, limit=MAX_CONFIRM
    )


async def replay_form(request: web.Request) -> web.Response:
    return render(
        request,
        "replay.html",
        fields=_form(request.query),
        workers=WORKERS,
        chosen=[],
        reprocess=False,
        outcomes=inbox_view.OUTCOME_FILTERS,
        problem=None,
    )


async def replay_page(request: web.Request) -> web.Response:
    """`step=dry-run`: the counts and the events, and a confirmation form naming them;
    `step=confirm`: replay exactly those events (those still matching)."""
    form = await request.post()
    fields = _form(form)
    workers = [w for w in form.getall("workers", []) if isinstance(w, str)]
    reprocess = form.get("reprocess") == "on"
    confirming = form.get("step") == "confirm"
    ids = tuple(i for i in form.getall("ids", []) if isinstance(i, str))
    try:
        if confirming and not ids:
            raise ReplayInputError("selection", "is empty: start again from the form")
        asked = _request(fields, workers, reprocess, ids if confirming else ())
    except ReplayInputError as e:
        return render(
            request,
            "replay.html",
            status=400,
            fields=fields,
            workers=WORKERS,
            chosen=workers,
            reprocess=reprocess,
            outcomes=inbox_view.OUTCOME_FILTERS,
            problem=str(e),
        )
    access = request.config_dict[DLQ_ACCESS]
    pool = request.config_dict[DB_POOL]
    by = Operator(request[SIGNED_IN].name, Edge.CONSOLE)
    try:
        done = await replay_recorded(
            pool, access.channel, access.topology, asked, by, pool, dry_run=not confirming
        )
    except ReplayTooLargeError as e:
        return error(request, 422, str(e))
    except ReplayPublishError as e:
        return error(request, 409 if e.unroutable else 503, str(e))
    return render(
        request,
        "replayed.html",
        done=done.as_json(),
        event_ids=done.event_ids,
        fields=fields,
        chosen=workers,
        reprocess=reprocess,
        more=done.more,
        limit=MAX_CONFIRM,
    )
