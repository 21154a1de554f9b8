"""PostgreSQL lost (or the commit refused) between the SMTP server's acceptance and the commit
of the email's record.

`make chaos` saw it once (PostgreSQL stopped under traffic): the commit failed after the 250,
the redelivered message found no record and the customer got the email twice. The worker now
writes the record again once the database is back, so the email goes out once. `make chaos`'s
round terminating every connection saw the same through another error (asyncpg's
InternalClientError, the commit interrupted): the record is now written again whatever failed
the commit.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, DeliveryMode

from services.email.app import create_app as email_app
from shared.amqp.topology import Topology
from shared.messages import OrderTransition
from shared.process.web import REGISTRY
from tests.conftest import SmtpSink, smtp_server
from tests.helpers import eventually
from tests.integration.system import register
from tests.proxy import TcpProxy, proxy_to, via

OUTAGE_S = 0.5


class CuttingSmtp(SmtpSink):
    """Accepts every message, but cuts the worker's database link just before answering 250
    (restored OUTAGE_S later), so the commit after the send is what fails."""

    def __init__(self, proxy: TcpProxy, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.proxy, self.loop = proxy, loop

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        answer = await super().handle_DATA(server, session, envelope)
        if len(self.messages) == 1:

            async def cut() -> None:
                self.proxy.cut()
                self.loop.call_later(OUTAGE_S, self.proxy.restore)

            asyncio.run_coroutine_threadsafe(cut(), self.loop).result(timeout=5)
        return answer


async def test_an_email_whose_commit_fails_after_the_send_is_recorded_not_sent_again(
    aiohttp_client: Any,
    make_settings: Any,
    channel: AbstractChannel,
    topology: Topology,
    db: Any,
) -> None:
    await register(db, "pay_mail_db", status="PAID")
    proxy = await proxy_to(make_settings().database_url, 5432)
    sink = CuttingSmtp(proxy, asyncio.get_running_loop())
    try:
        registry = await _send_one(
            aiohttp_client,
            make_settings,
            {"DATABASE_URL": via(make_settings().database_url, proxy)},
            channel,
            topology,
            sink,
            "pay_mail_db",
        )
    finally:
        await proxy.close()
    await _sent_once(db, channel, topology, sink, registry, "pay_mail_db")


async def test_an_email_whose_commit_is_refused_after_the_send_is_recorded_not_sent_again(
    aiohttp_client: Any,
    make_settings: Any,
    channel: AbstractChannel,
    topology: Topology,
    db: Any,
) -> None:
    """Not an outage this time: the commit fails on an error of another kind (a deferred
    trigger that refuses the first commit of the record). The email the server took is
    recorded all the same, and the batch handed back finds it so."""
    await register(db, "pay_mail_refused", status="PAID")
    await db.execute(
        """
        CREATE SEQUENCE refuse_once;  -- nextval survives the rollback it causes
        CREATE FUNCTION refuse_once() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF nextval('refuse_once') = 1 THEN
                RAISE EXCEPTION 'refused once at commit';
            END IF;
            RETURN NULL;
        END $$;
        CREATE CONSTRAINT TRIGGER refuse_once AFTER INSERT ON emails_sent
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_once();
        """
    )
    try:
        sink = SmtpSink()
        registry = await _send_one(
            aiohttp_client, make_settings, {}, channel, topology, sink, "pay_mail_refused"
        )
        assert await db.fetchval("SELECT last_value FROM refuse_once") == 2  # it did refuse
        await _sent_once(db, channel, topology, sink, registry, "pay_mail_refused")
    finally:
        await db.execute(
            "DROP TRIGGER refuse_once ON emails_sent; DROP FUNCTION refuse_once();"
            " DROP SEQUENCE refuse_once"
        )


async def _send_one(
    aiohttp_client: Any,
    make_settings: Any,
    overrides: dict[str, str],
    channel: AbstractChannel,
    topology: Topology,
    sink: SmtpSink,
    payment_id: str,
) -> Any:
    """The email worker, sending to `sink`, takes one order.paid transition of `payment_id`
    to its end; its metrics registry."""
    with smtp_server(sink) as smtp_port:
        settings = make_settings(
            **overrides, SMTP_PORT=str(smtp_port), EMAIL_FROM="shop@example.test"
        )
        client = await aiohttp_client(email_app(settings))
        transition = OrderTransition(
            event="order.paid",
            payment_id=payment_id,
            order_id=f"ord_{payment_id}",
            user_id=f"user_{payment_id}",
            from_status="PENDING",
            to_status="PAID",
            source_event_id=f"evt_{payment_id}",
        )
        await channel.default_exchange.publish(
            aio_pika.Message(
                transition.encode(),
                message_id=transition.message_id,
                type="order.paid",
                delivery_mode=DeliveryMode.PERSISTENT,
            ),
            routing_key=topology.work_queue("emails").name,
        )

        registry = client.app[REGISTRY]

        def finished() -> float:
            return sum(
                registry.get_sample_value(
                    "payhooks_messages_processed_total", {"worker": "email", "outcome": o}
                )
                or 0.0
                for o in ("ok", "skipped_duplicate", "dead_lettered")
            )

        await eventually(lambda: asyncio.sleep(0, finished()), lambda n: n >= 1, timeout_s=20)
        await asyncio.sleep(1.0)  # a resend would come within the retry delays (0.2, 0.4 s)
    return registry


async def _sent_once(
    db: Any,
    channel: AbstractChannel,
    topology: Topology,
    sink: SmtpSink,
    registry: Any,
    payment_id: str,
) -> None:
    assert [str(m["Message-ID"]) for m in sink.messages] == [
        f"<payment_succeeded.{payment_id}@example.test>"
    ]
    rows = await db.fetch("SELECT template FROM emails_sent WHERE payment_id = $1", payment_id)
    assert [r["template"] for r in rows] == ["payment_succeeded"]
    dlq = await channel.declare_queue(topology.work_queue("emails").dlq, passive=True)
    assert dlq.declaration_result.message_count == 0
    done = sum(
        registry.get_sample_value(
            "payhooks_messages_processed_total", {"worker": "email", "outcome": outcome}
        )
        or 0.0
        for outcome in ("ok", "skipped_duplicate")
    )
    assert done == 1.0
