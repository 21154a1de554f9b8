"""`payhooks event list` and `event show`: the inbox's webhooks as `GET /api/events` gives
them (shared/ops/inbox_view.py), straight from PostgreSQL and RabbitMQ."""

from __future__ import annotations

import argparse
import sys

import orjson

from shared.config import Settings
from shared.errors import EXIT_NOTHING, EXIT_OK, EXIT_USAGE
from shared.ops import inbox_view
from shared.ops.connections import broker, database
from shared.ops.console import table
from shared.ops.dlq import DeadLetter
from shared.ops.inbox_view import BadQueryError, EventQuery
from shared.providers import registry

COLUMNS = ["received_at", "event_id", "provider", "event", "payment_id", "duplicates", "outcome"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    event = parser.add_subparsers(dest="subcommand", required=True)
    listing = event.add_parser("list", help="webhooks in the inbox, newest first, filtered")
    listing.add_argument("--payment-id")
    listing.add_argument("--provider", help="whose webhooks, e.g. xhub, standard")
    listing.add_argument("--event", help="event type, e.g. refund.failed")
    listing.add_argument(
        "--outcome", help=f"one of {', '.join(inbox_view.OUTCOME_GROUPS)}, or a decision"
    )
    listing.add_argument("--since", help="received at or after (ISO 8601)")
    listing.add_argument("--until", help="received at or before (ISO 8601)")
    listing.add_argument("--limit", help=f"events per page, 1-{inbox_view.MAX_LIMIT} (default 100)")
    listing.add_argument("--cursor", help="the next page: the cursor a page ended with")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=event_list)
    show = event.add_parser("show", help="one webhook: headers, body, outcome, dead letters")
    show.add_argument("event_id")
    show.add_argument(
        "--provider",
        default=None,
        help="whose event (ids are unique per provider only; default xhub)",
    )
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=event_show)


def _dumps(data: object) -> str:
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()


async def event_list(settings: Settings, args: argparse.Namespace) -> int:
    try:
        query = EventQuery.parse(
            payment_id=args.payment_id,
            event=args.event,
            outcome=args.outcome,
            since=args.since,
            until=args.until,
            cursor=args.cursor,
            limit=args.limit,
            provider=args.provider,
        )
    except BadQueryError as e:
        print(f"payhooks: --{e.name.replace('_', '-')} {e.why}", file=sys.stderr)
        return EXIT_USAGE
    async with database(settings) as conn:
        page = await inbox_view.list_events(conn, query)
    events, cursor = page["events"], page["next_cursor"]
    if args.json:
        print(_dumps(page))
    else:
        if events:
            table(COLUMNS, [[e[c] for c in COLUMNS] for e in events])
            print()
        more = f"; next page: --cursor {cursor}" if cursor else ""
        print(f"{len(events)} event(s){more}")
    # A page filtered by outcome may be empty with more to read: nothing matched yet.
    return EXIT_OK if events or cursor else EXIT_NOTHING


async def event_show(settings: Settings, args: argparse.Namespace) -> int:
    async def dead_letters(event_id: str) -> list[DeadLetter]:
        async with broker(settings) as (channel, topology):
            return await inbox_view.dead_letters_for_event(channel, topology, event_id)

    try:
        provider = inbox_view.provider_name(args.provider or registry.DEFAULT.name)
    except BadQueryError as e:
        print(f"payhooks: --{e.name} {e.why}", file=sys.stderr)
        return EXIT_USAGE
    async with database(settings) as conn:
        view = await inbox_view.event_view(conn, args.event_id, dead_letters, provider)
    if view is None:
        whose = "" if provider == registry.DEFAULT.name else f"{provider} "
        print(f"payhooks: {whose}event {args.event_id} is not in the inbox", file=sys.stderr)
        return EXIT_NOTHING
    if "dead_letters_unavailable" in view:
        print(
            f"payhooks: dead letters not shown: {view['dead_letters_unavailable']}", file=sys.stderr
        )
    if args.json:
        print(_dumps(view))
        return EXIT_OK
    print(
        f"event {view['event_id']}  {view['event']}  payment {view['payment_id'] or '-'}"
        f"  provider {view['provider']}"
        f"  received {view['received_at']}  duplicates {view['duplicates']}"
        f" (last {view['last_seen_at']})\noutcome: {view['outcome']}"
    )
    print("\nheaders:")
    table(["header", "value"], sorted(view["headers"].items()))
    print(f"\nbody ({view['body_format']}):")
    body = view["body"]
    print(_dumps(body) if view["body_format"] == "json" else body)
    if view["dead_letters"]:
        print("\ndead letters:")
        columns = ["id", "reason", "error", "attempts", "last_failed_at", "original_queue"]
        table(columns, [[d[c] for c in columns] for d in view["dead_letters"]])
    return EXIT_OK
