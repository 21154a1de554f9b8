"""The `payhooks` console script (reads ./.env first): run, migrate, send, operator commands.
Exit codes: 0 ok, 1 nothing matched (send: answered other than 2xx), 2 usage or configuration,
3 PostgreSQL, RabbitMQ or ingest unreachable, 4 conflicting order (resolve: a forbidden move
without --force, or no change), 5 DLQ busy or (resolve) a payment's event in flight: try again."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from dotenv import load_dotenv

from services.cli import (
    archive,
    audit,
    commands,
    erase,
    events,
    migrations,
    replay,
    resolve,
    run_all,
    send,
    workers,
)
from services.cli.registry import SERVICES
from services.sim import run as sim_run
from shared.config import ConfigError, Settings
from shared.errors import EXIT_BROKEN_PIPE, EXIT_BUSY, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from shared.migrate import MigrationChangedError, migrate
from shared.ops import dlq, dlq_lock
from shared.ops.connections import UnreachableError
from shared.ops.dlq import QUEUES
from shared.ops.dlq_moves import UnroutableError
from shared.process.logs import configure_logging
from shared.process.service import serve

T = TypeVar("T")

Command = Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="payhooks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"payhooks {_version()}")
    subcommands = parser.add_subparsers(dest="command", required=True)
    run = subcommands.add_parser(
        "run", help="run one service in the foreground, or `all` of them as separate processes"
    )
    run.add_argument("service", choices=(*SERVICES, "all"))
    run.add_argument(
        "--replicas",
        type=_replicas,
        default=1,
        help="with `all`: copies of every service, each on its ports + 10 per copy [1]",
    )
    migrate_ = subcommands.add_parser(
        "migrate", help="apply database migrations (safe to run concurrently)"
    )
    migrate_.add_argument(
        "--status", action="store_true", help="list applied, pending and changed migrations"
    )
    migrate_.add_argument("--json", action="store_true", help="with --status")

    send_ = subcommands.add_parser(
        "send", help="send one signed X-Hub webhook to ingest and print request and answer"
    )
    send.add_arguments(send_)
    send_.set_defaults(handler=send.command)

    order = subcommands.add_parser("order", help="shop orders").add_subparsers(
        dest="subcommand", required=True
    )
    add = order.add_parser("add", help="register an order before its payment (idempotent)")
    for field in ("order-id", "payment-id", "user-id", "email", "amount", "currency"):
        add.add_argument(f"--{field}", required=True)
    add.add_argument("--json", action="store_true")
    add.set_defaults(handler=commands.order_add)
    resolve.add_resolve_arguments(
        order.add_parser("resolve", help="move an order by hand: an audited operator transition")
    )

    payment = subcommands.add_parser("payment", help="payments").add_subparsers(
        dest="subcommand", required=True
    )
    show = payment.add_parser("show", help="everything known about a payment")
    show.add_argument("payment_id")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=commands.payment_show)

    events.add_arguments(subcommands.add_parser("event", help="webhooks in the inbox"))
    archive.add_arguments(
        subcommands.add_parser("archive", help="the inbox's archived days (past RETENTION_DAYS)")
    )

    dlq = subcommands.add_parser("dlq", help="dead-letter queues").add_subparsers(
        dest="subcommand", required=True
    )
    dlq_list = dlq.add_parser("list", help="messages and oldest age per DLQ")
    dlq_list.add_argument("--json", action="store_true")
    dlq_list.set_defaults(handler=commands.dlq_list)
    dlq_show = dlq.add_parser("show", help="the messages of one DLQ (nothing is moved)")
    dlq_show.add_argument("queue", choices=QUEUES)
    dlq_show.add_argument("--provider", help="only letters from this provider's webhooks")
    dlq_show.add_argument("--limit", type=_positive, default=None)
    dlq_show.add_argument("--json", action="store_true")
    dlq_show.set_defaults(handler=commands.dlq_show)
    requeue = dlq.add_parser(
        "requeue", help="move messages back to their queue (confirmed before removed)"
    )
    requeue.add_argument("queue", choices=QUEUES)
    requeue.add_argument(
        "--id",
        action="extend",
        nargs="+",
        metavar="ID",
        help="message or event ids (--id A B, or --id A --id B)",
    )
    requeue.add_argument("--all", action="store_true", help="every message")
    requeue.add_argument("--reason", help="e.g. unknown_payment, retries_exhausted")
    requeue.add_argument("--event-type", help="e.g. payment.status_changed, order.paid")
    requeue.add_argument("--payment-id")
    requeue.add_argument("--provider", help="whose webhooks, e.g. xhub, standard")
    requeue.add_argument("--since", help="last failure at or after (ISO 8601)")
    requeue.add_argument("--until", help="last failure at or before (ISO 8601)")
    requeue.add_argument("--limit", type=_positive, default=None)
    requeue.add_argument("--dry-run", action="store_true", help="show what would move")
    requeue.add_argument("--json", action="store_true")
    requeue.set_defaults(handler=commands.dlq_requeue)
    purge = dlq.add_parser("purge", help="delete every message of one DLQ")
    purge.add_argument("queue", choices=QUEUES)
    purge.add_argument("--yes", action="store_true", help="really delete them")
    purge.add_argument("--json", action="store_true")
    purge.set_defaults(handler=commands.dlq_purge)

    unrouted = subcommands.add_parser(
        "unrouted", help="events no worker consumes (withdrawals, kyc, ...): look, never move"
    ).add_subparsers(dest="subcommand", required=True)
    unrouted_show = unrouted.add_parser(
        "show", help="how many, how old, which types, the first N (nothing is moved)"
    )
    unrouted_show.add_argument("--limit", type=_positive, default=20, help="list N (default 20)")
    unrouted_show.add_argument("--json", action="store_true")
    unrouted_show.set_defaults(handler=commands.unrouted_show)

    replay.add_arguments(
        subcommands.add_parser(
            "replay", help="send stored inbox events again to chosen workers (--dry-run first)"
        )
    )

    resolve.add_missing_arguments(
        subcommands.add_parser(
            "missing", help="undecided payments and refused event ids: ask the provider for them"
        )
    )

    audit.add_arguments(
        subcommands.add_parser("audit", help="operator actions, newest first: who did what"),
        _positive,
    )

    workers.add_arguments(
        subcommands.add_parser("worker", help="pause, resume or rate-limit a worker's replicas")
    )

    erase.add_arguments(
        subcommands.add_parser(
            "erase", help="erase a person's email address everywhere, keep the money (audited)"
        )
    )

    sim = subcommands.add_parser("sim", help="X-Hub simulator: fake payments API + signed webhooks")
    sim_run.add_arguments(sim)
    sim.set_defaults(handler=sim_run.command)
    return parser


def _positive(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _version() -> str:
    try:
        return metadata.version("payhooks")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except ConfigError as e:
        print(f"payhooks: {e}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def _migrating(work: Coroutine[Any, Any, T]) -> T:
    """Run migration work; one clear line and its exit code when PostgreSQL is unreachable
    or an applied migration has changed since."""
    try:
        return asyncio.run(work)
    except OSError as e:
        print(f"payhooks: cannot reach PostgreSQL: {e}", file=sys.stderr)
        sys.exit(EXIT_UNREACHABLE)
    except MigrationChangedError as e:
        print(f"payhooks: {e}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _replicas(raw: str) -> int:
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if not 1 <= count <= run_all.MAX_REPLICAS:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {run_all.MAX_REPLICAS}")
    return count


def main(argv: Sequence[str] | None = None) -> None:
    # A developer's local settings; variables already in the environment win (containers and
    # CI set theirs there and have no .env).
    if Path(".env").is_file():
        load_dotenv(".env", override=False)
    args = _parser().parse_args(argv)
    if args.command == "run" and args.service == "all":
        settings = _settings()  # every variable checked once, before anything starts
        _migrating(migrate(settings.database_url))
        sys.exit(run_all.main(replicas=args.replicas))
    if args.command == "run":
        if args.replicas != 1:
            sys.stderr.write(
                "payhooks: --replicas goes with `run all` (one service: run it again)\n"
            )
            sys.exit(EXIT_USAGE)
        serve(SERVICES[args.service])
        sys.exit(EXIT_OK)
    if args.command == "migrate":
        settings = _settings()
        configure_logging(settings.log_level, settings.log_format)
        sys.exit(_migrating(migrations.command(settings, args)))
    settings = _settings()
    configure_logging("WARNING", settings.log_format)
    # Connection failures are reported as one clear line (exit 3), not as library logs.
    for library in ("aio_pika", "aiormq"):
        logging.getLogger(library).setLevel(logging.CRITICAL)
    handler: Command = args.handler
    try:
        code = asyncio.run(handler(settings, args))
        sys.stdout.flush()  # here, where a reader gone away is caught, not at exit
        sys.exit(code)
    except BrokenPipeError:
        # `payhooks ... | head`: the reader has all it wanted. Quietly, as other tools end
        # then; stdout goes to /dev/null so the interpreter's last flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(EXIT_BROKEN_PIPE)
    except UnreachableError as e:
        print(f"payhooks: {e}", file=sys.stderr)
        sys.exit(EXIT_UNREACHABLE)
    except dlq_lock.DlqBusyError as e:
        print(f"payhooks: {e}", file=sys.stderr)
        sys.exit(EXIT_BUSY)
    except (dlq.MissingQueueError, UnroutableError) as e:
        print(f"payhooks: {e}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        # Messages held unacknowledged go back to their DLQ when the connection closes.
        print("payhooks: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
