"""POST /webhooks/xhub: verify, dedup, persist, publish, answer; one log line per request."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import structlog
from aiohttp import web

from services.ingest.accept import PROVIDER, Acceptor, UnstorableWebhookError
from services.ingest.webhook import (
    ID_HEADER,
    MalformedWebhookError,
    RejectedWebhookError,
    authenticate,
    parse_body,
    read_delivery,
    storable_headers,
)
from shared.config import Settings
from shared.errors import UnavailableError
from shared.http_limits import SlowBodyError, read_body
from shared.metrics import IngestMetrics
from shared.topology import is_routed

log = structlog.get_logger("services.ingest")

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", IngestMetrics)
ACCEPTOR = web.AppKey("acceptor", Acceptor)

# The provider gives up on an answer after 10 s; ours must come well before that.
ACCEPT_BUDGET_S = 8.0
RETRY_AFTER_S = "5"


@dataclass(slots=True)
class _Answer:
    status: int
    outcome: str
    payload: dict[str, str]
    event_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    reason: str | None = None  # why unavailable, for the log line
    close: bool = False  # close the connection after answering


async def receive_webhook(request: web.Request) -> web.Response:
    started = time.perf_counter()
    answer = await _answer(request)
    duration_s = time.perf_counter() - started
    metrics = request.app[METRICS]
    metrics.webhooks_received.labels(provider=PROVIDER, outcome=answer.outcome).inc()
    metrics.ingest_duration.observe(duration_s)
    event = log.warning if answer.outcome == "unavailable" else log.info
    event(
        "webhook.received",
        provider=PROVIDER,
        event_id=request.headers.get(ID_HEADER, "")[:255] or None,
        event_type=answer.event_type,
        outcome=answer.outcome,
        status=answer.status,
        duration_s=round(duration_s, 6),
        **({"reason": answer.reason} if answer.reason else {}),
    )
    response = web.json_response(answer.payload, status=answer.status, headers=answer.headers)
    if answer.close:
        response.force_close()
    return response


async def _answer(request: web.Request) -> _Answer:
    settings = request.app[SETTINGS]
    try:
        delivery = read_delivery(request.headers)
        body = await read_body(request)
        authenticate(
            delivery,
            body,
            settings.webhook_secrets,
            time.time(),
            settings.timestamp_tolerance_s,
        )
        webhook = parse_body(delivery, body)
    except SlowBodyError as e:
        # A 4xx would tell the provider never to send a non-money event again: 503 it is.
        answer = _unavailable(str(e))
        answer.close = True
        return answer
    except web.HTTPRequestEntityTooLarge:
        return _error(413, "too_large", f"body over {settings.max_body_bytes} bytes")
    except web.RequestPayloadError as e:  # a broken chunked encoding, say
        return _error(400, "malformed", f"body could not be read: {e}")
    except MalformedWebhookError as e:
        return _error(400, "malformed", str(e))
    except RejectedWebhookError as e:
        return _error(401, e.outcome, str(e))

    if not is_routed(webhook.event_type):
        log.info("webhook.unrouted", event_id=webhook.event_id, event_type=webhook.event_type)
    try:
        async with asyncio.timeout(ACCEPT_BUDGET_S):
            outcome = await request.app[ACCEPTOR].accept(webhook, storable_headers(request.headers))
    except UnstorableWebhookError as e:
        answer = _error(400, "malformed", str(e))
        answer.event_type = webhook.event_type
        return answer
    except (UnavailableError, TimeoutError) as e:
        answer = _unavailable(str(e) or "no answer within the budget")
        answer.event_type = webhook.event_type
        return answer
    return _Answer(200, outcome.value, {"status": outcome.value}, webhook.event_type)


def _error(status: int, outcome: str, message: str) -> _Answer:
    return _Answer(status, outcome, {"status": "rejected", "error": message})


def _unavailable(reason: str) -> _Answer:
    answer = _error(503, "unavailable", "temporarily unavailable, retry later")
    answer.headers["Retry-After"] = RETRY_AFTER_S
    answer.reason = reason
    return answer
