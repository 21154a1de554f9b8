"""`payhooks replay`: stored inbox events sent again to the chosen workers, counted first
with `--dry-run` (shared/ops/replay.py, through operator_actions.replay_recorded)."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from aio_pika.abc import AbstractChannel

from services.cli.failure import fail
from shared.amqp.topology import build_topology
from shared.config import Settings
from shared.errors import EXIT_NOTHING, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from shared.ops import inbox_view
from shared.ops.connections import broker, database
from shared.ops.console import table
from shared.ops.operator_actions import Edge, Operator, replay_recorded
from shared.ops.replay import Plan, ReplayPublishError, ReplayTooLargeError
from shared.ops.replay_selection import MAX_EVENTS, WORKERS, ReplayInputError, ReplayRequest
from shared.queries import audit

COLUMNS = ["worker", "messages", "already_processed", "would_skip", "not_stored", "published"]
# The api's field names as the command line spells them.
_FLAGS = {"event_type": "--event-type", "event_ids": "--id", "workers": "--worker"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--event-type", help="e.g. payment.status_changed, refund.completed")
    parser.add_argument("--since", help="received at or after (ISO 8601, UTC if no offset)")
    parser.add_argument("--until", help="received at or before (ISO 8601)")
    parser.add_argument("--payment-id")
    parser.add_argument("--provider", help="e.g. xhub")
    parser.add_argument(
        "--outcome", help=f"one of {', '.join(inbox_view.OUTCOME_GROUPS)}, or a decision"
    )
    parser.add_argument(
        "--id", action="extend", nargs="+", metavar="EVENT_ID", help="event ids (--id A B)"
    )
    parser.add_argument(
        "--worker",
        action="append",
        choices=WORKERS,
        help="orders, bonuses, emails (repeat for several); default: the workers each"
        " event's type is bound to today",
    )
    parser.add_argument(
        "--reprocess",
        action="store_true",
        help="let the workers apply what they already marked processed (needs --reason);"
        " an email already sent is never sent again",
    )
    parser.add_argument("--reason", help="why, for the audit trail (required with --reprocess)")
    parser.add_argument(
        "--limit", type=int, help=f"replay the oldest N of a larger selection (1-{MAX_EVENTS})"
    )
    parser.add_argument("--dry-run", action="store_true", help="count, send nothing")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=replay)


@asynccontextmanager
async def _channel(settings: Settings) -> AsyncIterator[AbstractChannel]:
    async with broker(settings) as (channel, _):
        yield channel


async def replay(settings: Settings, args: argparse.Namespace) -> int:
    try:
        request = ReplayRequest.parse(
            event_type=args.event_type,
            since=args.since,
            until=args.until,
            payment_id=args.payment_id,
            provider=args.provider,
            outcome=args.outcome,
            event_ids=args.id or (),
            workers=args.worker or (),
            reprocess=args.reprocess,
            reason=args.reason,
            limit=args.limit,
        )
    except ReplayInputError as e:
        flag = _FLAGS.get(e.name, "--" + e.name.replace("_", "-"))
        return fail(f"{flag} {e.why}", EXIT_USAGE)
    by = Operator(audit.cli_actor(), Edge.CLI)
    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    async with database(settings) as conn:
        try:
            done = await replay_recorded(
                conn, lambda: _channel(settings), topology, request, by, conn, dry_run=args.dry_run
            )
        except ReplayTooLargeError as e:
            return fail(str(e), EXIT_USAGE)
        except ReplayPublishError as e:
            return fail(str(e), EXIT_USAGE if e.unroutable else EXIT_UNREACHABLE)
    if args.json:
        print(orjson.dumps(done.as_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        _print(done)
    sent = done.messages if done.dry_run else done.published
    return EXIT_OK if sent else EXIT_NOTHING


def _print(done: Plan) -> None:
    what = "dry run, nothing sent" if done.dry_run else "sent"
    reprocess = f", reprocess: {done.request.reason}" if done.request.reprocess else ""
    print(f"replay {done.replay_id} ({what}{reprocess}): {len(done.event_ids)} event(s) selected")
    if done.workers:
        rows = [[w, *list(p.as_json().values())] for w, p in done.workers.items()]
        table(COLUMNS, rows)
    for event_type, count in done.no_route.items():
        print(
            f"no worker takes {event_type} today: {count} event(s) not sent"
            " (once a release binds the type, replay them)"
        )
    if done.more:
        print(
            f"more events match: this run took the oldest {len(done.event_ids)};"
            f" go on with --since {done.as_json()['last_received_at']}"
        )
