"""Replay from the inbox (`payhooks replay`, shared/ops/replay.py): a dry run counts per worker
what the real run then sends and what each worker skips; replayed effects stay exactly once;
`--reprocess` applies what a worker marked processed without taking effect, and never sends an
email twice; an event of a type no worker took is replayed once a release binds the type.

Real PostgreSQL, RabbitMQ and an aiosmtpd server; the services run as their own aiohttp apps,
the CLI as a process of its own."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aio_pika.abc import AbstractChannel
from structlog.testing import capture_logs

from shared.amqp import topology as topology_module
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.ops.operator_actions import Edge, Operator, replay_recorded
from shared.ops.replay_selection import ReplayRequest
from shared.process.web import REGISTRY
from shared.queries import inbox as inbox_sql
from shared.xhub import PROVIDER
from tests.conftest import SmtpSink
from tests.helpers import eventually, payment_event
from tests.integration.system import (
    System,
    effects,
    post,
    quiescent,
    register,
    smtp_counts,
    smtp_messages,
    start_system,
    system_settings,
)
from tests.integration.test_cli_operators import cli_env, run_payhooks
from tests.integration.test_dlq import new_id

# The worker label of each queue's service on payhooks_messages_processed_total.
LABEL = {"orders": "orders", "bonuses": "bonuses", "emails": "email"}
SERVICE = {"orders": "orders", "bonuses": "bonuses", "emails": "email"}
ALL_WORKERS = ("--worker", "orders", "--worker", "bonuses", "--worker", "emails")


@pytest.fixture
async def system(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    amqp: AbstractChannel,
    topology: Topology,
    db: Any,
) -> System:
    settings = system_settings(make_settings, smtp[1])
    return await start_system(aiohttp_client, settings, amqp, topology)


@pytest.fixture
def cli(settings: Settings) -> dict[str, str]:
    return cli_env(settings, USER="ann")


def outcomes(system: System, queue: str) -> dict[str, int]:
    """What the worker of `queue` finished, by outcome, over all its instances."""
    counts: dict[str, int] = {}
    for client in system.clients[SERVICE[queue]]:
        registry = client.app[REGISTRY]
        for outcome in ("ok", "skipped_duplicate", "parked", "dead_lettered"):
            value = registry.get_sample_value(
                "payhooks_messages_processed_total", {"worker": LABEL[queue], "outcome": outcome}
            )
            counts[outcome] = counts.get(outcome, 0) + int(value or 0)
    return counts


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


async def lost_event(db: Any, payment_id: str, status: str = "paid", **extra: Any) -> str:
    """An event stored in the inbox that never reached a worker (its publish lost, and no
    sweeper will find it): what only a replay brings to the orders worker."""
    event_id = new_id("evt")
    payload = payment_event(payment_id, status) | extra
    [stored] = await inbox_sql.store_batch(
        db,
        PROVIDER,
        [inbox_sql.InboxEntry(event_id, payload["event"], payment_id, orjson.dumps(payload), {})],
    )
    await db.execute("DELETE FROM inbox_unpublished WHERE id = $1", stored.id)
    return event_id


async def replay(cli: dict[str, str], *args: str) -> dict[str, Any]:
    run = await run_payhooks(cli, "replay", *args, "--json")
    assert run.code == 0, (run.code, run.out, run.err)
    answer: dict[str, Any] = run.json()
    return answer


def counts(answer: dict[str, Any], key: str) -> dict[str, int]:
    return {worker: c[key] for worker, c in answer["workers"].items()}


async def test_a_dry_run_counts_what_the_real_run_sends_and_each_worker_skips(
    system: System, cli: dict[str, str], db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    """Two payments paid and done, one whose event was stored and lost: a replay of the three
    to every worker sends each worker what the dry run counted; the processed ones are
    skipped as the dry run said (no second grant, no second email), the lost one takes
    effect once."""
    done, lost = [new_id("pay"), new_id("pay")], new_id("pay")
    for payment_id in [*done, lost]:
        await register(db, payment_id)
    for payment_id in done:
        await post(system.ingest, payment_event(payment_id, "paid"))
    await quiescent(db, system)
    await lost_event(db, lost)

    async def both(*flags: str) -> tuple[dict[str, Any], dict[str, Any]]:
        dry = await replay(cli, "--event-type", "payment.status_changed", *flags, "--dry-run")
        before = {q: outcomes(system, q) for q in LABEL}
        real = await replay(cli, "--event-type", "payment.status_changed", *flags)
        return dry, real | {"_before": before}

    dry, real = await both(*ALL_WORKERS)

    assert dry["dry_run"]
    assert not real["dry_run"]
    assert dry["events"] == real["events"] == 3
    assert counts(dry, "messages") == {"orders": 3, "bonuses": 2, "emails": 2}
    assert counts(dry, "would_skip") == {"orders": 2, "bonuses": 2, "emails": 2}
    assert counts(dry, "published") == {"orders": 0, "bonuses": 0, "emails": 0}
    assert counts(real, "messages") == counts(dry, "messages")
    assert counts(real, "would_skip") == counts(dry, "would_skip")
    assert counts(real, "published") == counts(dry, "messages")

    # What the workers then did: the replayed copies skipped as counted, the lost event
    # applied (its transition reaching bonuses and emails through the outbox as usual).
    before = real["_before"]

    async def finished() -> dict[str, dict[str, int]]:
        return {q: grown(before[q], outcomes(system, q)) for q in LABEL}

    expected = {
        "orders": {"skipped_duplicate": 2, "ok": 1},
        "bonuses": {"skipped_duplicate": 2, "ok": 1},
        "emails": {"skipped_duplicate": 2, "ok": 1},
    }
    await eventually(finished, lambda f: f == expected, timeout_s=20)
    for queue, did in expected.items():
        assert did["skipped_duplicate"] == dry["workers"][queue]["would_skip"], queue
    for payment_id in [*done, lost]:
        assert await effects(db, payment_id) == {
            "status": "PAID",
            "bonus": 500,
            "ledger": ["grant"],
            "emails": ["payment_succeeded"],
        }
        assert smtp_messages(smtp[0], payment_id) == ["payment_succeeded"]

    # Once more, now that all three are done: everything is skipped, nothing changes.
    mark = {q: outcomes(system, q) for q in LABEL}
    again = await replay(cli, "--event-type", "payment.status_changed", *ALL_WORKERS)
    assert counts(again, "would_skip") == {"orders": 3, "bonuses": 3, "emails": 3}
    await eventually(
        lambda: _finished_since(system, mark),
        lambda f: f == {q: {"skipped_duplicate": 3} for q in LABEL},
        timeout_s=20,
    )
    assert set(smtp_counts(smtp[0]).values()) == {1}
    assert len(smtp[0].messages) == 3
    rows = await db.fetch(
        "SELECT actor, source, action, target, count, filter FROM operator_actions ORDER BY id"
    )
    assert [(r["actor"], r["source"], r["action"], r["count"]) for r in rows] == [
        ("cli:ann", "cli", "event.replay", 7),
        ("cli:ann", "cli", "event.replay", 9),
    ]
    assert rows[0]["target"] == "orders,bonuses,emails"
    assert rows[0]["filter"]["event_type"] == "payment.status_changed"
    assert rows[0]["filter"]["workers"]["orders"]["would_skip"] == 2


async def _finished_since(system: System, mark: dict[str, dict[str, int]]) -> dict[str, Any]:
    return {q: grown(mark[q], outcomes(system, q)) for q in LABEL}


async def test_reprocess_applies_what_was_marked_without_effect_and_never_sends_twice(
    system: System, cli: dict[str, str], db: Any, smtp: tuple[SmtpSink, int]
) -> None:
    """A bad deploy marked an event processed without applying it: a plain replay skips it
    (the mark), `--reprocess --reason` applies it, with its grant and its one email; a
    second reprocess of everything, to every worker, changes nothing and sends nothing."""
    good, acked = new_id("pay"), new_id("pay")
    for payment_id in (good, acked):
        await register(db, payment_id)
    await post(system.ingest, payment_event(good, "paid"))
    await quiescent(db, system)
    lost = await lost_event(db, acked)
    await db.execute(
        "INSERT INTO processed_events (worker, event_id, outcome) VALUES ('orders', $1, 'applied')",
        lost,
    )

    mark = {q: outcomes(system, q) for q in LABEL}
    plain = await replay(cli, "--payment-id", acked)
    assert counts(plain, "would_skip") == {"orders": 1}
    await eventually(
        lambda: _finished_since(system, mark),
        lambda f: f["orders"] == {"skipped_duplicate": 1},
    )
    assert (await effects(db, acked))["status"] == "PENDING"

    refused = await run_payhooks(cli, "replay", "--payment-id", acked, "--reprocess")
    assert refused.code == 2
    assert "--reason" in refused.err

    dry = await replay(
        cli, "--payment-id", acked, "--reprocess", "--reason", "deploy 41 acked", "--dry-run"
    )
    assert dry["workers"]["orders"] == {
        "messages": 1,
        "already_processed": 1,
        "would_skip": 0,
        "not_stored": 0,
        "published": 0,
    }
    mark = {q: outcomes(system, q) for q in LABEL}
    with capture_logs() as logs:
        fixed = await replay(
            cli, "--payment-id", acked, "--reprocess", "--reason", "deploy 41 acked"
        )
        assert counts(fixed, "published") == {"orders": 1}
        await eventually(
            lambda: _finished_since(system, mark),
            lambda f: f == {q: {"ok": 1} for q in LABEL},
            timeout_s=20,
        )
    reprocessed = [e for e in logs if e["event"] == "message.reprocessed"]
    assert [(e["worker"], e["message_id"], e["replay"]) for e in reprocessed] == [
        ("orders", lost, fixed["replay_id"])
    ]
    assert await effects(db, acked) == {
        "status": "PAID",
        "bonus": 500,
        "ledger": ["grant"],
        "emails": ["payment_succeeded"],
    }
    assert smtp_messages(smtp[0], acked) == ["payment_succeeded"]

    # Everything reprocessed, by every worker: the order machine moves nothing (PAID stays
    # PAID), the ledger has its entries, and the email's (payment, template) key refuses.
    transitions = await db.fetchval("SELECT count(*) FROM order_transitions")
    marks = await db.fetchval("SELECT count(*) FROM processed_events")
    flags = ("--event-type", "payment.status_changed", *ALL_WORKERS)
    dry = await replay(cli, *flags, "--reprocess", "--reason", "check", "--dry-run")
    assert counts(dry, "would_skip") == {"orders": 0, "bonuses": 0, "emails": 2}
    mark = {q: outcomes(system, q) for q in LABEL}
    again = await replay(cli, *flags, "--reprocess", "--reason", "check")
    assert counts(again, "published") == {"orders": 2, "bonuses": 2, "emails": 2}
    await eventually(
        lambda: _finished_since(system, mark),
        lambda f: (
            f == {"orders": {"ok": 2}, "bonuses": {"ok": 2}, "emails": {"skipped_duplicate": 2}}
        ),
        timeout_s=20,
    )
    assert await db.fetchval("SELECT count(*) FROM order_transitions") == transitions
    assert await db.fetchval("SELECT count(*) FROM processed_events") == marks
    for payment_id in (good, acked):
        assert (await effects(db, payment_id))["ledger"] == ["grant"]
        assert smtp_messages(smtp[0], payment_id) == ["payment_succeeded"]
    assert len(smtp[0].messages) == 2
    [row] = await db.fetch(
        "SELECT filter FROM operator_actions WHERE filter->>'reason' = 'deploy 41 acked'"
    )
    assert row["filter"]["reprocess"] is True


@contextlib.asynccontextmanager
async def _opened(channel: AbstractChannel) -> AsyncIterator[AbstractChannel]:
    yield channel


async def test_an_event_of_a_type_no_worker_took_is_replayed_once_a_release_binds_it(
    system: System,
    db: Any,
    channel: AbstractChannel,
    topology: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """withdrawal.status_changed goes to `unrouted` (no binding) and stays in the inbox. A
    replay says no worker takes it; once BINDINGS routes the type (a release: simulated here
    in this process, which is where the replay decides), the same replay sends it to the
    orders worker, which takes it like any event of its queue."""
    payment_id = new_id("pay")
    await register(db, payment_id)
    event = payment_event(payment_id, "completed") | {"event": "withdrawal.status_changed"}
    answered = await post(system.ingest, event)
    assert answered["status"] == "accepted"
    request = ReplayRequest.parse(event_type="withdrawal.status_changed")
    by = Operator("test", Edge.CLI)

    async def run(dry_run: bool) -> dict[str, Any]:
        done = await replay_recorded(
            db, lambda: _opened(channel), topology, request, by, db, dry_run=dry_run
        )
        return done.as_json()

    before = await run(dry_run=True)
    assert before["events"] == 1
    assert before["workers"] == {}
    assert before["no_route"] == {"withdrawal.status_changed": 1}

    bindings = dict(topology_module.BINDINGS)
    bindings["orders"] = (*bindings["orders"], "withdrawal.*")
    monkeypatch.setattr(topology_module, "BINDINGS", bindings)
    dry = await run(dry_run=True)
    assert counts(dry, "messages") == {"orders": 1}
    assert counts(dry, "would_skip") == {"orders": 0}
    assert dry["no_route"] == {}
    real = await run(dry_run=False)
    assert counts(real, "published") == {"orders": 1}

    [event_id] = await db.fetch(
        "SELECT event_id FROM inbox WHERE event_type = 'withdrawal.status_changed'"
    )
    marked = await eventually(
        lambda: db.fetchval(
            "SELECT outcome FROM processed_events WHERE worker = 'orders' AND event_id = $1",
            event_id["event_id"],
        ),
        lambda outcome: outcome is not None,
    )
    assert marked  # decided by the orders worker (what it decides is its rules' business)
    [row] = await db.fetch("SELECT action, ids, count FROM operator_actions")
    assert (row["action"], list(row["ids"]), row["count"]) == (
        "event.replay",
        [event_id["event_id"]],
        1,
    )
