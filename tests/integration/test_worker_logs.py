"""Worker log lines about one message carry its payment_id (structlog contextvars): lines
logged while it is handled or after its commit, and the retried / dead-lettered lines of a
failed one. Real RabbitMQ, real PostgreSQL, the real orders handler."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg
import orjson
import structlog
from structlog.testing import capture_logs
from structlog.typing import EventDict

from shared.amqp.topology import Topology, declare
from shared.config import Settings
from shared.db import create_pool
from shared.messages import OrderTransition
from shared.worker.batches import Delivery, Result, Step
from tests.batch_handlers import in_one_transaction
from tests.helpers import eventually, payment_event
from tests.integration.test_worker_message_id import orders_worker, publish, running_worker

log = structlog.get_logger(__name__)

# What configure_logging puts first: capture_logs replaces the processors, so the test
# merges the bound contextvars as production does.
MERGED = [structlog.contextvars.merge_contextvars]


def lines(logs: Sequence[EventDict], event: str) -> dict[str, EventDict]:
    """The captured `event` lines by message id."""
    return {line["message_id"]: line for line in logs if line["event"] == event}


async def test_a_failed_messages_log_lines_carry_its_payment_id(
    settings: Settings, topology: Topology, amqp: Any, db: Any
) -> None:
    await declare(amqp, topology)
    queue = topology.work["orders"].name
    unknown = f"pay_unknown_{uuid.uuid4().hex[:8]}"  # no order: parked
    invalid = f"pay_{uuid.uuid4().hex[:12]}"  # no status: dead-lettered at once

    with capture_logs(processors=MERGED) as logs:
        async with orders_worker(settings, topology, amqp):
            await publish(amqp, queue, orjson.dumps(payment_event(unknown, "paid")), "evt_unknown")
            body = {"event": "payment.status_changed", "payment_id": invalid}
            await publish(amqp, queue, orjson.dumps(body), "evt_invalid")
            await publish(amqp, queue, b"{not json", "evt_broken")

            async def captured() -> list[EventDict]:
                return list(logs)

            await eventually(
                captured,
                lambda got: (
                    "evt_unknown" in lines(got, "order.parked")
                    and {"evt_invalid", "evt_broken"} <= set(lines(got, "message.dead_lettered"))
                ),
            )

    assert lines(logs, "order.parked")["evt_unknown"]["payment_id"] == unknown
    dead = lines(logs, "message.dead_lettered")
    assert dead["evt_invalid"]["payment_id"] == invalid
    assert dead["evt_invalid"]["worker"] == "orders"
    assert "payment_id" not in dead["evt_broken"]  # nothing to read it from
    # Bound for the message only: the batch's own line is about several.
    assert all("payment_id" not in line for line in logs if line["event"] == "batch.processed")


async def test_lines_logged_while_a_message_is_handled_and_after_its_commit_carry_it(
    settings: Settings, db: Any
) -> None:
    def transition(payment_id: str) -> bytes:
        return OrderTransition(
            "order.paid", payment_id, "ord_1", "user_1", "PENDING", "PAID", "evt_1"
        ).encode()

    async def handle(step: Step, delivery: Delivery) -> str:
        log.info("handling", message_id=delivery.message_id)
        step.after_commit(lambda: log.info("committed", message_id=delivery.message_id))
        return "ok"

    def payment_id_of(delivery: Delivery) -> str:
        return OrderTransition.decode(delivery.body).payment_id

    deliveries = [
        Delivery("m_a", "order.paid", transition("pay_a"), 0),
        Delivery("m_b", "order.paid", transition("pay_b"), 0),
        Delivery("m_none", "order.paid", b"[]", 0),
    ]
    pool = await create_pool(settings.database_url, max_size=1)
    try:
        with capture_logs(processors=MERGED) as logs:
            results = await in_one_transaction(pool, handle, payment_id_of)(deliveries)
            log.info("after")
    finally:
        await pool.close()

    assert results == ["ok"] * 3
    for event in ("handling", "committed"):
        got = {m: line.get("payment_id") for m, line in lines(logs, event).items()}
        assert got == {"m_a": "pay_a", "m_b": "pay_b", "m_none": None}, event
    assert "payment_id" not in next(line for line in logs if line["event"] == "after")


async def test_a_database_conflict_is_retried_with_one_line_and_a_bug_with_its_traceback(
    settings: Settings, topology: Topology, amqp: Any
) -> None:
    # A deadlock PostgreSQL broke is expected weather (info, no traceback), where an unknown
    # error is a bug. (A timeout is an outage: the worker pauses, tests/integration/
    # test_worker_outages.py.)
    await declare(amqp, topology)
    errors: dict[str, Exception] = {
        "evt_deadlock": asyncpg.exceptions.DeadlockDetectedError("deadlock detected"),
        "evt_bug": RuntimeError("bug"),
    }

    async def fail(deliveries: Sequence[Delivery]) -> list[Result]:
        return [errors[d.message_id] for d in deliveries]

    queue = topology.work["orders"].name
    with capture_logs(processors=MERGED) as logs:
        async with running_worker(settings, topology, amqp, lambda _: fail):
            for message_id in errors:
                await publish(amqp, queue, orjson.dumps(payment_event("pay_x")), message_id)

            async def captured() -> list[EventDict]:
                return list(logs)

            await eventually(captured, lambda got: set(lines(got, "message.retried")) == {*errors})

    retried = lines(logs, "message.retried")
    assert retried["evt_deadlock"]["log_level"] == "info"
    assert retried["evt_deadlock"]["error"] == "DeadlockDetectedError: deadlock detected"
    assert retried["evt_deadlock"]["exc_info"] is False
    assert retried["evt_deadlock"]["payment_id"] == "pay_x"  # read from the failed body
    assert retried["evt_bug"]["log_level"] == "error"
    assert retried["evt_bug"]["error"] == "RuntimeError: bug"
    assert isinstance(retried["evt_bug"]["exc_info"], RuntimeError)
