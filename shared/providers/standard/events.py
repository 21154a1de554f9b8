"""Payment events in the Standard Webhooks envelope `{"type","timestamp","data"}`: `type` is
one of payhooks' event names (`payment.status_changed`, `refund.completed`, ...) and `data`
holds the same fields as X-Hub's body (SPEC section 3, docs/providers.md), so one vocabulary
serves both. The canonical event the workers read is `data` with `event` = `type`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from shared.providers.base import Headline, MalformedWebhookError


def headline(payload: Mapping[str, Any]) -> Headline:
    event_type = payload.get("type")
    if not isinstance(event_type, str) or not event_type.strip():
        raise MalformedWebhookError('body has no "type"')
    data = payload.get("data")
    if not isinstance(data, dict):
        raise MalformedWebhookError('body has no "data" object')
    return Headline(event_type, data.get("payment_id"))


def canonical(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The envelope as payhooks' canonical event: `data`'s fields, `event` from `type`, and
    `created_at` from the envelope's `timestamp` when `data` has none."""
    data = payload.get("data")
    event: dict[str, Any] = dict(data) if isinstance(data, dict) else {}
    event["event"] = payload.get("type")
    if "created_at" not in event and isinstance(payload.get("timestamp"), str):
        event["created_at"] = payload["timestamp"]
    return event


def canonical_body(body: bytes) -> bytes:
    """A stored (hence verified and well-formed) body as the message body the workers read.
    A body that is somehow not an envelope is passed on as it is: the orders worker
    dead-letters what it cannot read, where an operator sees it."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), dict):
        return body
    return orjson.dumps(canonical(payload))


def envelope(event_type: str, timestamp: str, **data: Any) -> dict[str, Any]:
    """A payment event as a Standard Webhooks sender emits it (tools, tests)."""
    return {"type": event_type, "timestamp": timestamp, "data": data}


def encode(event_id: str, event: Mapping[str, Any]) -> bytes:
    """A canonical event (X-Hub's body shape) as a Standard Webhooks sender's body: the
    inverse of `canonical`. The event id travels in `webhook-id`, not in the body."""
    data = {k: v for k, v in event.items() if k != "event"}
    created_at = data.get("created_at")
    timestamp = created_at if isinstance(created_at, str) else ""
    return orjson.dumps(envelope(str(event.get("event", "")), timestamp, **data))
