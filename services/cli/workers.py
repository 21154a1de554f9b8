"""`payhooks worker list|pause|resume|throttle|unthrottle`: an operator's pause and rate cap
of a worker, shared by all its replicas (PostgreSQL directly; each action audited by
shared/ops/operator_actions.py, like the api's and the console's)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from services.cli.failure import fail
from shared.config import Settings
from shared.errors import EXIT_CONFLICT, EXIT_OK, EXIT_USAGE
from shared.ops.connections import database
from shared.ops.console import table
from shared.ops.operator_actions import (
    Edge,
    Operator,
    WorkerChanged,
    WorkerStateError,
    pause_worker_recorded,
    resume_worker_recorded,
    throttle_worker_recorded,
    unthrottle_worker_recorded,
)
from shared.ops.worker_input import WORKERS, WorkerInputError, parse_rate, parse_reason
from shared.ops.worker_input import worker_name as parse_worker
from shared.queries import audit
from shared.queries import worker_controls as worker_sql

COLUMNS = ["worker", "paused", "paused_by", "paused_at", "paused_reason", "rate_limit_per_second"]
_CHOICES = (*WORKERS, "emails")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="subcommand", required=True)
    listing = sub.add_parser("list", help="each worker's pause and rate limit")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=list_workers)
    pause = sub.add_parser(
        "pause", help="stop every replica of a worker taking messages (they wait in RabbitMQ)"
    )
    pause.add_argument("worker", choices=_CHOICES)
    pause.add_argument("--reason", required=True, help="why: shown wherever the pause is")
    pause.add_argument("--json", action="store_true")
    pause.set_defaults(handler=pause_worker)
    resume = sub.add_parser("resume", help="end an operator's pause of a worker")
    resume.add_argument("worker", choices=_CHOICES)
    resume.add_argument("--json", action="store_true")
    resume.set_defaults(handler=resume_worker)
    throttle = sub.add_parser(
        "throttle", help="cap the messages a worker takes per second, over all its replicas"
    )
    throttle.add_argument("worker", choices=_CHOICES)
    throttle.add_argument("--per-second", required=True, help="e.g. 5, or 0.5")
    throttle.add_argument("--json", action="store_true")
    throttle.set_defaults(handler=throttle_worker)
    unthrottle = sub.add_parser("unthrottle", help="lift a worker's rate limit")
    unthrottle.add_argument("worker", choices=_CHOICES)
    unthrottle.add_argument("--json", action="store_true")
    unthrottle.set_defaults(handler=unthrottle_worker)


def _operator() -> Operator:
    return Operator(audit.cli_actor(), Edge.CLI)


def _worker(args: argparse.Namespace) -> str:
    name = parse_worker(args.worker)
    if name is None:  # argparse's choices stop it before
        raise SystemExit(EXIT_USAGE)
    return name


async def list_workers(settings: Settings, args: argparse.Namespace) -> int:
    async with database(settings) as conn:
        rows = await worker_sql.every(conn)
    shown = [rows.get(w, worker_sql.Controls(w)).as_json() for w in WORKERS]
    if args.json:
        print(orjson.dumps({"workers": shown}, option=orjson.OPT_INDENT_2).decode())
    else:
        table(COLUMNS, [[w[c] for c in COLUMNS] for w in shown])
    return EXIT_OK


async def _act(
    settings: Settings,
    args: argparse.Namespace,
    act: Callable[[Any, str], Awaitable[WorkerChanged]],
    said: Callable[[WorkerChanged], str],
) -> int:
    worker = _worker(args)
    async with database(settings) as conn:
        try:
            changed = await act(conn, worker)
        except WorkerStateError as e:
            print(f"payhooks: {e}", file=sys.stderr)
            return EXIT_CONFLICT
    if args.json:
        print(orjson.dumps(changed.as_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        print(said(changed))
    return EXIT_OK


async def pause_worker(settings: Settings, args: argparse.Namespace) -> int:
    try:
        reason = parse_reason(args.reason)
    except WorkerInputError as e:
        return fail(f"--reason: {e}", EXIT_USAGE)
    return await _act(
        settings,
        args,
        lambda conn, worker: pause_worker_recorded(conn, worker, reason, _operator()),
        lambda c: f"{c.controls.worker} paused (every replica within a second): {reason}",
    )


async def resume_worker(settings: Settings, args: argparse.Namespace) -> int:
    return await _act(
        settings,
        args,
        lambda conn, worker: resume_worker_recorded(conn, worker, _operator()),
        lambda c: (
            f"{c.controls.worker} resumed (paused by {c.previous['paused_by']}"
            f" since {c.previous['paused_at']})"
        ),
    )


async def throttle_worker(settings: Settings, args: argparse.Namespace) -> int:
    try:
        rate = parse_rate(args.per_second)
    except WorkerInputError as e:
        return fail(f"--per-second: {e}".replace("per_second ", ""), EXIT_USAGE)
    return await _act(
        settings,
        args,
        lambda conn, worker: throttle_worker_recorded(conn, worker, rate, _operator()),
        lambda c: f"{c.controls.worker} limited to {rate:g} messages per second",
    )


async def unthrottle_worker(settings: Settings, args: argparse.Namespace) -> int:
    return await _act(
        settings,
        args,
        lambda conn, worker: unthrottle_worker_recorded(conn, worker, _operator()),
        lambda c: (
            f"{c.controls.worker} rate limit lifted"
            f" (was {c.previous['rate_limit_per_second']:g} per second)"
        ),
    )
