"""The operator commands behind the CLI: orders, payments, DLQs, unrouted (PostgreSQL and
RabbitMQ directly, no api in between). Each returns the process exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from aio_pika.abc import AbstractChannel

from services.cli.failure import fail
from shared.amqp.topology import build_topology
from shared.config import Settings
from shared.errors import EXIT_CONFLICT, EXIT_NOTHING, EXIT_OK, EXIT_USAGE
from shared.ops import dlq, unrouted
from shared.ops.connections import broker, database
from shared.ops.console import Progress, table
from shared.ops.dlq_moves import FILTERS, Selection
from shared.ops.operator_actions import (
    Edge,
    Operator,
    Trail,
    dead_letters_or_reason,
    purge_recorded,
    register_order_recorded,
    requeue_recorded,
)
from shared.ops.order_input import OrderValidationError, parse_new_order
from shared.ops.payment_view import payment_view
from shared.queries import audit
from shared.queries import orders as orders_sql


def _print_json(data: Any) -> None:
    print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


def _operator() -> Operator:
    return Operator(audit.cli_actor(), Edge.CLI)


def _trail(settings: Settings) -> Trail:
    """The audit row is written after the action, on a connection of its own."""
    return lambda: database(settings)


@asynccontextmanager
async def _channel(settings: Settings) -> AsyncIterator[AbstractChannel]:
    async with broker(settings) as (channel, _):
        yield channel


async def order_add(settings: Settings, args: argparse.Namespace) -> int:
    data = {
        "order_id": args.order_id,
        "payment_id": args.payment_id,
        "user_id": args.user_id,
        "email": args.email,
        "amount": args.amount,
        "currency": args.currency,
    }
    try:
        order = parse_new_order(data)
    except OrderValidationError as e:
        for name, problem in e.fields.items():
            print(f"payhooks: --{name.replace('_', '-')}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    async with database(settings) as conn:
        try:
            registered = await register_order_recorded(conn, order, _operator())
        except orders_sql.OrderConflictError as e:
            return fail(str(e), EXIT_CONFLICT)
    shown = registered.as_json()
    if args.json:
        _print_json(shown)
    else:
        verb = "registered" if registered.created else "already registered"
        print(
            f"order {shown['order_id']} {verb}: payment {shown['payment_id']},"
            f" {shown['amount']} {shown['currency']}, status {shown['status']}"
        )
    return EXIT_OK


async def payment_show(settings: Settings, args: argparse.Namespace) -> int:
    letters, missing = await dead_letters_or_reason(
        lambda: _channel(settings),
        build_topology(settings.amqp_prefix, settings.retry_delays_s),
        args.payment_id,
    )
    if missing is not None:
        # The database holds most of the answer: show it, and say what is missing.
        print(f"payhooks: dead letters not shown: {missing}", file=sys.stderr)
    async with database(settings) as conn:
        view = await payment_view(conn, args.payment_id, letters)
    if view is None:
        return fail(f"payment {args.payment_id} is unknown (no order, no webhook)", EXIT_NOTHING)
    if args.json:
        _print_json(view)
        return EXIT_OK
    order = view["order"]
    if order is None:
        print(f"payment {args.payment_id}: NO ORDER REGISTERED; {_where_events_wait(view)}")
    else:
        print(
            f"payment {args.payment_id}  order {order['order_id']}  user {order['user_id']}"
            f"  {order['amount']} {order['currency']}  status {order['status']}"
            f"  refunded {order['refunded_amount']}"
        )
    if view["undecided"] is not None:
        undecided = view["undecided"]
        print(
            f"UNDECIDED since {undecided['since']} ({undecided['reason']}):"
            " the reconciler is asking the provider"
        )
    sections: list[tuple[str, list[str], str]] = [
        (
            "webhooks",
            ["received_at", "event_id", "event", "status", "duplicates", "outcome"],
            "events",
        ),
        ("refund failures", ["received_at", "event", "refund_id", "event_id"], "refund_failures"),
        (
            "transitions",
            ["at", "id", "from", "to", "event_id", "source", "actor", "forced", "reason"],
            "transitions",
        ),
        ("bonus", ["created_at", "kind", "points", "transition_id", "user_id"], "bonus"),
        ("emails", ["sent_at", "template", "skipped", "skip_reason", "message_id"], "emails"),
        ("parked", ["parked_at", "event_id", "event", "state", "released_at"], "parked"),
        ("dead letters", ["id", "reason", "error", "attempts", "last_failed_at"], "dead_letters"),
    ]
    for title, columns, key in sections:
        print(f"\n{title}:")
        if view[key]:
            table(columns, [[item.get(c) for c in columns] for item in view[key]])
        else:
            print("  (none)")
    balance = sum(entry["points"] for entry in view["bonus"])
    print(f"\nnet bonus for this payment: {balance}")
    return EXIT_OK


async def dlq_list(settings: Settings, args: argparse.Namespace) -> int:
    async with broker(settings) as (channel, topology):
        stats = await dlq.stats(channel, topology)
    rows = [s.as_json() for s in stats]
    if args.json:
        _print_json({"queues": rows})
    else:
        table(["queue", "messages", "oldest_age_seconds"], [list(r.values()) for r in rows])
    return EXIT_OK


async def dlq_show(settings: Settings, args: argparse.Namespace) -> int:
    async with broker(settings) as (channel, topology):
        letters = await dlq.show(channel, dlq.dlq_name(topology, args.queue))
    if getattr(args, "provider", None):
        letters = [d for d in letters if d.provider == args.provider]
    shown = letters[: args.limit] if args.limit else letters
    if args.json:
        _print_json({"messages": [d.as_json() for d in shown], "total": len(letters)})
    else:
        columns = [
            "id",
            "event",
            "payment_id",
            "reason",
            "provider",
            "attempts",
            "last_failed_at",
            "error",
        ]
        table(columns, [[d.as_json()[c] for c in columns] for d in shown])
        print(f"\n{len(shown)} of {len(letters)} message(s) shown")
    return EXIT_OK  # it showed what is there, nothing included


async def dlq_requeue(settings: Settings, args: argparse.Namespace) -> int:
    try:
        filters = {f: getattr(args, f) for f in FILTERS}
        selection = Selection.parse(ids=args.id or (), everything=args.all, **filters)
    except ValueError as e:
        return fail(f"--{e}", EXIT_USAGE)
    if selection.says_nothing:
        return fail(
            "say what to requeue: --id ID, --all, or a filter (--reason, --event-type,"
            " --payment-id, --provider, --since, --until)",
            EXIT_USAGE,
        )
    progress = Progress("requeued")
    async with broker(settings) as (channel, topology):
        answer, letters = await requeue_recorded(
            channel,
            dlq.dlq_name(topology, args.queue),
            selection,
            _operator(),
            _trail(settings),
            limit=args.limit,
            dry_run=args.dry_run,
            progress=progress,
        )
    progress.finish()
    if args.json:
        _print_json(answer.as_json())
    else:
        verb = "would requeue" if args.dry_run else "requeued"
        for letter in letters:
            print(f"{verb} {letter.id} ({letter.reason}) -> {letter.original_queue}")
        for missing in answer.not_found:
            print(f"not found: {missing}", file=sys.stderr)
        print(f"{verb} {len(answer.ids)} message(s) from {args.queue}.dlq")
    return EXIT_OK if answer.ids else EXIT_NOTHING


async def dlq_purge(settings: Settings, args: argparse.Namespace) -> int:
    if not args.yes:
        return fail("purge deletes messages for good: add --yes to confirm", EXIT_USAGE)
    progress = Progress("purged")
    async with broker(settings) as (channel, topology):
        purged = await purge_recorded(
            channel,
            dlq.dlq_name(topology, args.queue),
            _operator(),
            _trail(settings),
            progress=progress,
        )
    progress.finish()
    if args.json:
        _print_json(purged.as_json())
    else:
        for letter in purged.messages:
            print(
                f"purged {letter.id} ({letter.reason}) event {letter.event} "
                f"payment {letter.payment_id}"
            )
        print(f"purged {len(purged.messages)} message(s) from {args.queue}.dlq")
    return EXIT_OK if purged.messages else EXIT_NOTHING


async def unrouted_show(settings: Settings, args: argparse.Namespace) -> int:
    async with broker(settings) as (channel, topology):
        seen = await unrouted.view(channel, topology.unrouted, limit=args.limit)
    if args.json:
        _print_json(seen.as_json())
        return EXIT_OK  # an empty queue is an answer, as for `dlq show`
    age = seen.oldest_age_seconds
    print(
        f"{seen.queue}: {seen.total} message(s) no worker consumes"
        + ("" if age is None else f", the oldest published {age:,.0f} s ago")
    )
    if seen.messages:
        columns = ["published_at", "id", "event", "payment_id", "provider"]
        table(columns, [[m.as_json()[c] for c in columns] for m in seen.messages])
        counts = ", ".join(f"{event} {n}" for event, n in seen.by_event.items())
        print(f"\n{len(seen.messages)} of {seen.total} shown; all {seen.total} by event: {counts}")
    return EXIT_OK


def _where_events_wait(view: dict[str, Any]) -> str:
    """What is true now of a payment's events while no order is registered for it."""
    if view["dead_letters"]:
        return (
            "its events wait in orders.dlq: register the order (payhooks order add), then"
            " requeue them (payhooks dlq requeue orders --id ...)"
        )
    return (
        "its events are parked (dead-lettered to orders.dlq after UNKNOWN_PAYMENT_PARK_SECONDS):"
        " register the order (payhooks order add) and they apply at once"
    )
