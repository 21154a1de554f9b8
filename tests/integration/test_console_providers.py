"""The console names the provider of every webhook: the payment page's events, the DLQ page's
letters (and its Provider filter), the search by a Standard Webhooks event id."""

from __future__ import annotations

from typing import Any

import orjson
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient

from shared.queries import inbox as inbox_sql
from shared.queries.inbox import InboxEntry
from tests.integration.test_console import console, sign_in
from tests.integration.test_dlq import Letter, new_id, put_dead_letters

__all__ = ["console"]  # the fixture, used by name


async def test_the_payment_and_dlq_pages_name_each_events_provider(
    console: TestClient, db: Any, channel: AbstractChannel, topology: Any
) -> None:
    payment_id = new_id("pay")
    body = orjson.dumps({"type": "payment.status_changed", "data": {"payment_id": payment_id}})
    entry = InboxEntry("msg_console", "payment.status_changed", payment_id, body, {})
    await inbox_sql.store_batch(db, "standard", [entry])
    orders = topology.work["orders"]
    standard, xhub = Letter(id="standard:msg_console", payment_id=payment_id), Letter()
    await put_dead_letters(channel, orders, [standard, xhub])
    await sign_in(console, "ann-token")

    page = await (await console.get(f"/console/payments/{payment_id}")).text()
    events = page.split('id="events"')[1].split("</section>")[0]
    assert '<td class="provider">standard</td>' in events

    dlq = await (await console.get("/console/dlq/orders?provider=standard")).text()
    assert "<option selected>standard</option>" in dlq
    assert standard.id in dlq
    assert xhub.id not in dlq
    assert '<td class="provider">standard</td>' in dlq
    # The search finds a Standard Webhooks event id too.
    found = await console.get("/console/search?q=msg_console", allow_redirects=False)
    assert found.status == 303
    assert found.headers["Location"].endswith(f"/payments/{payment_id}#events")
