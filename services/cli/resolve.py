"""`payhooks order resolve` (an operator's audited transition of an order) and `payhooks
missing` (undecided payments and refused event ids), straight from PostgreSQL and RabbitMQ
through the same functions as the api and the console."""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from aio_pika.abc import AbstractChannel

from services.cli.failure import fail
from shared.amqp.topology import build_topology
from shared.config import Settings
from shared.errors import EXIT_BUSY, EXIT_CONFLICT, EXIT_NOTHING, EXIT_OK, EXIT_USAGE
from shared.ops import missing
from shared.ops.connections import broker, database
from shared.ops.console import table
from shared.ops.operator_actions import Edge, Operator, resolve_order_recorded
from shared.ops.order_resolution import InFlightError, PaymentNotFoundError, orders_dead_letters
from shared.queries import audit
from shared.resolution import ResolveInputError, ResolveRefusedError, parse_request
from shared.vocabulary import OrderStatus


def add_resolve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("payment_id")
    parser.add_argument("--to", required=True, help=f"the status: {', '.join(OrderStatus)}")
    parser.add_argument("--reason", required=True, help="why (goes into the audit trail)")
    parser.add_argument(
        "--force", action="store_true", help="make a move the order machine forbids (shown so)"
    )
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=order_resolve)


def add_missing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", help="window start, ISO 8601 (default: 35 days before until)")
    parser.add_argument("--until", help="window end, ISO 8601 (default: now)")
    parser.add_argument("--limit", help=f"at most N of each list, 1-{missing.MAX_LIMIT}")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=missing_list)


def _dumps(data: object) -> str:
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()


async def order_resolve(settings: Settings, args: argparse.Namespace) -> int:
    try:
        asked = parse_request(args.to, args.reason, args.force)
    except ResolveInputError as e:
        for name, why in e.fields.items():
            print(f"payhooks: --{name}: {why}", file=sys.stderr)
        return EXIT_USAGE

    @asynccontextmanager
    async def channel() -> AsyncIterator[AbstractChannel]:
        async with broker(settings) as (opened, _):
            yield opened

    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    by = Operator(audit.cli_actor(), Edge.CLI)
    async with database(settings) as conn:
        try:
            resolved = await resolve_order_recorded(
                conn,
                args.payment_id,
                asked,
                by,
                orders_dead_letters(channel, topology, args.payment_id),
            )
        except PaymentNotFoundError as e:
            return fail(str(e), EXIT_NOTHING)
        except InFlightError as e:
            return fail(str(e), EXIT_BUSY)
        except ResolveRefusedError as e:
            return fail(str(e), EXIT_CONFLICT)
    if args.json:
        print(_dumps(resolved.as_json()))
    else:
        forced = " (FORCED)" if resolved.forced else ""
        print(
            f"payment {resolved.payment_id}: {resolved.from_status} -> {resolved.to_status}"
            f"{forced} by {resolved.actor}, transition {resolved.transition_id}"
            f" ({resolved.event_id}); bonus and emails follow it"
        )
    return EXIT_OK


async def missing_list(settings: Settings, args: argparse.Namespace) -> int:
    try:
        window = missing.Window.parse(args.since, args.until, args.limit)
    except missing.BadWindowError as e:
        return fail(f"--{e.name} {e.why}", EXIT_USAGE)
    async with database(settings) as conn:
        found = await missing.missing(conn, window)
    if args.json:
        print(_dumps(found))
    else:
        print(f"from {found['since']} to {found['until']}")
        print(f"\npayments the reconciler could not decide: {len(found['undecided'])}")
        if found["undecided"]:
            columns = ["payment_id", "order_id", "status", "since", "reason"]
            table(columns, [[u[c] for c in columns] for u in found["undecided"]])
        print(f"\nevent ids refused and not received since: {len(found['refused'])}")
        if found["refused"]:
            columns = ["provider", "event_id", "status", "outcome", "first_at", "last_at"]
            table(columns, [[r[c] for c in columns] for r in found["refused"]])
    return EXIT_OK if found["undecided"] or found["refused"] else EXIT_NOTHING
