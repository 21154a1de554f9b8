"""PostgreSQL lost between the SMTP server's acceptance and the commit of the email's record.

`make chaos` saw it once (PostgreSQL stopped under traffic): the commit failed after the 250,
the redelivered message found no record and the customer got the email twice. The worker now
writes the record again once the database is back, so the email goes out once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, DeliveryMode

from services.email.app import create_app as email_app
from shared.messages import OrderTransition
from shared.topology import Topology
from shared.web import REGISTRY
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
        with smtp_server(sink) as smtp_port:
            settings = make_settings(
                DATABASE_URL=via(make_settings().database_url, proxy),
                SMTP_PORT=str(smtp_port),
                EMAIL_FROM="shop@example.test",
            )
            client = await aiohttp_client(email_app(settings))
            transition = OrderTransition(
                event="order.paid",
                payment_id="pay_mail_db",
                order_id="ord_pay_mail_db",
                user_id="user_pay_mail_db",
                from_status="PENDING",
                to_status="PAID",
                source_event_id="evt_mail_db",
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
    finally:
        await proxy.close()

    assert [str(m["Message-ID"]) for m in sink.messages] == [
        "<payment_succeeded.pay_mail_db@example.test>"
    ]
    rows = await db.fetch("SELECT template FROM emails_sent WHERE payment_id = 'pay_mail_db'")
    assert [r["template"] for r in rows] == ["payment_succeeded"]
    dlq = await channel.declare_queue(topology.work_queue("emails").dlq, passive=True)
    assert dlq.declaration_result.message_count == 0
    assert (
        registry.get_sample_value(
            "payhooks_messages_processed_total", {"worker": "email", "outcome": "ok"}
        )
        == 1.0
    )
