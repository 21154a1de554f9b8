"""`payhooks archive list` and `archive show`: the inbox's archived days (shared/ops/archive.py)
with each file checked against its record, and one archived webhook as it was received."""

from __future__ import annotations

import argparse
import sys

import orjson

from services.cli.failure import fail
from shared.config import Settings
from shared.errors import EXIT_NOTHING, EXIT_OK, EXIT_USAGE
from shared.ops import archive
from shared.ops.archive_files import ArchiveCorruptError
from shared.ops.connections import database
from shared.ops.console import table

COLUMNS = ["file", "from", "to", "rows", "checksum"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="subcommand", required=True)
    listing = sub.add_parser("list", help="the archives, each file's checksum and rows checked")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=archive_list)
    show = sub.add_parser("show", help="one archived webhook: its columns and original body")
    show.add_argument("event_id")
    show.add_argument("--provider", default=None, help="whose event (default: any provider)")
    out = show.add_mutually_exclusive_group()
    out.add_argument(
        "--raw", action="store_true", help="write the original body's exact bytes, nothing else"
    )
    out.add_argument("--json", action="store_true")
    show.set_defaults(handler=archive_show)


async def archive_list(settings: Settings, args: argparse.Namespace) -> int:
    """0: every archive checks out (or there are none); 1: a file is missing or corrupt;
    2: ARCHIVE_DIR not set."""
    if settings.archive_dir is None:
        return fail("ARCHIVE_DIR is not set: no archive can be read", EXIT_USAGE)
    async with database(settings) as conn:
        checks = await archive.checked(conn, settings.archive_dir)
    if args.json:
        answer = {"archives": [c.as_json() for c in checks]}
        print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
    else:
        rows = [
            [
                c.file_name,
                c.range_from.isoformat(),
                c.range_to.isoformat(),
                c.rows,
                "ok" if c.problem is None else "BAD",
            ]
            for c in checks
        ]
        if rows:
            table(COLUMNS, rows)
            print()
        print(f"{len(checks)} archive(s)")
    bad = [c for c in checks if c.problem is not None]
    for c in bad:
        print(f"payhooks: archive {c.problem}", file=sys.stderr)
    return EXIT_NOTHING if bad else EXIT_OK


async def archive_show(settings: Settings, args: argparse.Namespace) -> int:
    """0: found (its file checked first); 1: in no archive, or its archive is corrupt;
    2: ARCHIVE_DIR not set."""
    if settings.archive_dir is None:
        return fail("ARCHIVE_DIR is not set: no archive can be read", EXIT_USAGE)
    async with database(settings) as conn:
        try:
            file_name, event = await archive.find_event(
                conn, settings.archive_dir, args.event_id, args.provider
            )
        except ArchiveCorruptError as e:
            return fail(f"archive {e}", EXIT_NOTHING)
        except archive.EventNotArchivedError:
            return fail(f"event {args.event_id} is in no archive", EXIT_NOTHING)
    body: bytes = event.pop("body")
    if args.raw:
        sys.stdout.buffer.write(body)
        sys.stdout.buffer.flush()
        return EXIT_OK
    view = {
        **{k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in event.items()},
        "archive": file_name,
        "body": body.decode("utf-8", "replace"),
    }
    if args.json:
        print(orjson.dumps(view, option=orjson.OPT_INDENT_2).decode())
        return EXIT_OK
    print(
        f"event {view['event_id']}  {view['event_type']}  payment {view['payment_id'] or '-'}"
        f"  provider {view['provider']}  received {view['received_at']}"
        f"  duplicates {view['duplicates']}\narchive: {file_name}"
    )
    print("\nheaders:")
    table(["header", "value"], sorted(view["headers"].items()))
    print(f"\nbody ({len(body)} bytes; --raw writes them exactly):")
    print(view["body"])
    return EXIT_OK
