"""`payhooks erase`: erase a person's data (shared/ops/erasure.py) straight in PostgreSQL,
through the same audited function as the api."""

from __future__ import annotations

import argparse

import orjson

from services.cli.failure import fail
from shared.config import Settings
from shared.errors import EXIT_NOTHING, EXIT_OK, EXIT_USAGE
from shared.ops import archive, erasure
from shared.ops.archive_files import ArchiveCorruptError
from shared.ops.connections import database
from shared.ops.operator_actions import Edge, Operator, erase_recorded
from shared.queries import audit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--email", metavar="ADDRESS", help="the person's email address")
    who.add_argument("--user", metavar="USER_ID", help="the shop's user id: its orders' addresses")
    who.add_argument("--order", metavar="ORDER_ID", help="an order id: its address")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=command)


async def command(settings: Settings, args: argparse.Namespace) -> int:
    """0: erased, or nothing left to erase of a known person (already erased); 1: an unknown
    user or order id, or an address held nowhere, or an archive found corrupt (nothing
    erased); 2: bad input, or archives recorded and ARCHIVE_DIR not set (nothing erased)."""
    try:
        selector = erasure.parse_selector(args.email, args.user, args.order)
    except erasure.ErasureInputError as e:
        return fail(str(e), EXIT_USAGE)
    by = Operator(audit.cli_actor(), Edge.CLI)
    async with database(settings) as conn:
        try:
            erased = await erase_recorded(conn, selector, by, settings.archive_dir)
        except erasure.PersonNotFoundError as e:
            return fail(str(e), EXIT_NOTHING)
        except ArchiveCorruptError as e:
            return fail(f"nothing erased: archive {e}", EXIT_NOTHING)
        except archive.ArchivesUnreachableError as e:
            return fail(f"nothing erased: {e}", EXIT_USAGE)
    answer = erased.as_json()
    if args.json:
        print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
    elif erased.changed:
        rows = ", ".join(f"{table} {n}" for table, n in erased.rows.items() if n)
        print(
            f"erased: {len(erased.orders)} order(s) {', '.join(erased.orders) or '-'};"
            f" rows changed: {rows}; the address is now {erasure.MARKER} (recorded)"
        )
    else:
        print("nothing to erase: no row holds this person's address (recorded)")
    found = erased.changed or erased.already_erased
    return EXIT_OK if found else EXIT_NOTHING
