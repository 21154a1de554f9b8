"""What every provider's property test of hostile deliveries checks: a delivery that is not
the provider's (unsigned, badly signed, malformed, too big) is refused with a 4xx and leaves
nothing behind, counted as neither accepted, duplicate nor unavailable."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, event, settings
from prometheus_client.parser import text_string_to_metric_families

REJECTIONS = {400, 401, 413}
# Each example is a real request through ingest and a query of the inbox.
HOSTILE_EXAMPLES = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def received(metrics: str, provider: str) -> dict[str, float]:
    """payhooks_webhooks_received_total{provider} by outcome, from the /metrics text."""
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "payhooks_webhooks_received_total"
        and sample.labels["provider"] == provider
    }


async def assert_refused_and_unstored(
    client: TestClient,
    db: Any,
    url: str,
    provider: str,
    headers: dict[str, str],
    body: bytes,
    event_id: str = "",
) -> None:
    """POST the delivery to `url`: a 4xx of REJECTIONS, no inbox row with its event id (if the
    provider sends one in a header) or its body, and no accepted, duplicate or unavailable."""
    response = await client.post(url, data=body, headers=headers)

    answer = await response.text()
    assert response.status in REJECTIONS, answer
    event(f"answered {response.status} {answer[:60]}")  # --hypothesis-show-statistics
    stored = await db.fetchval(
        "SELECT count(*) FROM inbox WHERE event_id = $1 OR body = $2", event_id, body
    )
    assert stored == 0
    counts = received(await (await client.get("/metrics")).text(), provider)
    assert counts.get("accepted", 0) == counts.get("duplicate", 0) == 0
    assert counts.get("unavailable", 0) == 0
