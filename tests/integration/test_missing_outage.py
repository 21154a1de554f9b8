"""A webhook refused with 503 because PostgreSQL is down cannot be recorded then: ingest keeps
its id in its bounded buffer and writes it to refused_webhooks once the database answers, so
`payhooks missing` lists it (services/ingest/refusals.py). PostgreSQL keeps running: ingest
reaches it through a TcpProxy the test cuts and restores (as in test_ingest_outages.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from shared.ops import missing
from tests.helpers import eventually
from tests.integration.test_ingest_outages import (
    IngestFactory,
    Proxies,
    _assert_unavailable,
    _new_event,
    _post,
    ingest,
    proxies,
)

__all__ = ["ingest", "proxies"]  # the fixtures, used by name


async def test_an_id_refused_while_postgresql_is_down_is_recorded_once_it_answers(
    ingest: IngestFactory, proxies: Proxies, db: Any
) -> None:
    client = await ingest(pg=True)
    event_id, body = _new_event()
    proxies.pg.cut()

    first, elapsed_s = await _post(client, event_id, body)
    again, _ = await _post(client, event_id, body)

    _assert_unavailable(first, elapsed_s)
    assert again.status == 503
    assert await db.fetch("SELECT 1 FROM refused_webhooks") == []
    proxies.pg.restore()
    row = await eventually(
        lambda: db.fetchrow(
            "SELECT status, outcome, refusals FROM refused_webhooks WHERE event_id = $1",
            event_id,
        ),
        lambda r: r is not None,
        timeout_s=20,
    )
    assert dict(row) == {"status": 503, "outcome": "unavailable", "refusals": 2}
    found = await missing.missing(db, missing.Window.parse(None, None))
    assert [(r["event_id"], r["status"]) for r in found["refused"]] == [(event_id, 503)]
    now = dt.datetime.now(dt.UTC)
    assert now - dt.timedelta(minutes=1) < dt.datetime.fromisoformat(found["refused"][0]["last_at"])
