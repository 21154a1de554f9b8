"""What authentic deliveries tell an operator about our own configuration (issue 11, point 4):
the skew between X-Webhook-Timestamp and our clock, and which configured secret matched.

The app runs against the real PostgreSQL and RabbitMQ; the metrics are read from its /metrics
and the log from its `webhook.received` line. (prometheus_client exports no `_sum` for a
histogram with negative buckets, so the exact value is checked in the log line.)
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from services.ingest.app import create_app
from shared.amqp.broker import BROKER
from shared.config import Settings
from tests.conftest import TEST_SECRETS
from tests.helpers import delivery, payment_event

URL = "/webhooks/xhub"
NEW, OLD = TEST_SECRETS  # XHUB_WEBHOOK_SECRETS=new,old: positions 0 and 1
SKEW = "payhooks_webhook_clock_skew_seconds"
MATCHED = "payhooks_webhook_secret_matched_total"


@pytest.fixture
async def client(aiohttp_client: Any, settings: Settings, amqp: Any) -> TestClient:
    app = create_app(settings)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    return client


async def _samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = await (await client.get("/metrics")).text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _bucket(samples: dict[Any, float], le: float) -> float:
    return samples[(f"{SKEW}_bucket", (("le", str(le)), ("provider", "xhub")))]


def _matched(samples: dict[Any, float], index: int) -> float:
    return samples[(MATCHED, (("provider", "xhub"), ("secret_index", str(index))))]


async def _post(
    client: TestClient, secret: str, skew_s: int
) -> tuple[int, list[MutableMapping[str, Any]], str]:
    """A delivery whose timestamp is `skew_s` seconds behind our clock (ahead if negative)."""
    body, headers = delivery(payment_event(), secret, timestamp=int(time.time()) - skew_s)
    with capture_logs() as logs:
        response = await client.post(URL, data=body, headers=headers)
        await response.read()
    received = [entry for entry in logs if entry["event"] == "webhook.received"]
    return response.status, received, headers["X-Webhook-Id"]


async def test_every_configured_secret_is_exported_at_zero_from_the_start(
    client: TestClient,
) -> None:
    """So "index 1 never increased for two days" is evidence, not a missing series."""
    samples = await _samples(client)

    assert _matched(samples, 0) == 0
    assert _matched(samples, 1) == 0
    assert samples[(f"{SKEW}_count", (("provider", "xhub"),))] == 0


async def test_skew_of_an_accepted_delivery_is_observed_with_the_old_secret_that_matched(
    client: TestClient, db: Any
) -> None:
    status, logs, event_id = await _post(client, OLD, skew_s=90)

    assert status == 200
    samples = await _samples(client)
    # 90 s behind our clock (plus the sub-second part of now): in the (60, 120] bucket.
    assert _bucket(samples, 60.0) == 0
    assert _bucket(samples, 120.0) == 1
    assert samples[(f"{SKEW}_count", (("provider", "xhub"),))] == 1
    assert (_matched(samples, 0), _matched(samples, 1)) == (0, 1)
    (line,) = logs
    assert line["event_id"] == event_id
    assert line["secret_index"] == 1
    assert 90 <= line["clock_skew_s"] < 92
    assert OLD not in repr(line)
    assert await db.fetchval("SELECT count(*) FROM inbox WHERE event_id = $1", event_id) == 1


async def test_a_stale_delivery_still_shows_its_skew_and_secret(
    client: TestClient, db: Any
) -> None:
    """Our clock 400 s behind X-Hub's: the delivery is 401 stale, and the histogram says by
    how much and in which direction."""
    status, logs, event_id = await _post(client, NEW, skew_s=-400)

    assert status == 401
    samples = await _samples(client)
    assert _bucket(samples, -600.0) == 0
    assert _bucket(samples, -300.0) == 1
    assert samples[(f"{SKEW}_count", (("provider", "xhub"),))] == 1
    assert (_matched(samples, 0), _matched(samples, 1)) == (1, 0)
    (line,) = logs
    assert line["outcome"] == "stale"
    assert line["secret_index"] == 0
    assert -400 <= line["clock_skew_s"] < -398
    assert await db.fetchval("SELECT count(*) FROM inbox WHERE event_id = $1", event_id) == 0


async def test_an_invalid_signature_records_no_skew_and_no_secret(client: TestClient) -> None:
    """Anyone can send one: it must not move the operator's evidence."""
    status, logs, _ = await _post(client, "not-our-secret", skew_s=-400)

    assert status == 401
    samples = await _samples(client)
    assert samples[(f"{SKEW}_count", (("provider", "xhub"),))] == 0
    assert (_matched(samples, 0), _matched(samples, 1)) == (0, 0)
    (line,) = logs
    assert line["outcome"] == "invalid_signature"
    assert "secret_index" not in line
    assert "clock_skew_s" not in line
