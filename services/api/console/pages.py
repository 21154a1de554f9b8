"""The console's pages: sign-in, overview, search, a payment's story, the DLQs with filters and
a requeue in two steps (a dry run that shows what would move, then a confirmation that moves
exactly that), unrouted, and the audit trail. Reads and moves go through the same code as the
JSON api and the CLI."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

import structlog
from aiohttp import web

from services.api.console import sessions
from services.api.console.guard import SIGN_IN, error
from services.api.console.render import render
from services.api.console.sessions import GATE, SIGNED_IN
from services.api.dlq_access import DLQ_ACCESS
from services.api.monitor import PASSES
from shared.db import DB_POOL
from shared.ops import dlq, dlq_lock, unrouted
from shared.ops.dlq_moves import FILTERS, Selection, UnroutableError
from shared.ops.operator_actions import Edge, Operator, dead_letters_or_reason, requeue_recorded
from shared.ops.order_input import text_problem
from shared.ops.payment_view import payment_view
from shared.process.web import REGISTRY
from shared.providers import registry
from shared.queries import audit
from shared.queries import inbox as inbox_sql
from shared.queries import orders as orders_sql
from shared.tokens import OPERATOR

log = structlog.get_logger(__name__)

MAX_ROWS = 200  # dead letters or unrouted messages listed on one page
MAX_REQUEUE = 1000  # dead letters one confirmation moves (the page lists each)
AUDIT_PAGE = 50
RECENT_S = 300  # the overview's "webhooks received in the last 5 minutes"
RECENT_CAP = 100_000
# The api monitor's gauges (shared/metrics.py QueueMetrics) the overview reads.
QUEUE_GAUGES = (
    "payhooks_queue_messages",
    "payhooks_queue_consumers",
    "payhooks_queue_oldest_message_age_seconds",
)


class _BadInput(ValueError):
    pass


def _text(values: Mapping[str, str], name: str) -> str | None:
    """A form or query field, stripped; None when empty."""
    value = values.get(name, "").strip()
    if (why := text_problem(value)) is not None:
        raise _BadInput(f"{name} {why}")
    return value or None


def _payment_url(payment_id: str) -> str:
    return f"{sessions.PREFIX}/payments/{quote(payment_id, safe='')}"


# Sign-in and sign-out


async def sign_in_page(request: web.Request) -> web.Response:
    target = sessions.safe_next(request.query.get("next"))
    return render(request, "sign_in.html", next=target, problem=None)


async def sign_in(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    target = sessions.safe_next(_field(form, "next"))
    gate = request.config_dict[GATE]
    token = gate.token_for(_field(form, "token").strip())
    if token is None:
        log.warning("console.sign_in_refused", reason="unknown token", peer=request.remote)
        return render(
            request, "sign_in.html", status=401, next=target, problem="That token is not valid."
        )
    if token.scope != OPERATOR:
        why = f"Token {token.name} has scope {token.scope}: the console needs an operator token."
        log.warning("console.sign_in_refused", reason="not operator", actor=token.name)
        return render(request, "sign_in.html", status=403, next=target, problem=why)
    value = await gate.sign_in(request.config_dict[DB_POOL], token)
    log.info("console.signed_in", actor=token.name, peer=request.remote)
    response = sessions.see_other(target)
    sessions.set_cookie(request, response, sessions.SESSION_COOKIE, value)
    return response


async def sign_out(request: web.Request) -> web.StreamResponse:
    await request.config_dict[GATE].sign_out(request.config_dict[DB_POOL], request)
    response = sessions.see_other(SIGN_IN)
    sessions.forget_session(response)
    return response


def _field(form: Mapping[str, object], name: str) -> str:
    value = form.get(name, "")
    return value if isinstance(value, str) else ""


# Looking


async def overview(request: web.Request) -> web.Response:
    """What the api's monitor measured at its last pass (its gauges), and the inbox's pace."""
    registry = request.config_dict[REGISTRY]
    topology = request.config_dict[DLQ_ACCESS].topology

    def gauge(name: str, queue: str | None = None) -> float | None:
        labels = {} if queue is None else {"queue": queue.removeprefix(topology.prefix)}
        return registry.get_sample_value(name, labels)

    messages, consumers, oldest = QUEUE_GAUGES
    queues = [
        {
            "name": work.name.removeprefix(topology.prefix),
            "messages": gauge(messages, work.name),
            "consumers": gauge(consumers, work.name),
            "dlq": work.dlq.removeprefix(topology.prefix),
            "dead": gauge(messages, work.dlq),
            "oldest_dead_s": gauge(oldest, work.dlq),
        }
        for work in topology.work.values()
    ]
    recent = await inbox_sql.received_since(request.config_dict[DB_POOL], RECENT_S, RECENT_CAP)
    passes = request.config_dict[PASSES]
    return render(
        request,
        "overview.html",
        measured=passes.measured,
        consumers_measured=passes.consumers_measured,
        queues=queues,
        unrouted=gauge(messages, topology.unrouted),
        inbox_unpublished=gauge("payhooks_inbox_unpublished"),
        outbox_backlog=gauge("payhooks_outbox_backlog"),
        undecided=gauge("payhooks_orders_undecided"),
        undecided_oldest_s=gauge("payhooks_orders_undecided_oldest_seconds"),
        parked=gauge("payhooks_parked_events"),
        parked_oldest_s=gauge("payhooks_parked_events_oldest_seconds"),
        recent=recent,
        recent_capped=recent >= RECENT_CAP,
        recent_minutes=RECENT_S // 60,
    )


async def search(request: web.Request) -> web.StreamResponse:
    """A payment id, an order id or an event id: straight to the payment's page."""
    try:
        wanted = _text(request.query, "q")
    except _BadInput as e:
        return render(request, "search.html", status=400, q="", problem=str(e))
    if wanted is None:
        return render(request, "search.html", q="", problem=None)
    db = request.config_dict[DB_POOL]
    if await orders_sql.order_for_payment(db, wanted) or await inbox_sql.webhooks_for_payment(
        db, wanted
    ):
        return sessions.see_other(_payment_url(wanted))
    order = await orders_sql.order_by_id(db, wanted)
    if order is not None:
        return sessions.see_other(_payment_url(order["payment_id"]))
    for provider in registry.PROVIDERS:  # an event id is unique per provider only
        event = await inbox_sql.webhook(db, provider.name, wanted)
        if event is not None and event["payment_id"]:
            return sessions.see_other(_payment_url(event["payment_id"]) + "#events")
    return render(request, "search.html", q=wanted, problem=None)


async def payment(request: web.Request) -> web.Response:
    payment_id = request.match_info["payment_id"]
    if text_problem(payment_id) is not None:
        return error(request, 404, "No payment has such an id.")
    return await payment_page(request, payment_id)


async def payment_page(
    request: web.Request, payment_id: str, status: int = 200, **form: object
) -> web.Response:
    """The payment's page; `form`: a refused form's problem and what was typed in it."""
    access = request.config_dict[DLQ_ACCESS]
    letters, missing = await dead_letters_or_reason(access.channel, access.topology, payment_id)
    view = await payment_view(request.config_dict[DB_POOL], payment_id, letters)
    if view is None:
        return error(request, 404, f"payhooks has never heard of payment {payment_id}.")
    work_queues = {work.name: name for name, work in access.topology.work.items()}
    return render(
        request,
        "payment.html",
        status=status,
        payment_id=payment_id,
        view=view,
        missing=missing,
        work_queues=work_queues,
        **form,
    )


async def dlqs(request: web.Request) -> web.Response:
    access = request.config_dict[DLQ_ACCESS]
    async with access.channel() as channel:
        stats = await dlq.stats(channel, access.topology)
    rows = [(name, stat) for name, stat in zip(dlq.QUEUES, stats, strict=True)]
    return render(request, "dlqs.html", rows=rows)


def _queue(request: web.Request) -> tuple[str, str]:
    """(the work queue's name, its DLQ's full name); 404 for any other name."""
    name = request.match_info["queue"]
    if name not in dlq.QUEUES:
        raise web.HTTPNotFound(reason=f"No DLQ {name}; the DLQs are {', '.join(dlq.QUEUES)}.")
    return name, dlq.dlq_name(request.config_dict[DLQ_ACCESS].topology, name)


def _selection(values: Mapping[str, str], ids: tuple[str, ...] = ()) -> Selection:
    """The filter fields (and ids) as a Selection; no filter at all means every letter."""
    selection = Selection.parse(ids=ids, everything=False, **{f: _text(values, f) for f in FILTERS})
    return Selection.parse(everything=True) if selection.says_nothing else selection


async def dlq_page(request: web.Request) -> web.Response:
    name, queue = _queue(request)
    problem: str | None = None
    try:
        selection = _selection(request.query)
    except ValueError as e:  # a time that is not one, a NUL
        selection, problem = Selection.parse(everything=True), str(e)
    access = request.config_dict[DLQ_ACCESS]
    async with access.channel() as channel:
        letters = await dlq.show(channel, queue, lock_wait_s=dlq_lock.VIEW_LOCK_WAIT_S)
    matching = [] if problem else [letter for letter in letters if selection.matches(letter)]
    return render(
        request,
        "dlq.html",
        status=400 if problem else 200,
        name=name,
        queue=queue,
        total=len(letters),
        matching=len(matching),
        letters=matching[:MAX_ROWS],
        filters={f: request.query.get(f, "") for f in FILTERS},
        reasons=sorted({letter.reason for letter in letters}),
        events=sorted({letter.event for letter in letters if letter.event}),
        providers=sorted(
            {*registry.BY_NAME, *(letter.provider for letter in letters if letter.provider)}
        ),
        problem=problem,
    )


async def requeue_page(request: web.Request) -> web.Response:
    """`step=dry-run`: what the filter selects, and a confirmation form naming those ids;
    `step=confirm`: requeue exactly those ids (those still matching the filter)."""
    name, queue = _queue(request)
    form = await request.post()
    fields = {f: _field(form, f) for f in FILTERS}
    confirming = _field(form, "step") == "confirm"
    ids = tuple(i for i in form.getall("ids", []) if isinstance(i, str))
    try:
        if confirming and not ids:
            raise _BadInput("Nothing to requeue: start again from the filter.")
        selection = _selection(fields, ids if confirming else ())
    except ValueError as e:
        return error(request, 400, str(e))
    by = Operator(request[SIGNED_IN].name, Edge.CONSOLE)
    try:
        async with request.config_dict[DLQ_ACCESS].channel() as channel:
            answer, letters = await requeue_recorded(
                channel, queue, selection, by, request.config_dict[DB_POOL], dry_run=not confirming
            )
    except UnroutableError as e:
        return error(request, 409, f"{e}. What was requeued before it stays requeued.")
    if not confirming:
        return render(
            request,
            "confirm.html",
            name=name,
            queue=queue,
            filters=fields,
            matching=len(letters),
            letters=letters[:MAX_REQUEUE],
        )
    return render(request, "requeued.html", name=name, queue=queue, answer=answer.as_json())


async def unrouted_page(request: web.Request) -> web.Response:
    access = request.config_dict[DLQ_ACCESS]
    async with access.channel() as channel:
        seen = await unrouted.view(
            channel, access.topology.unrouted, limit=MAX_ROWS, lock_wait_s=dlq_lock.VIEW_LOCK_WAIT_S
        )
    return render(request, "unrouted.html", seen=seen)


async def audit_page(request: web.Request) -> web.Response:
    try:
        before = audit.parse_cursor(request.query["older"]) if "older" in request.query else None
    except ValueError as e:
        return error(request, 400, str(e))
    actions = await audit.page(request.config_dict[DB_POOL], AUDIT_PAGE, before)
    return render(
        request, "audit.html", actions=actions, older=audit.next_cursor(actions, AUDIT_PAGE)
    )
