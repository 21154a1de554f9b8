"""The operator console script as an on-call engineer runs it: `payhooks dlq ...`,
`payhooks payment show`, `payhooks order add`, against real PostgreSQL and RabbitMQ.

Exit codes: 0 ok, 1 nothing matched, 2 usage, 3 unreachable, 4 conflicting order, 5 DLQ busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import pty
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import orjson
import pytest
from aio_pika.abc import AbstractChannel, DeliveryMode

from services.cli import main as cli
from shared.amqp.topology import Topology, WorkQueue
from shared.config import Settings
from shared.ops import dlq_lock
from shared.vocabulary import ORIGINAL_QUEUE, REASON
from tests.conftest import TEST_AMQP_URL, SmtpSink
from tests.helpers import eventually, payment_event
from tests.integration.system import (
    System,
    depths,
    effects,
    post,
    register,
    smtp_messages,
    start_system,
    system_settings,
)
from tests.integration.test_dlq import (
    Letter,
    contents,
    ids,
    new_id,
    put_dead_letters,
    queue_ids,
    selection_letters,
)

REPO = Path(__file__).resolve().parents[2]
PAYHOOKS = Path(sys.executable).parent / "payhooks"
COMMAND_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return orjson.loads(self.out)


Payhooks = Callable[..., Any]


def cli_env(settings: Settings, **overrides: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "DATABASE_URL": settings.database_url,
        "AMQP_URL": settings.amqp_url,
        "AMQP_PREFIX": settings.amqp_prefix,
        **overrides,
    }


async def run_payhooks(env: dict[str, str], *args: str) -> Run:
    process = await asyncio.create_subprocess_exec(
        str(PAYHOOKS),
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(COMMAND_TIMEOUT_S):
        out, err = await process.communicate()
    assert process.returncode is not None
    return Run(process.returncode, out.decode(), err.decode())


@pytest.fixture
def payhooks(settings: Settings, channel: AbstractChannel, db: Any) -> Payhooks:
    """Run `payhooks ARGS...` against the test's database and queues."""
    env = cli_env(settings)

    async def run(*args: str) -> Run:
        return await run_payhooks(env, *args)

    return run


@pytest.fixture
def orders(topology: Topology) -> WorkQueue:
    return topology.work["orders"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # nothing listens on it once the socket is closed


# --- dlq list / show -----------------------------------------------------------------------


async def test_dlq_list_shows_every_dlq_with_its_count_and_oldest_age(
    payhooks: Payhooks, channel: AbstractChannel, topology: Topology
) -> None:
    an_hour_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    await put_dead_letters(
        channel,
        topology.work["orders"],
        [Letter(failed_at=an_hour_ago + dt.timedelta(minutes=30)), Letter(failed_at=an_hour_ago)],
    )
    await put_dead_letters(channel, topology.work["emails"], [Letter(failed_at=an_hour_ago)])

    human = await payhooks("dlq", "list")
    machine = await payhooks("dlq", "list", "--json")

    assert human.code == 0, human.err
    rows = {line.split()[0]: line.split()[1:] for line in human.out.splitlines()[1:]}
    assert {q: r[0] for q, r in rows.items()} == {
        topology.work["orders"].dlq: "2",
        topology.work["bonuses"].dlq: "0",
        topology.work["emails"].dlq: "1",
    }
    assert rows[topology.work["bonuses"].dlq][1] == "-"  # no age for an empty DLQ
    assert machine.code == 0, machine.err
    queues = {q["queue"]: q for q in machine.json()["queues"]}
    assert {q: v["messages"] for q, v in queues.items()} == {
        topology.work["orders"].dlq: 2,
        topology.work["bonuses"].dlq: 0,
        topology.work["emails"].dlq: 1,
    }
    assert 3600 <= queues[topology.work["orders"].dlq]["oldest_age_seconds"] < 3660
    assert queues[topology.work["bonuses"].dlq]["oldest_age_seconds"] is None


async def test_dlq_show_prints_each_message_and_leaves_them_in_place(
    payhooks: Payhooks, channel: AbstractChannel, orders: WorkQueue
) -> None:
    letters = [Letter(reason="unknown_payment"), Letter(reason="retries_exhausted")]
    await put_dead_letters(channel, orders, letters)

    human = await payhooks("dlq", "show", "orders")
    machine = await payhooks("dlq", "show", "orders", "--json")
    limited = await payhooks("dlq", "show", "orders", "--json", "--limit", "1")

    assert human.code == 0, human.err
    lines = human.out.splitlines()
    assert lines[0].split()[:4] == ["ID", "EVENT", "PAYMENT_ID", "REASON"]
    assert [line.split()[0] for line in lines[1:3]] == [x.id for x in letters]
    assert [line.split()[3] for line in lines[1:3]] == ["unknown_payment", "retries_exhausted"]
    assert "2 of 2 message(s) shown" in human.out
    assert machine.code == 0
    shown = machine.json()
    assert shown["total"] == 2
    assert [m["id"] for m in shown["messages"]] == [x.id for x in letters]
    assert shown["messages"][0]["payment_id"] == letters[0].payment_id
    assert shown["messages"][0]["original_queue"] == orders.name
    assert limited.code == 0
    assert [m["id"] for m in limited.json()["messages"]] == [letters[0].id]
    assert limited.json()["total"] == 2
    expected = {orders.dlq: [x.id for x in letters], orders.name: []}
    assert await queue_ids(channel, expected) == expected


async def test_dlq_show_of_an_empty_dlq_exits_0(payhooks: Payhooks) -> None:
    result = await payhooks("dlq", "show", "bonuses")
    machine = await payhooks("dlq", "show", "bonuses", "--json")

    assert result.code == 0, result.err  # it showed what is there: nothing
    assert "0 of 0" in result.out
    assert machine.code == 0
    assert machine.json() == {"messages": [], "total": 0}


# --- dlq requeue ---------------------------------------------------------------------------


async def test_dlq_requeue_by_id_moves_that_message_and_names_ids_not_found(
    payhooks: Payhooks, channel: AbstractChannel, orders: WorkQueue
) -> None:
    letters = [Letter(reason="unknown_payment"), Letter(), Letter()]
    await put_dead_letters(channel, orders, letters)

    result = await payhooks("dlq", "requeue", "orders", "--id", letters[1].id, "--id", "evt_gone")

    assert result.code == 0, result.err
    assert f"requeued {letters[1].id} (unknown_payment) -> {orders.name}" in result.out
    assert "requeued 1 message(s)" in result.out
    assert "not found: evt_gone" in result.err
    expected = {orders.name: [letters[1].id], orders.dlq: [letters[0].id, letters[2].id]}
    assert await queue_ids(channel, expected) == expected


async def test_dlq_requeue_takes_several_ids_after_one_flag(
    payhooks: Payhooks, channel: AbstractChannel, orders: WorkQueue
) -> None:
    # SPEC: `payhooks dlq requeue QUEUE (--id ID… | --all)`; --id stays repeatable too.
    a, b, c, d = (Letter() for _ in range(4))
    await put_dead_letters(channel, orders, [a, b, c, d])

    result = await payhooks(
        "dlq", "requeue", "orders", "--json", "--id", a.id, c.id, "evt_gone", "--id", d.id
    )

    assert result.code == 0, result.err
    assert (result.json()["ids"], result.json()["not_found"]) == ([a.id, c.id, d.id], ["evt_gone"])
    expected = {orders.name: [a.id, c.id, d.id], orders.dlq: [b.id]}
    assert await queue_ids(channel, expected) == expected


async def test_dlq_requeue_waits_for_another_reader_then_moves_everything(
    payhooks: Payhooks, channel: AbstractChannel, orders: WorkQueue
) -> None:
    letters = [Letter() for _ in range(3)]
    await put_dead_letters(channel, orders, letters)

    async with await aio_pika.connect(TEST_AMQP_URL) as other:
        holder = await other.channel()
        async with dlq_lock.reading(holder, orders.dlq):  # the api's monitor, say
            requeue = asyncio.create_task(payhooks("dlq", "requeue", "orders", "--all"))
            await asyncio.sleep(1.5)
            assert not requeue.done()

    result = await requeue
    assert result.code == 0, result.err
    assert "requeued 3 message(s)" in result.out
    expected = {orders.name: [x.id for x in letters], orders.dlq: []}
    assert await queue_ids(channel, expected) == expected


async def test_dlq_held_by_another_reader_past_the_wait_exits_5_not_unreachable(
    settings: Settings,
    channel: AbstractChannel,
    orders: WorkQueue,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The console script's own main(), in a thread (it runs its own event loop), so that the
    # 30 s wait can be shortened.
    letter = Letter()
    await put_dead_letters(channel, orders, [letter])
    for name, value in cli_env(settings).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(dlq_lock, "LOCK_WAIT_S", 0.5)
    monkeypatch.setattr(cli, "configure_logging", lambda *args: None)
    levels = {name: logging.getLogger(name).level for name in ("aio_pika", "aiormq")}

    try:
        async with await aio_pika.connect(TEST_AMQP_URL) as other:
            holder = await other.channel()
            async with dlq_lock.reading(holder, orders.dlq):
                with pytest.raises(SystemExit) as exit_:
                    await asyncio.to_thread(cli.main, ["dlq", "requeue", "orders", "--all"])
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)

    assert exit_.value.code == 5  # busy: try again later; 3 says something is down
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{orders.dlq} is busy" in err
    expected = {orders.dlq: [letter.id], orders.name: []}
    assert await queue_ids(channel, expected) == expected


@pytest.mark.parametrize(
    ("flags", "moved"),
    [
        (["--all"], "abc"),
        (["--reason", "retries_exhausted"], "b"),
        (["--event-type", "refund.completed"], "c"),
        (["--payment-id", "a"], "a"),
        (["--since", "2026-01-01T10:01:00Z", "--until", "2026-01-01T10:02:00Z"], "bc"),
        (["--reason", "unknown_payment", "--limit", "1"], "a"),
    ],
    ids=["all", "reason", "event type", "payment id", "time range", "limit"],
)
async def test_dlq_requeue_json_reports_exactly_what_moved(
    payhooks: Payhooks,
    channel: AbstractChannel,
    orders: WorkQueue,
    flags: list[str],
    moved: str,
) -> None:
    letters = selection_letters()
    await put_dead_letters(channel, orders, list(letters.values()))
    flags = [letters[f].payment_id if f in letters else f for f in flags]

    result = await payhooks("dlq", "requeue", "orders", "--json", *flags)

    moved_ids = [letters[n].id for n in moved]
    assert result.code == 0, result.err
    assert result.json() == {
        "requeued": len(moved),
        "would_requeue": None,
        "dry_run": False,
        "ids": moved_ids,
        "not_found": [],
    }
    expected = {
        orders.name: moved_ids,
        orders.dlq: [x.id for n, x in letters.items() if n not in moved],
    }
    assert await queue_ids(channel, expected) == expected


async def test_dlq_requeue_dry_run_prints_what_would_move_and_moves_nothing(
    payhooks: Payhooks, channel: AbstractChannel, orders: WorkQueue
) -> None:
    letters = [Letter(), Letter()]
    await put_dead_letters(channel, orders, letters)

    human = await payhooks("dlq", "requeue", "orders", "--all", "--dry-run")
    machine = await payhooks("dlq", "requeue", "orders", "--all", "--dry-run", "--json")

    assert human.code == 0, human.err
    assert [line.split()[:3] for line in human.out.splitlines()[:2]] == [
        ["would", "requeue", x.id] for x in letters
    ]
    assert "would requeue 2 message(s)" in human.out
    assert machine.json() == {
        "requeued": 0,
        "would_requeue": 2,
        "dry_run": True,
        "ids": [x.id for x in letters],
        "not_found": [],
    }
    expected = {orders.dlq: [x.id for x in letters], orders.name: []}
    assert await queue_ids(channel, expected) == expected


async def test_dlq_requeue_matching_nothing_exits_1_and_moves_nothing(
    payhooks: Payhooks, channel: AbstractChannel, orders: WorkQueue
) -> None:
    letter = Letter(reason="unknown_payment")
    await put_dead_letters(channel, orders, [letter])

    result = await payhooks("dlq", "requeue", "orders", "--reason", "delivery_limit")

    assert result.code == 1
    assert "requeued 0 message(s)" in result.out
    expected = {orders.dlq: [letter.id], orders.name: []}
    assert await queue_ids(channel, expected) == expected


USAGE_ERRORS: dict[str, tuple[list[str], str]] = {
    # case: (arguments, what stderr must mention)
    "requeue without selector": (["dlq", "requeue", "orders"], "--all"),
    "requeue with bad time": (["dlq", "requeue", "orders", "--since", "last tuesday"], "--since"),
    "purge without --yes": (["dlq", "purge", "orders"], "--yes"),
    "show unknown queue": (["dlq", "show", "payments"], "invalid choice"),
    "requeue dlq name": (["dlq", "requeue", "orders.dlq", "--all"], "invalid choice"),
    "purge unknown queue": (["dlq", "purge", "nope", "--yes"], "invalid choice"),
    "limit not a number": (["dlq", "requeue", "orders", "--all", "--limit", "some"], "--limit"),
    "zero limit": (["dlq", "requeue", "orders", "--all", "--limit", "0"], "--limit"),
    "negative limit": (["dlq", "show", "orders", "--limit", "-1"], "--limit"),
}


async def test_usage_errors_exit_2_say_what_is_wrong_and_touch_nothing(
    payhooks: Payhooks, channel: AbstractChannel, orders: WorkQueue
) -> None:
    letter = Letter()
    await put_dead_letters(channel, orders, [letter])

    results = await asyncio.gather(*(payhooks(*args) for args, _ in USAGE_ERRORS.values()))

    outcomes = {
        case: (result.code, message in result.err, result.out)
        for (case, (_, message)), result in zip(USAGE_ERRORS.items(), results, strict=True)
    }
    assert outcomes == dict.fromkeys(USAGE_ERRORS, (2, True, ""))
    expected = {orders.dlq: [letter.id], orders.name: []}
    assert await queue_ids(channel, expected) == expected


async def test_dlq_requeue_to_a_queue_that_no_longer_exists_fails_and_keeps_the_message(
    payhooks: Payhooks, channel: AbstractChannel, orders: WorkQueue
) -> None:
    stranded = Letter(original_queue=f"{orders.name}-retired")
    await put_dead_letters(channel, orders, [stranded])

    result = await payhooks("dlq", "requeue", "orders", "--all")

    assert result.code == 2  # configuration: the queue it came from is gone
    assert "Traceback" not in result.err
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert f"{orders.name}-retired does not take messages" in result.err
    expected = {orders.dlq: [stranded.id], orders.name: []}
    assert await queue_ids(channel, expected) == expected


async def test_requeue_on_a_terminal_shows_progress_then_a_summary(
    settings: Settings, channel: AbstractChannel, orders: WorkQueue
) -> None:
    letters = [Letter() for _ in range(3)]
    await put_dead_letters(channel, orders, letters)
    controller, terminal = pty.openpty()
    try:
        process = await asyncio.create_subprocess_exec(
            str(PAYHOOKS),
            "dlq",
            "requeue",
            "orders",
            "--all",
            cwd=REPO,
            env=cli_env(settings),
            stdout=asyncio.subprocess.PIPE,
            stderr=terminal,
        )
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            out, _ = await process.communicate()
        progress = os.read(controller, 65536).decode()
    finally:
        os.close(controller)
        os.close(terminal)

    assert process.returncode == 0
    assert "requeued 3/3" in progress
    assert "requeued 3 message(s)" in out.decode()


# --- dlq purge -----------------------------------------------------------------------------


async def test_dlq_purge_with_yes_prints_or_lists_what_it_removed_and_empties_the_dlq(
    payhooks: Payhooks, channel: AbstractChannel, topology: Topology
) -> None:
    orders, emails = topology.work["orders"], topology.work["emails"]
    letters = [Letter(reason="unknown_payment"), Letter(reason="invalid_message")]
    await put_dead_letters(channel, orders, letters)
    await put_dead_letters(channel, emails, letters)

    human, machine = await asyncio.gather(
        payhooks("dlq", "purge", "orders", "--yes"),
        payhooks("dlq", "purge", "emails", "--yes", "--json"),
    )
    again = await payhooks("dlq", "purge", "orders", "--yes", "--json")

    assert human.code == 0, human.err
    for letter in letters:
        assert f"purged {letter.id} ({letter.reason})" in human.out
        assert letter.payment_id in human.out
    assert "purged 2 message(s)" in human.out
    assert machine.code == 0, machine.err
    purged = machine.json()
    assert purged["purged"] == 2
    assert [(m["id"], m["reason"]) for m in purged["messages"]] == [
        (x.id, x.reason) for x in letters
    ]
    assert again.code == 1  # nothing left to purge
    assert again.json() == {"purged": 0, "messages": []}
    queues = [orders.dlq, orders.name, emails.dlq]
    assert await depths(channel, queues) == dict.fromkeys(queues, 0)


# --- unreachable and missing -----------------------------------------------------------------


ORDER_ADD = ["order", "add", "--order-id=o1", "--payment-id=p1", "--user-id=u1"]
ORDER_ADD += ["--email=a@shop.test", "--amount=10.00", "--currency=USD"]


async def test_rabbitmq_unreachable_exits_3_with_one_line_for_every_command_that_needs_it(
    settings: Settings,
) -> None:
    env = cli_env(settings, AMQP_URL=f"amqp://guest:guest@127.0.0.1:{closed_port()}/")
    commands = {
        "list": ["dlq", "list"],
        "show": ["dlq", "show", "orders"],
        "requeue": ["dlq", "requeue", "orders", "--all"],
        "purge": ["dlq", "purge", "orders", "--yes"],
    }

    results = await asyncio.gather(*(run_payhooks(env, *args) for args in commands.values()))

    for name, result in zip(commands, results, strict=True):
        assert result.code == 3, (name, result)
        assert len(result.err.strip().splitlines()) == 1, (name, result.err)
        assert result.err.startswith("payhooks: cannot reach RabbitMQ"), (name, result.err)
        assert "guest:guest" not in result.err  # never the credentials


async def test_payment_show_without_rabbitmq_still_shows_the_database_and_says_so(
    settings: Settings,
) -> None:
    env = cli_env(settings, AMQP_URL=f"amqp://guest:guest@127.0.0.1:{closed_port()}/")

    result = await run_payhooks(env, "payment", "show", "pay_unknown_anywhere")

    assert result.code == 1  # the database answered: nothing known about this payment
    assert "dead letters not shown: cannot reach RabbitMQ" in result.err
    assert "guest:guest" not in result.err


async def test_postgresql_unreachable_exits_3_with_one_line_for_every_command_that_needs_it(
    settings: Settings, channel: AbstractChannel
) -> None:
    env = cli_env(settings, DATABASE_URL=f"postgresql://postgres@127.0.0.1:{closed_port()}/x")
    commands = {"order add": ORDER_ADD, "payment show": ["payment", "show", "pay_1"]}

    results = await asyncio.gather(*(run_payhooks(env, *args) for args in commands.values()))

    for name, result in zip(commands, results, strict=True):
        assert result.code == 3, (name, result)
        assert len(result.err.strip().splitlines()) == 1, (name, result.err)
        assert result.err.startswith("payhooks: cannot reach PostgreSQL"), (name, result.err)


async def test_dlq_commands_on_queues_that_do_not_exist_fail_in_one_line_naming_the_queue(
    settings: Settings,
) -> None:
    # A typo in AMQP_PREFIX, or a broker no service has declared its queues on yet.
    env = cli_env(settings, AMQP_PREFIX="no-such-prefix.")

    result = await run_payhooks(env, "dlq", "show", "orders")

    assert result.code != 0
    assert "Traceback" not in result.err
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert "no-such-prefix.orders.dlq" in result.err


# --- order add -----------------------------------------------------------------------------


def order_args(payment_id: str, **changes: str) -> list[str]:
    fields = {
        "order-id": f"ord_{payment_id}",
        "payment-id": payment_id,
        "user-id": "user_cli",
        "email": "buyer@shop.test",
        "amount": "25.50",
        "currency": "EUR",
        **changes,
    }
    return ["order", "add", *(f"--{k}={v}" for k, v in fields.items())]


async def test_order_add_registers_once_and_refuses_conflicting_details(
    payhooks: Payhooks, db: Any
) -> None:
    payment_id = new_id("pay")

    first = await payhooks(*order_args(payment_id))
    again = await payhooks(*order_args(payment_id))
    as_json = await payhooks(*order_args(payment_id), "--json")
    conflict = await payhooks(*order_args(payment_id, amount="30.00"))

    assert first.code == 0, first.err
    assert first.out.strip() == (
        f"order ord_{payment_id} registered: payment {payment_id}, 25.50 EUR, status PENDING"
    )
    assert again.code == 0, again.err
    assert again.out.strip() == (
        f"order ord_{payment_id} already registered: payment {payment_id}, 25.50 EUR,"
        " status PENDING"
    )
    assert as_json.code == 0
    shown = as_json.json()
    assert (shown["order_id"], shown["amount"], shown["status"]) == (
        f"ord_{payment_id}",
        "25.50",
        "PENDING",
    )
    assert conflict.code == 4
    assert conflict.err.startswith("payhooks: ")
    assert conflict.out == ""
    rows = await db.fetch("SELECT amount FROM orders WHERE payment_id = $1", payment_id)
    assert [str(r["amount"]) for r in rows] == ["25.50"]


async def test_order_add_with_bad_fields_exits_2_naming_each_flag(
    payhooks: Payhooks, db: Any
) -> None:
    result = await payhooks(*order_args("pay_bad", amount="ten", currency="eur", email="x"))

    assert result.code == 2
    problems = {line.split(":")[1].strip() for line in result.err.splitlines()}
    assert problems == {"--amount", "--currency", "--email"}
    assert await db.fetchval("SELECT count(*) FROM orders") == 0


# --- payment show and the unknown-payment runbook --------------------------------------------


async def finished(system: System) -> tuple[int, int, int]:
    """Deliveries the orders, bonuses and email workers are done with."""
    return system.finished("orders"), system.finished("bonuses"), system.finished("email")


async def test_payment_show_of_an_unknown_payment_exits_1(payhooks: Payhooks) -> None:
    result = await payhooks("payment", "show", "pay_never_heard_of")

    assert result.code == 1
    assert "pay_never_heard_of" in result.err
    assert result.out == ""


async def test_missing_order_registered_then_its_dead_event_requeued_is_processed_once(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    payhooks: Payhooks,
    channel: AbstractChannel,
    topology: Topology,
    db: Any,
) -> None:
    """The runbook: "why didn't this customer get a bonus?" -> payment show -> the order was
    never registered -> order add -> requeue its dead event -> one bonus, one email."""
    system = await start_system(
        aiohttp_client, system_settings(make_settings, smtp[1]), channel, topology
    )
    work = topology.work["orders"]
    payment_id, event_id = new_id("pay"), new_id("evt")
    await post(system.ingest, payment_event(payment_id, "paid", amount="25.50"), event_id)
    await post(system.ingest, payment_event(payment_id, "paid", amount="25.50"), event_id)
    await eventually(lambda: depths(channel, [work.dlq]), lambda d: d[work.dlq] == 1, timeout_s=15)

    before = await payhooks("payment", "show", payment_id)
    registered = await payhooks(*order_args(payment_id, currency="USD"))
    requeued = await payhooks("dlq", "requeue", "orders", "--payment-id", payment_id, "--json")
    await eventually(lambda: finished(system), lambda f: f == (2, 1, 1))
    after = await payhooks("payment", "show", payment_id, "--json")

    assert before.code == 0, before.err
    assert f"payment {payment_id}: NO ORDER REGISTERED; its events wait in orders.dlq" in before.out
    dead_section = before.out.split("dead letters:")[1]
    assert event_id in dead_section
    assert "unknown_payment" in dead_section
    webhooks = before.out.split("webhooks:")[1].split("transitions:")[0]
    assert event_id in webhooks
    assert registered.code == 0, registered.err
    assert requeued.code == 0, requeued.err
    assert requeued.json()["ids"] == [event_id]
    assert after.code == 0, after.err
    view = after.json()
    assert view["order"]["status"] == "PAID"
    assert [(e["event_id"], e["duplicates"]) for e in view["events"]] == [(event_id, 1)]
    assert [(t["from"], t["to"], t["event_id"]) for t in view["transitions"]] == [
        ("PENDING", "PAID", event_id)
    ]
    assert [(b["kind"], b["points"]) for b in view["bonus"]] == [("grant", 500)]
    assert [e["template"] for e in view["emails"]] == ["payment_succeeded"]
    assert view["dead_letters"] == []
    assert smtp_messages(smtp[0], payment_id) == ["payment_succeeded"]
    assert await effects(db, payment_id) == {
        "status": "PAID",
        "bonus": 500,
        "ledger": ["grant"],
        "emails": ["payment_succeeded"],
    }
    assert await finished(system) == (2, 1, 1)  # orders: dead-lettered once, processed once
    processed = await db.fetchval(
        "SELECT count(*) FROM processed_events WHERE worker = 'orders' AND event_id = $1", event_id
    )
    assert processed == 1


async def test_payment_show_prints_every_section_for_a_paid_order(
    aiohttp_client: Any,
    make_settings: Any,
    smtp: tuple[SmtpSink, int],
    payhooks: Payhooks,
    channel: AbstractChannel,
    topology: Topology,
    db: Any,
) -> None:
    system = await start_system(
        aiohttp_client, system_settings(make_settings, smtp[1]), channel, topology
    )
    payment_id, event_id = new_id("pay"), new_id("evt")
    assert (await payhooks(*order_args(payment_id, amount="100.00", currency="USD"))).code == 0
    await post(system.ingest, payment_event(payment_id, "paid"), event_id)
    await eventually(lambda: finished(system), lambda f: f == (1, 1, 1))

    result = await payhooks("payment", "show", payment_id)

    assert result.code == 0, result.err
    first = result.out.splitlines()[0].split()
    assert first[:6] == ["payment", payment_id, "order", f"ord_{payment_id}", "user", "user_cli"]
    assert "status PAID" in result.out
    sections = dict(part.split(":", 1) for part in result.out.split("\n\n")[1:])
    assert event_id in sections["webhooks"]
    assert "transitioned" in sections["webhooks"]
    assert "PENDING" in sections["transitions"]
    assert "PAID" in sections["transitions"]
    assert "grant" in sections["bonus"]
    assert "500" in sections["bonus"]
    assert "payment_succeeded" in sections["emails"]
    assert sections["dead letters"].strip() == "(none)"
    assert "net bonus for this payment: 500" in result.out


# --- requeue safety: the process killed half-way ---------------------------------------------


async def fill_fast(channel: AbstractChannel, work: WorkQueue, count: int) -> list[str]:
    """`count` dead letters in the DLQ of `work`, published concurrently (order irrelevant)."""
    message_ids = [f"evt_kill_{i:05d}" for i in range(count)]
    body = orjson.dumps(payment_event("pay_kill"))

    async def one(message_id: str) -> None:
        message = aio_pika.Message(
            body,
            headers={REASON: "unknown_payment", ORIGINAL_QUEUE: work.name},
            message_id=message_id,
            delivery_mode=DeliveryMode.PERSISTENT,
        )
        await channel.default_exchange.publish(message, work.dlq, mandatory=True)

    for start in range(0, count, 200):
        await asyncio.gather(*(one(i) for i in message_ids[start : start + 200]))
    return message_ids


async def test_requeue_killed_half_way_loses_no_message(
    settings: Settings, channel: AbstractChannel, orders: WorkQueue
) -> None:
    dead = await fill_fast(channel, orders, 600)
    process = await asyncio.create_subprocess_exec(
        str(PAYHOOKS),
        "dlq",
        "requeue",
        "orders",
        "--all",
        cwd=REPO,
        env=cli_env(settings),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        # Kill it once some copies are on the work queue: it is between publishes and acks.
        moved = await eventually(
            lambda: depths(channel, [orders.name]),
            lambda d: d[orders.name] >= 20,
            timeout_s=15,
            interval_s=0.005,
        )
        process.send_signal(signal.SIGKILL)
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()

    assert process.returncode == -signal.SIGKILL
    # Whatever it held unacknowledged goes back to the DLQ when its connection dies.
    await eventually(
        lambda: depths(channel, [orders.name, orders.dlq]),
        lambda d: sum(d.values()) >= len(dead),
        timeout_s=10,
    )
    in_work = ids(await contents(channel, orders.name))
    in_dlq = ids(await contents(channel, orders.dlq))
    assert set(in_work) | set(in_dlq) == set(dead)  # every message at least once
    assert len(in_work) < len(dead)  # the kill landed half-way
    assert len(in_work) >= moved[orders.name]


async def test_a_reader_that_stops_early_ends_payment_show_quietly(
    settings: Settings, db: Any
) -> None:
    """`payhooks payment show ... | head`: the reader goes away mid-output; no traceback,
    exit 141 as for a command a shell's pipe cut."""
    await register(db, "pay_long_story")
    await db.execute(
        "INSERT INTO order_transitions (payment_id, from_status, to_status, event_id)"
        " SELECT 'pay_long_story', 'PAID', 'REFUNDED', 'evt_' || n"
        " FROM generate_series(1, 5000) AS n"
    )
    process = await asyncio.create_subprocess_exec(
        str(PAYHOOKS),
        "payment",
        "show",
        "pay_long_story",
        cwd=REPO,
        env=cli_env(settings),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    async with asyncio.timeout(COMMAND_TIMEOUT_S):
        first = await process.stdout.read(100)
        process._transport.get_pipe_transport(1).close()  # type: ignore[attr-defined]  # like head
        err = await process.stderr.read()
        code = await process.wait()

    assert first
    assert "Traceback" not in err.decode(), err.decode()
    assert "BrokenPipeError" not in err.decode()
    assert code == 141


async def test_dlq_show_and_requeue_filter_by_provider(
    payhooks: Payhooks, channel: AbstractChannel, orders: WorkQueue
) -> None:
    standard, xhub = Letter(id=f"standard:{new_id('msg')}"), Letter()
    await put_dead_letters(channel, orders, [standard, xhub])

    shown = await payhooks("dlq", "show", "orders", "--provider", "standard", "--json")
    dry = await payhooks(
        "dlq", "requeue", "orders", "--provider", "standard", "--dry-run", "--json"
    )

    assert shown.code == 0, shown.err
    assert [(m["id"], m["provider"]) for m in shown.json()["messages"]] == [
        (standard.id, "standard")
    ]
    assert dry.code == 0, dry.err
    assert dry.json()["ids"] == [standard.id]
