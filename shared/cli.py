"""The `payhooks` console script: run a service, migrate the schema."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Sequence

from shared.config import ConfigError, Settings
from shared.logs import configure_logging
from shared.migrate import migrate

SERVICES = ("ingest", "orders", "bonuses", "email")

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="payhooks", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one service in the foreground")
    run.add_argument("service", choices=SERVICES)
    commands.add_parser("migrate", help="apply database migrations (safe to run concurrently)")
    return parser


def _settings(required: Sequence[str] = ()) -> Settings:
    try:
        return Settings.from_env(required=required)
    except ConfigError as e:
        print(f"payhooks: {e}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "run":
        # Imported by name so shared/ never imports services/ at module level.
        module = importlib.import_module(f"services.{args.service}.app")
        settings = _settings(module.REQUIRED_ENV)
        configure_logging(settings.log_level)
        module.main(settings)
    elif args.command == "migrate":
        settings = _settings()
        configure_logging(settings.log_level)
        try:
            applied = asyncio.run(migrate(settings.database_url))
        except OSError as e:
            print(f"payhooks: cannot reach PostgreSQL: {e}", file=sys.stderr)
            raise SystemExit(EXIT_UNREACHABLE) from None
        print(f"migrations applied: {', '.join(applied) or 'none (schema is current)'}")
    sys.exit(EXIT_OK)
