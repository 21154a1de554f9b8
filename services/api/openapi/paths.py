"""The OpenAPI document's paths: every route, its parameters and its answers."""

from __future__ import annotations

from typing import Any

from services.api.auth import ORDERS_ROUTES
from services.api.dlq_routes import MAX_OFFSET, MAX_PAGE
from services.api.openapi.build import (
    BODY_ERRORS,
    EVENT_QUERY,
    ID_ANSWERS,
    PATH,
    PROVIDER_QUERY,
    QUEUE,
    STR,
    list_of,
    object_of,
    ok,
    path_id,
    problem,
    protected,
    ref,
    unavailable_answer,
)
from shared.ops import inbox_view, unrouted
from shared.queries import audit

OPEN: dict[str, Any] = {"security": []}
# /readyz: the server of each dependency in use, "host:port" (a cluster's node, the primary).
_SERVING: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {"type": "string"},
    "examples": [{"postgresql": "10.0.0.5:5432", "rabbitmq": "10.0.0.7:5672"}],
}

PATHS: dict[str, Any] = {
    "/api/orders": {
        "post": {
            "summary": "Register an order (idempotent on order_id)",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref("NewOrder")}},
            },
            "responses": protected(
                {
                    "200": ok(ref("Order"), "already registered with the same details"),
                    "201": ok(ref("Order"), "registered"),
                    "400": problem("not JSON, or bad fields", "invalid_request", "invalid_order"),
                    "409": problem(
                        "order or payment id registered with other details", "order_conflict"
                    ),
                    **BODY_ERRORS,
                },
            ),
        }
    },
    "/api/orders/{order_id}": {
        "get": {
            "summary": "An order",
            "parameters": [path_id("order_id", "the shop's order id")],
            "responses": protected(
                {
                    "200": ok(ref("Order"), "the order"),
                    **ID_ANSWERS,
                    "404": problem("no such order", "not_found"),
                },
            ),
        }
    },
    "/api/payments/{payment_id}": {
        "get": {
            "summary": "Everything known about a payment (the support view)",
            "parameters": [path_id("payment_id", "the provider's payment id")],
            "responses": protected(
                {
                    "200": ok(
                        ref("PaymentView"),
                        "the payment; without RabbitMQ, from the database alone",
                    ),
                    **ID_ANSWERS,
                    "404": problem("no order and no webhook for it", "not_found"),
                },
            ),
        }
    },
    "/api/users/{user_id}/bonus": {
        "get": {
            "summary": "A user's bonus balance and ledger entries (an unknown user has none)",
            "parameters": [path_id("user_id", "the shop's user id")],
            "responses": protected(
                {"200": ok(ref("UserBonus"), "balance and entries"), **ID_ANSWERS},
            ),
        }
    },
    "/api/events": {
        "get": {
            "summary": "The inbox's webhooks, newest first, filtered (all filters must hold)",
            "description": (
                "Page with `cursor`: events that arrive meanwhile are newer and never move a"
                " page; each event is on one page only. `outcome` is derived, so no index holds"
                f" it: a page filtered by it reads at most {inbox_view.MAX_SCAN} events and may"
                " hold fewer than `limit` (even none) with a `next_cursor`: follow it."
            ),
            "parameters": EVENT_QUERY,
            "responses": protected(
                {
                    "200": ok(ref("EventPage"), "the page"),
                    "400": problem("a bad filter, limit or cursor", "invalid_request"),
                },
            ),
        }
    },
    "/api/events/{event_id}": {
        "get": {
            "summary": "One webhook: headers, body, outcome and any dead letter of it",
            "parameters": [
                path_id("event_id", "the provider's event id (X-Hub's X-Webhook-Id, ...)"),
                {**PROVIDER_QUERY, "description": "whose event (default xhub)"},
            ],
            "responses": protected(
                {
                    "200": ok(ref("EventDetail"), "the event; without RabbitMQ, from the database"),
                    **ID_ANSWERS,
                    "404": problem("no such event in the inbox", "not_found"),
                },
            ),
        }
    },
    "/api/dlq": {
        "get": {
            "summary": "Every DLQ: its messages and the age of its oldest",
            "responses": protected(
                {"200": ok(ref("DlqList"), "one entry per DLQ")},
                unavailable=("unavailable", "dlq_busy"),
            ),
        }
    },
    "/api/dlq/{queue}": {
        "get": {
            "summary": "A page of a DLQ's messages, in queue order (nothing moves)",
            "description": (
                "Page with `cursor`: the `next_cursor` of the page before. If that page's last"
                " message has left the DLQ since, the page starts at the DLQ's head again:"
                " messages may repeat, none is skipped."
            ),
            "parameters": [
                QUEUE,
                {**PROVIDER_QUERY, "description": "only the letters of this provider's webhooks"},
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_PAGE,
                        "default": 100,
                    },
                },
                {
                    "name": "cursor",
                    "in": "query",
                    "schema": STR,
                    "description": "opaque: a `next_cursor`; not with `offset`",
                },
                {
                    "name": "offset",
                    "in": "query",
                    "deprecated": True,
                    "schema": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET},
                    "description": "messages to skip; use `cursor`",
                },
            ],
            "responses": protected(
                {
                    "200": ok(ref("DlqPage"), "the page"),
                    "400": problem("bad limit, offset or cursor", "invalid_request"),
                    "404": problem("no such DLQ", "not_found"),
                },
                unavailable=("unavailable", "dlq_busy"),
            ),
        }
    },
    "/api/dlq/{queue}/requeue": {
        "post": {
            "summary": "Move the selected messages back to their original queue",
            "parameters": [QUEUE],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref("RequeueRequest")}},
            },
            "responses": protected(
                {
                    "200": ok(ref("RequeueResult"), "what moved (or would move)"),
                    "400": problem("not JSON, or a selection that is not one", "invalid_request"),
                    "404": problem("no such DLQ", "not_found"),
                    "409": problem(
                        "an original queue is gone: that message stays in the DLQ",
                        "requeue_unroutable",
                    ),
                    **BODY_ERRORS,
                },
                unavailable=("unavailable", "dlq_busy"),
            ),
        }
    },
    "/api/unrouted": {
        "get": {
            "summary": "The unrouted queue: depth, oldest, count per event type, first messages",
            "parameters": [
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": unrouted.MAX_SHOWN,
                        "default": 100,
                    },
                }
            ],
            "responses": protected(
                {
                    "200": ok(ref("Unrouted"), "the look"),
                    "400": problem("bad limit", "invalid_request"),
                },
                unavailable=("unavailable", "dlq_busy"),
            ),
        }
    },
    "/api/audit": {
        "get": {
            "summary": "The operator actions (requeues, purges, registrations), newest first",
            "parameters": [
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": audit.MAX_LIMIT,
                        "default": 100,
                    },
                },
                {"name": "cursor", "in": "query", "schema": STR, "description": "a `next_cursor`"},
            ],
            "responses": protected(
                {
                    "200": ok(ref("AuditPage"), "the page"),
                    "400": problem("bad limit or cursor", "invalid_request"),
                },
            ),
        }
    },
    "/api/replay": {
        "post": {
            "summary": "Send stored webhooks again to chosen workers (dry run: count only)",
            "description": (
                "Each worker gets what it takes of an event: the orders worker the webhook as"
                " stored, bonuses and emails the order transitions it caused. Effects stay"
                " exactly once by the workers' keys (`would_skip` counts the copies they will"
                " skip); `reprocess` lets orders and bonuses apply again what they marked"
                " processed. Recorded in the audit trail (not dry runs)."
            ),
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref("ReplayRequest")}},
            },
            "responses": protected(
                {
                    "200": ok(ref("ReplayResult"), "what was sent (or would be), per worker"),
                    "400": problem("not JSON, or a field that is not right", "invalid_request"),
                    "409": problem("a worker's queue did not take a message", "replay_unroutable"),
                    "422": problem("more events than one run replays", "replay_too_large"),
                    **BODY_ERRORS,
                },
            ),
        }
    },
    PATH: {
        "get": {
            **OPEN,
            "summary": "This document (no token: a contract holds no data)",
            "responses": {
                "200": ok({"type": "object"}, "OpenAPI 3.1"),
                "503": unavailable_answer("unavailable"),
            },
        }
    },
    "/healthz": {
        "get": {
            **OPEN,
            "summary": "The process is alive",
            "responses": {"200": ok(object_of({"status": {"const": "ok"}}), "alive")},
        }
    },
    "/readyz": {
        "get": {
            **OPEN,
            "summary": "A real round trip to PostgreSQL and RabbitMQ",
            "responses": {
                "200": ok(
                    object_of({"status": {"const": "ready"}, "serving": _SERVING}),
                    "ready, and which server of each dependency it is on",
                ),
                "503": ok(
                    object_of(
                        {
                            "status": {"const": "unavailable"},
                            "failing": list_of(STR),
                            "serving": _SERVING,
                        }
                    ),
                    "the failing checks, by name",
                ),
            },
        }
    },
    "/metrics": {
        "get": {
            **OPEN,
            "summary": "Prometheus metrics",
            "responses": {"200": ok(STR, "Prometheus text format", "text/plain")},
        }
    },
}

# An `orders` token is refused everywhere but its allow-list: derived, never declared twice.
for _path, _operations in PATHS.items():
    for _method, _operation in _operations.items():
        if _operation.get("security") != [] and (_method.upper(), _path) not in ORDERS_ROUTES:
            _operation["responses"]["403"] = problem(
                "an `orders` token: this needs `operator`", "forbidden"
            )
