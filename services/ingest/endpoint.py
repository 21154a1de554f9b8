"""POST /webhooks/{provider}: verify, dedup, persist, publish, answer; one log line per
request. The provider's `Provider` says how to read and verify its deliveries."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson
import structlog
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from services.ingest.accept import Acceptor, OverloadedError, UnstorableWebhookError
from services.ingest.refusals import Refusals
from services.ingest.webhook import (
    MalformedWebhookError,
    RejectedWebhookError,
    Signed,
    Webhook,
    authenticate,
    parse_body,
    read_headers,
    storable_headers,
)
from shared.amqp.topology import is_routed
from shared.config import Settings
from shared.errors import UnavailableError
from shared.metrics import IngestMetrics
from shared.process.http_limits import SlowBodyError, read_body
from shared.providers.base import Provider

log = structlog.get_logger("services.ingest")

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", IngestMetrics)
# An accept path per provider with a route, by provider name: dedup, confirms and batches
# are per (provider, event id), as the inbox keys them.
ACCEPTORS: web.AppKey[dict[str, Acceptor]] = web.AppKey("acceptors")
# Refused event ids (401, 5xx) for `payhooks missing`: set by ingest's app (services/ingest/
# refusals.py); an endpoint without it (the benchmark baseline) keeps none.
REFUSALS = web.AppKey("refusals", Refusals)

# The provider gives up on an answer after 10 s; ours must come well before that. The budget
# runs from the request's arrival (its headers), so reading the body spends it too.
ACCEPT_BUDGET_S = 8.0
RETRY_AFTER_S = "5"
# A webhook refused by its predicted wait is answered this long after its arrival (within its
# budget), not at once: in a breaker-release burst the refusals come first otherwise, and
# X-Hub's breaker reopens when >= 80 % of >= 5 deliveries fail, the first 5 included
# (docs/ingest-burst.md: an 18,000 burst's 4,000 refusals at once reopened it).
REFUSAL_HOLD_S = 2.0


@dataclass(slots=True)
class _Answer:
    status: int
    outcome: str
    payload: dict[str, str]
    event_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    reason: str | None = None  # why unavailable, for the log line
    close: bool = False  # close the connection after answering
    signed: Signed | None = None  # an authentically signed delivery: which secret, what skew
    event_id: str | None = None  # a verified body's (a provider whose id is in the body)


def webhook_handler(provider: Provider) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The request handler of `provider`'s route."""

    async def handler(request: web.Request) -> web.Response:
        return await receive_webhook(request, provider)

    return handler


async def receive_webhook(request: web.Request, provider: Provider) -> web.Response:
    started = time.perf_counter()
    deadline = asyncio.get_running_loop().time() + ACCEPT_BUDGET_S
    answer = await _answer(request, deadline, provider)
    duration_s = time.perf_counter() - started
    metrics = request.app[METRICS]
    metrics.received[provider.name][answer.outcome].inc()
    metrics.ingest_duration.observe(duration_s)
    fields: dict[str, object] = {}
    if answer.reason:
        fields["reason"] = answer.reason
    if answer.status in (400, 413):  # X-Hub drops a non-money event answered 4xx: say why
        fields["error"] = answer.payload["error"]
    if (signed := answer.signed) is not None:
        metrics.signed_with(signed.secret_index, provider.name).inc()
        fields["secret_index"] = signed.secret_index
        if signed.clock_skew_s is not None:
            metrics.skew(provider.name).observe(signed.clock_skew_s)
            fields["clock_skew_s"] = round(signed.clock_skew_s, 3)
    given_id = answer.event_id  # a body's id, verified (a 5xx's); else the id header's
    if given_id is None and provider.id_header is not None:
        given_id = request.headers.get(provider.id_header)
    refusals = request.app.get(REFUSALS)
    if (answer.status == 401 or answer.status >= 500) and refusals is not None:
        refusals.note(provider.name, given_id, answer.status, answer.outcome)
    event = log.warning if answer.outcome == "unavailable" else log.info
    event(
        "webhook.received",
        provider=provider.name,
        event_id=(given_id or "")[:255] or None,
        event_type=answer.event_type,
        outcome=answer.outcome,
        status=answer.status,
        duration_s=round(duration_s, 6),
        **fields,
    )
    response = web.Response(
        body=orjson.dumps(answer.payload),
        status=answer.status,
        headers=answer.headers,
        content_type="application/json",
    )
    if answer.close:
        response.force_close()
    return response


async def _answer(request: web.Request, deadline: float, provider: Provider) -> _Answer:
    """The answer to one delivery; `deadline` (event loop time) ends the answer budget."""
    settings = request.app[SETTINGS]
    if (request.content_length or 0) > settings.max_body_bytes:
        # Declared too large: answered at once, not after waiting for a body never read.
        answer = _error(413, "too_large", f"body over {settings.max_body_bytes} bytes")
        answer.close = True
        return answer
    try:
        delivery = read_headers(request.headers, provider)
        body = await read_body(request)
        signed = authenticate(
            delivery,
            body,
            settings.provider_secrets[provider.name],
            time.time(),
            settings.timestamp_tolerance_s,
            provider,
        )
        webhook = parse_body(delivery, body, provider, settings.provider_options.get(provider.name))
    except SlowBodyError as e:
        # A 4xx would tell the provider never to send a non-money event again: 503 it is.
        return _unavailable(str(e), close=True)
    except web.HTTPRequestEntityTooLarge:
        return _error(413, "too_large", f"body over {settings.max_body_bytes} bytes")
    except (web.RequestPayloadError, BadHttpMessage, ConnectionResetError) as e:
        # The body broke off: a broken chunked encoding, or the client hung up mid-body (a
        # handler already waiting for the body gets aiohttp's parser error itself). A
        # transport failure, not a bad webhook: 503 so the provider sends it again.
        return _unavailable(f"request body incomplete: {e}", close=True)
    except MalformedWebhookError as e:
        return _error(400, "malformed", str(e))
    except RejectedWebhookError as e:
        answer = _error(401, e.outcome, str(e))
        answer.signed = e.signed
        return answer

    if not is_routed(webhook.event_type):
        log.info("webhook.unrouted", event_id=webhook.event_id, event_type=webhook.event_type)
    answer = await _accept(request, request.app[ACCEPTORS][provider.name], webhook, deadline)
    answer.event_type = webhook.event_type
    answer.event_id = webhook.event_id
    answer.signed = signed
    return answer


async def _accept(
    request: web.Request, acceptor: Acceptor, webhook: Webhook, deadline: float
) -> _Answer:
    try:
        outcome = await acceptor.accept(webhook, storable_headers(request.headers), deadline)
    except UnstorableWebhookError as e:
        return _error(400, "malformed", str(e))
    except OverloadedError as e:
        request.app[METRICS].shed.labels(reason=e.reason).inc()
        if e.reason == "predicted_wait":
            loop = asyncio.get_running_loop()
            hold_until = min(deadline - ACCEPT_BUDGET_S + REFUSAL_HOLD_S, deadline)
            await asyncio.sleep(max(0.0, hold_until - loop.time()))
        return _unavailable(str(e))
    except UnavailableError as e:
        return _unavailable(str(e))
    return _Answer(200, outcome.value, {"status": outcome.value})


def _error(status: int, outcome: str, message: str) -> _Answer:
    return _Answer(status, outcome, {"status": "rejected", "error": message})


def _unavailable(reason: str, *, close: bool = False) -> _Answer:
    answer = _error(503, "unavailable", "temporarily unavailable, retry later")
    answer.headers["Retry-After"] = RETRY_AFTER_S
    answer.reason = reason
    answer.close = close
    return answer
