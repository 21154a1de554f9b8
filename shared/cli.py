"""The `payhooks` console script: run a service, migrate the schema."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Sequence

import asyncpg
import orjson

from shared import queries
from shared.config import ConfigError, Settings
from shared.logs import configure_logging
from shared.migrate import migrate
from shared.orders import OrderValidationError, order_json, parse_new_order

SERVICES = ("ingest", "orders", "bonuses", "email", "api")

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_CONFLICT = 4


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="payhooks", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one service in the foreground")
    run.add_argument("service", choices=SERVICES)
    commands.add_parser("migrate", help="apply database migrations (safe to run concurrently)")
    order = commands.add_parser("order", help="shop orders").add_subparsers(
        dest="order_command", required=True
    )
    add = order.add_parser("add", help="register an order before its payment (idempotent)")
    for field in ("order-id", "payment-id", "user-id", "email", "amount", "currency"):
        add.add_argument(f"--{field}", required=True)
    add.add_argument("--json", action="store_true", help="print the order as JSON")
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
    elif args.command == "order":
        settings = _settings()
        configure_logging("WARNING")
        sys.exit(asyncio.run(_order_add(settings, args)))
    sys.exit(EXIT_OK)


async def _order_add(settings: Settings, args: argparse.Namespace) -> int:
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
    try:
        conn = await asyncpg.connect(settings.database_url, timeout=5)
    except (OSError, asyncpg.PostgresError) as e:
        print(f"payhooks: cannot reach PostgreSQL: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    try:
        row, created = await queries.register_order(conn, order)
    except queries.OrderConflictError as e:
        print(f"payhooks: {e}", file=sys.stderr)
        return EXIT_CONFLICT
    except asyncpg.UndefinedTableError:
        print("payhooks: the schema is missing: run `payhooks migrate` first", file=sys.stderr)
        return EXIT_UNREACHABLE
    finally:
        await conn.close()
    shown = order_json(row)
    if args.json:
        print(orjson.dumps(shown).decode())
    else:
        verb = "registered" if created else "already registered"
        print(
            f"order {shown['order_id']} {verb}: payment {shown['payment_id']},"
            f" {shown['amount']} {shown['currency']}, status {shown['status']}"
        )
    return EXIT_OK
