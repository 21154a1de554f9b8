"""`payhooks migrate`: apply the schema, or with --status list what is applied (and when),
what is pending, and what changed after it was applied."""

from __future__ import annotations

import argparse
from typing import Any

import orjson

from shared import migrate
from shared.config import Settings
from shared.errors import EXIT_OK, EXIT_USAGE
from shared.ops.console import table

_NOTES = {
    migrate.CHANGED: "changed after it was applied: `payhooks migrate` refuses to run until the"
    " file is restored (put the change in a new migration)",
    migrate.UNRECORDED: "applied before payhooks kept checksums: the next `payhooks migrate`"
    " records the file's checksum as it is now",
    migrate.NO_FILE: "applied, but this payhooks has no such file (applied by a newer version?)",
}


async def command(settings: Settings, args: argparse.Namespace) -> int:
    if args.status:
        return await _status(settings, args)
    result = await migrate.run_migrations(settings.database_url)
    print(f"migrations applied: {', '.join(result.applied) or 'none (schema is current)'}")
    if result.checksums_recorded:
        print(
            "checksums recorded for migrations applied before payhooks kept them: "
            + ", ".join(result.checksums_recorded)
        )
    return EXIT_OK


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    found = await migrate.status(settings.database_url)
    changed = [m.name for m in found if m.state == migrate.CHANGED]
    counts = {state: sum(m.state == state for m in found) for state in _ORDER}
    if args.json:
        shown: dict[str, Any] = {
            "migrations": [
                {
                    "version": m.version,
                    "name": m.name,
                    "state": m.state,
                    "applied_at": _when(m),
                }
                for m in found
            ],
            "pending": [m.name for m in found if m.state == migrate.PENDING],
            "changed": changed,
        }
        print(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode())
    else:
        table(
            ["version", "migration", "state", "applied_at"],
            [[m.version, m.name, m.state, _when(m)] for m in found],
        )
        summary = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
        pending = counts[migrate.PENDING] and not changed
        print(f"\n{summary}" + ("; `payhooks migrate` applies the pending" if pending else ""))
        for m in found:
            if m.state in _NOTES:
                print(f"{m.name}: {_NOTES[m.state]}")
    # A changed migration fails the check (a deploy pipeline can gate on it); pending does not.
    return EXIT_USAGE if changed else EXIT_OK


def _when(m: migrate.MigrationState) -> str | None:
    return m.applied_at.isoformat(timespec="seconds") if m.applied_at else None


_ORDER = (migrate.APPLIED, migrate.UNRECORDED, migrate.CHANGED, migrate.NO_FILE, migrate.PENDING)
