"""`payhooks sim`: serve the fake payments API, register the scenario's orders, deliver its
signed webhooks to --ingest-url, print the summary (and with --check compare it with the
database), then keep the API up for --linger seconds so the reconciler can repair."""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from collections import Counter
from collections.abc import Sequence

import orjson

from services.sim import burst, scenario
from services.sim.api import PaymentBook, start_api
from services.sim.deliverer import TIMEOUT_S, Deliverer, playable_providers
from services.sim.summary import Summary, actual_effects, mismatches, summarize
from shared.config import ConfigError, Settings
from shared.db import create_pool
from shared.errors import EXIT_OK, EXIT_USAGE
from shared.ops import dlq
from shared.ops.connections import UnreachableError, broker
from shared.ops.console import table
from shared.providers import registry
from shared.queries import orders as orders_sql

EXIT_FAILED = 1  # some delivery ended FAILED
_CHECK_POLL_S = 0.5


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ingest-url", default=None, help="default http://127.0.0.1:INGEST_PORT")
    parser.add_argument("--api-host", default="127.0.0.1")
    parser.add_argument("--api-port", type=int, default=8090, help="fake payments API port")
    parser.add_argument(
        "--provider",
        "--providers",
        dest="providers",
        type=_providers,
        default=(registry.DEFAULT.name,),
        help=f"who sends the webhooks, comma-separated for a mixed storm (payments dealt"
        f" round-robin), of {', '.join(playable_providers())} (default %(default)s)",
    )
    parser.add_argument(
        "--payments", type=int, default=100, help="in all, split among the providers"
    )
    parser.add_argument("--duplicates", type=float, default=0.1, help="duplicate rate 0-1")
    parser.add_argument("--reorder", type=float, default=0.2, help="reorder rate 0-1")
    parser.add_argument(
        "--lost", type=float, default=0.05, help="share of webhooks never sent, 0-1 (any of them)"
    )
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--merchants", type=int, default=3)
    parser.add_argument(
        "--flows",
        type=_flows,
        default=None,
        help=f"weights of {', '.join(scenario.FLOWS)} (default 1 each), e.g. paid=2,settled=1",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--time-scale", type=float, default=1.0, help="divides every delay")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="per-attempt seconds")
    parser.add_argument("--linger", type=float, default=0.0, help="keep the API up N seconds")
    parser.add_argument(
        "--check",
        action="store_true",
        help="after --linger, compare every payment with what payhooks did (exit 1 if any differs)",
    )
    parser.add_argument(
        "--check-timeout",
        type=float,
        default=30.0,
        help="with --check: seconds to wait for the workers to settle before a mismatch counts",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--burst",
        action="store_true",
        help="every merchant's breaker starts open (as after an outage): all deliveries are held,"
        " then released at once when its probe passes; prints the burst's figures",
    )


def _providers(raw: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    unknown = [n for n in names if n not in playable_providers()]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"must be some of {', '.join(playable_providers())}; unknown: {', '.join(unknown)}"
        )
    return names


def sim_keys(settings: Settings, providers: Sequence[str]) -> dict[str, bytes] | str:
    """The key each provider signs with (its first configured secret, as a sender signs with
    the newest), or what is missing."""
    keys = {}
    for name in providers:
        secrets = settings.provider_secrets.get(name) or ()
        if not secrets:
            return f"{registry.BY_NAME[name].secrets_variable} is required for --provider {name}"
        keys[name] = secrets[0]
    return keys


def _flows(raw: str) -> dict[str, float]:
    try:
        pairs = [part.split("=", 1) for part in raw.split(",") if part.strip()]
        return {name.strip(): float(weight) for name, weight in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError("must look like paid=2,settled=1,expired=1") from None


async def command(settings: Settings, args: argparse.Namespace) -> int:
    """The `payhooks sim` handler (services.cli.main's Command signature)."""
    providers: tuple[str, ...] = getattr(args, "providers", (registry.DEFAULT.name,))
    # X-Hub's secret is ingest's own requirement; the API key only for a provider with an API.
    if not settings.webhook_secrets or (
        not settings.xhub_api_key and any(registry.has_payment_api(p) for p in providers)
    ):
        _err("payhooks sim: XHUB_WEBHOOK_SECRETS and XHUB_API_KEY are required")
        return EXIT_USAGE
    keys = sim_keys(settings, providers)
    if isinstance(keys, str):
        _err(f"payhooks sim: {keys}")
        return EXIT_USAGE
    try:
        config = scenario.ScenarioConfig(
            payments=args.payments,
            duplicate_rate=args.duplicates,
            reorder_rate=args.reorder,
            lost_rate=args.lost,
            concurrency=args.concurrency,
            merchants=args.merchants,
            seed=args.seed,
            prefix=f"sim{int(time.time())}",  # a re-run (even with --seed) gets fresh ids
            providers=providers,
            **({"flows": args.flows} if args.flows else {}),
        )
    except ValueError as e:
        _err(f"payhooks sim: {e}")
        return EXIT_USAGE
    ingest_url = args.ingest_url or f"http://127.0.0.1:{settings.ingest_port}"
    plan = scenario.generate(config)
    book = PaymentBook()
    scenario.publish_to_api(plan, book)
    api_key = settings.xhub_api_key or secrets.token_hex(16)  # no API provider: never asked
    # Other providers' API keys (STRIPE_API_KEY), as the reconciler sends them.
    api_keys = {name: key for name, (_, key) in settings.provider_apis.items()}
    runner, api_url = await start_api(book, api_key, args.api_host, args.api_port, api_keys)
    try:
        _err(f"payhooks sim: payments API at {api_url}")
        pool = await create_pool(settings.database_url)
        try:
            await scenario.register_orders(pool, plan.payments)
        finally:
            await pool.close()
        async with Deliverer(
            ingest_url,
            settings.webhook_secrets[0],
            keys=keys,
            time_scale=args.time_scale,
            timeout_s=args.timeout,
            concurrency=config.concurrency,
            breakers_open=args.burst,
        ) as deliverer:
            records = await scenario.deliver(plan, deliverer)
        summary = summarize(records, plan.payments, settings.bonus_points)
        if args.json:
            _out(orjson.dumps(summary.as_json(), option=orjson.OPT_INDENT_2).decode())
        else:
            _out(summary.render())
        released = burst.figures(records)
        if args.burst:
            _err(released.render())
        if args.linger > 0:
            _err(f"payhooks sim: API up for {args.linger:g} s more")
            await asyncio.sleep(args.linger)
        problems: dict[str, str] = {}
        if args.check:
            payment_ids = [p.payment_id for p in plan.payments]
            problems = await _check(settings, summary, payment_ids, args.check_timeout)
    finally:
        await runner.cleanup()
    failed = summary.counts().get("FAILED", 0) or problems
    failed = failed or (args.burst and not released.all_answered_200_in_budget)
    return EXIT_FAILED if failed else EXIT_OK


async def _check(
    settings: Settings, summary: Summary, payment_ids: list[str], timeout_s: float
) -> dict[str, str]:
    """Compare every payment with what payhooks did, print the mismatches, the `check:` line
    and a table of the outcome; return the mismatches. Effects trail the webhooks (queues,
    retries, reconciliation), so a mismatch counts only if it outlasts `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    pool = await create_pool(settings.database_url)
    try:
        while True:
            actual = await actual_effects(pool, payment_ids)
            problems = mismatches(summary.expectations, actual)
            if not problems or time.monotonic() >= deadline:
                break
            await asyncio.sleep(_CHECK_POLL_S)
        repairs = await orders_sql.reconciled_transitions(pool, payment_ids)
    finally:
        await pool.close()
    for payment_id, why in sorted(problems.items()):
        _out(f"MISMATCH {payment_id}: {why}")
    states = dict(sorted(Counter(a["status"] for a in actual.values()).items()))
    points = sum(a["bonus"] for a in actual.values())
    emails = Counter(template for a in actual.values() for template in a["emails"])
    _out(
        f"check: {len(payment_ids) - len(problems)}/{len(payment_ids)} payments as expected;"
        f" final states {states}; bonus points {points}; emails {emails.total()}"
    )
    providers = {e.payment_id: e.provider for e in summary.expectations}
    if len(set(providers.values())) > 1:
        right = Counter(providers[p] for p in payment_ids if p not in problems)
        every = Counter(providers[p] for p in payment_ids)
        _out(
            "check per provider: "
            + ", ".join(f"{name} {right[name]}/{n}" for name, n in sorted(every.items()))
        )
    try:
        async with broker(settings) as (channel, topology):
            dead = {work.dlq: await dlq.depth(channel, work.dlq) for work in topology.work.values()}
        dead_letters = ", ".join(
            f"{queue.removeprefix(settings.amqp_prefix)} {count}" for queue, count in dead.items()
        )
    except UnreachableError as e:
        dead_letters = str(e)
    counts = summary.counts()
    _out("")
    table(
        ["outcome", "value"],
        [
            ["payments", f"{len(payment_ids)} ({len(payment_ids) - len(problems)} as expected)"],
            ["final states", ", ".join(f"{k} {v}" for k, v in states.items())],
            ["bonus points", f"{points:,} net"],
            ["emails", ", ".join(f"{k} {v}" for k, v in sorted(emails.items())) or "0"],
            [
                "lost webhooks",
                f"{counts.get('LOST', 0)} ({counts['needs_repair']} payments left for"
                " the reconciler)",
            ],
            ["repairs", f"{repairs} transitions made by the reconciler (lost webhooks)"],
            ["dead letters", dead_letters],
        ],
        out=sys.stdout,
    )
    return problems


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.sim", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except ConfigError as e:
        _err(f"payhooks sim: {e}")
        sys.exit(EXIT_USAGE)
    sys.exit(asyncio.run(command(settings, args)))
