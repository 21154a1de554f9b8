"""JSON answers of the api: a body, or an error as RFC 9457 problem details with a stable
`code` (PROBLEMS), its message also in `error` as before."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web

PROBLEM_JSON = "application/problem+json"

# code -> title. The codes are the contract clients branch on (docs/operations.md,
# services/api/openapi/).
PROBLEMS: dict[str, str] = {
    "invalid_request": "The request is not valid",
    "invalid_order": "The order is not valid",
    "unauthorized": "Missing or invalid admin token",
    "forbidden": "The token's scope does not allow this",
    "not_found": "Not found",
    "method_not_allowed": "Method not allowed",
    "request_timeout": "Request body not received in time",
    "order_conflict": "The order conflicts with a registered one",
    "requeue_unroutable": "A requeued message could not be routed",
    "payload_too_large": "Request body too large",
    "internal_error": "Internal error",
    "unavailable": "A dependency is unavailable",
    "dlq_busy": "Another reader holds the DLQ",
    "replay_too_large": "The replay selects more events than one run replays",
    "replay_unroutable": "A replayed message could not be queued",
    "invalid_resolution": "The resolution is not valid",
    "resolve_in_flight": "A provider event of the payment is still being processed",
    "resolve_forbidden": "The order machine forbids this move without force",
    "resolve_no_change": "The order is in that status already",
    "worker_state": "The worker is in that state already",
    "invalid_erasure": "The erasure request is not valid",
    # Any other HTTP error aiohttp raises: nothing beyond its status, so type about:blank.
    "http_error": "",
}

TYPE_PREFIX = "urn:payhooks:problem:"


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def problem(
    status: int, code: str, message: str, *, detail: str | None = None, **extra: Any
) -> web.Response:
    """An error answer: `message` is `error` (and `detail` unless given); `extra` adds members
    such as `fields`."""
    title = PROBLEMS[code] or HTTPStatus(status).phrase
    body = {
        "type": "about:blank" if code == "http_error" else TYPE_PREFIX + code,
        "title": title,
        "status": status,
        "detail": message if detail is None else detail,
        "code": code,
        "error": message,
        **extra,
    }
    return web.Response(body=orjson.dumps(body), status=status, content_type=PROBLEM_JSON)
