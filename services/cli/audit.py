"""`payhooks audit`: the operator actions (requeues, purges, order registrations), newest
first, as `GET /api/audit` gives them, straight from PostgreSQL."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import orjson

from shared.config import Settings
from shared.errors import EXIT_NOTHING, EXIT_OK
from shared.ops.connections import database
from shared.ops.console import table
from shared.queries import audit

COLUMNS = ["at", "actor", "source", "action", "target", "count"]


def add_arguments(parser: argparse.ArgumentParser, positive: Callable[[str], int]) -> None:
    parser.add_argument(
        "--limit", type=positive, default=audit.DEFAULT_LIMIT, help="the newest N (default 100)"
    )
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=command)


async def command(settings: Settings, args: argparse.Namespace) -> int:
    async with database(settings) as conn:
        actions = await audit.page(conn, min(args.limit, audit.MAX_LIMIT), None)
    if args.json:
        print(orjson.dumps({"actions": actions}, option=orjson.OPT_INDENT_2).decode())
    else:
        table(COLUMNS, [[a[c] for c in COLUMNS] for a in actions])
        for a in actions:
            if a["ids"] or a["filter"]:
                print(f"  #{a['id']} filter {orjson.dumps(a['filter']).decode()} ids {a['ids']}")
    return EXIT_OK if actions else EXIT_NOTHING
