"""The api's contract as an OpenAPI 3.1 document, served at PATH; the one source of truth.
tests/integration/test_api_contract.py holds the app and its answers to it."""

from __future__ import annotations

from typing import Any

from services.api.dlq_routes import MAX_OFFSET, MAX_PAGE
from services.api.responses import PROBLEM_JSON, PROBLEMS
from shared import dlq, inbox_view, unrouted
from shared.vocabulary import OrderStatus

PATH = "/api/openapi.json"

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _object(properties: dict[str, Schema], *, optional: tuple[str, ...] = ()) -> Schema:
    """An object with exactly these members, all present unless optional."""
    return {
        "type": "object",
        "required": [p for p in properties if p not in optional],
        "properties": properties,
        "additionalProperties": False,
    }


def _list(items: Schema) -> Schema:
    return {"type": "array", "items": items}


_STR: Schema = {"type": "string"}
_INT: Schema = {"type": "integer"}
_TIME: Schema = {"type": "string", "format": "date-time"}
_MONEY: Schema = {"type": "string", "pattern": r"^[0-9]+\.[0-9]{2}$", "examples": ["100.00"]}


def _ok(schema: Schema, description: str, media: str = "application/json") -> Schema:
    return {"description": description, "content": {media: {"schema": schema}}}


def _problem(description: str, *codes: str) -> Schema:
    """An error answer whose `code` is one of `codes`."""
    schema = {"allOf": [_ref("Problem"), {"properties": {"code": {"enum": list(codes)}}}]}
    return {
        "description": f"{description} (code: {', '.join(codes)})",
        "content": {PROBLEM_JSON: {"schema": schema}},
    }


def _unavailable(*codes: str) -> Schema:
    answer = _problem("PostgreSQL or RabbitMQ unavailable, or the DLQ busy; retry later", *codes)
    answer["headers"] = {"Retry-After": {"schema": _INT, "description": "seconds"}}
    # Shed by shared/http_limits.py before the api's own code runs: too many in flight.
    answer["content"]["application/json"] = {"schema": _ref("Shed")}
    return answer


def _protected(responses: dict[str, Schema], *, unavailable: tuple[str, ...]) -> dict[str, Any]:
    """The answers every route behind the admin token may give besides its own."""
    return {
        **responses,
        "401": _problem("missing or invalid admin token", "unauthorized"),
        "500": _problem("a bug, logged", "internal_error"),
        "503": _unavailable(*unavailable),
    }


_BODY_ERRORS = {
    "408": _problem("the body did not arrive in time", "request_timeout"),
    "413": _problem("the body is over 1 MiB", "payload_too_large"),
}


def _path_id(name: str, description: str) -> Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": f"{description}; one with a NUL character is 400",
        "schema": _STR,
    }


_ID_ANSWERS = {"400": _problem("the id contains a NUL character", "invalid_request")}
_QUEUE = {
    "name": "queue",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "enum": list(dlq.QUEUES)},
    "description": "the work queue whose DLQ this is; any other name is 404",
}

# A stored webhook as every view describes it (shared/inbox_view.py webhook_json).
_WEBHOOK: dict[str, Schema] = {
    "event_id": _STR,
    "event": _STR,
    "payment_id": _nullable(_STR),
    "received_at": _TIME,
    "duplicates": {"type": "integer", "description": "copies received after the first"},
    "published": {"type": "boolean", "description": "RabbitMQ confirmed its publish"},
    "outcome": {
        "type": "string",
        "description": (
            "what the orders worker decided, else `dead_lettered: <reason>` (where the DLQs are"
            f" read), `{inbox_view.QUEUED}` or `{inbox_view.UNPUBLISHED}`"
        ),
    },
}
_EVENT_QUERY: list[Schema] = [
    {"name": "payment_id", "in": "query", "schema": _STR},
    {"name": "event", "in": "query", "schema": {**_STR, "examples": ["refund.failed"]}},
    {
        "name": "outcome",
        "in": "query",
        "schema": {"type": "string", "enum": list(inbox_view.OUTCOME_FILTERS)},
        "description": "a decision of the orders worker, or "
        + "; ".join(f"`{k}`: {v}" for k, v in inbox_view.OUTCOME_GROUPS.items()),
    },
    *(
        {
            "name": name,
            "in": "query",
            "schema": _STR,
            "description": f"received {word} (inclusive); ISO 8601, UTC without an offset",
        }
        for name, word in (("since", "at or after"), ("until", "at or before"))
    ),
    {
        "name": "cursor",
        "in": "query",
        "schema": _STR,
        "description": "opaque: the `next_cursor` of the page before",
    },
    {
        "name": "limit",
        "in": "query",
        "schema": {
            "type": "integer",
            "minimum": 1,
            "maximum": inbox_view.MAX_LIMIT,
            "default": inbox_view.DEFAULT_LIMIT,
        },
    },
]

_SCHEMAS: dict[str, Schema] = {
    "Problem": {
        "description": "RFC 9457 problem details, plus `code` and the older `error`.",
        "type": "object",
        "required": ["type", "title", "status", "detail", "code", "error"],
        "properties": {
            "type": {
                "type": "string",
                "description": "urn:payhooks:problem:<code>, or about:blank for http_error",
            },
            "title": _STR,
            "status": {"type": "integer", "minimum": 400, "maximum": 599},
            "detail": _STR,
            "code": {
                "type": "string",
                "enum": list(PROBLEMS),
                "description": "stable and machine-readable: what clients branch on",
            },
            "error": {
                "type": "string",
                "description": "the message of the api before problem details (kept)",
            },
            "fields": {
                "type": "object",
                "additionalProperties": _STR,
                "description": "invalid_order: one message per bad field",
            },
        },
        "additionalProperties": False,
    },
    "Shed": _object({"status": {"const": "unavailable"}, "error": _STR}),
    "NewOrder": {
        "type": "object",
        "required": ["order_id", "payment_id", "user_id", "email", "amount", "currency"],
        "properties": {
            **{
                name: {"type": "string", "minLength": 1, "maxLength": 255}
                for name in ("order_id", "payment_id", "user_id")
            },
            "email": {"type": "string", "maxLength": 255, "examples": ["buyer@example.com"]},
            "amount": {
                "type": "string",
                "pattern": r"^[0-9]{1,15}(\.[0-9]{1,2})?$",
                "description": "greater than 0",
                "examples": ["100.00"],
            },
            "currency": {"type": "string", "pattern": "^[A-Z]{3}$", "examples": ["USD"]},
        },
    },
    "Order": _object(
        {
            "order_id": _STR,
            "payment_id": _STR,
            "user_id": _STR,
            "email": _STR,
            "amount": _MONEY,
            "currency": _STR,
            "status": {"type": "string", "enum": [s.value for s in OrderStatus]},
            "refunded_amount": _MONEY,
            "updated_at": _TIME,
        }
    ),
    "DeadLetter": _object(
        {
            "id": _STR,
            "event_id": _nullable(_STR),
            "event": _nullable(_STR),
            "payment_id": _nullable(_STR),
            "reason": _STR,
            "error": _nullable(_STR),
            "attempts": _nullable(_INT),
            "first_failed_at": _nullable(_STR),
            "last_failed_at": _nullable(_STR),
            "original_queue": _STR,
            "requeued": _INT,
        }
    ),
    "PaymentView": _object(
        {
            "order": _nullable(_ref("Order")),
            "undecided": _nullable(_object({"reason": _nullable(_STR), "since": _TIME})),
            "events": _list(
                _object(
                    {
                        **_WEBHOOK,
                        "status": {"description": "the event's status, as the provider sent it"},
                    }
                )
            ),
            "refund_failures": _list(
                _object(
                    {
                        "event_id": _STR,
                        "event": _STR,
                        "refund_id": {"description": "as the provider sent it"},
                        "received_at": _TIME,
                    }
                )
            ),
            "transitions": _list(
                _object({"id": _INT, "from": _STR, "to": _STR, "event_id": _STR, "at": _TIME})
            ),
            "bonus": _list(
                _object(
                    {
                        "kind": {"enum": ["grant", "clawback", "restore"]},
                        "points": _INT,
                        "user_id": _STR,
                        "event_id": _STR,
                        "transition_id": _nullable(_INT),
                        "created_at": _TIME,
                    }
                )
            ),
            "emails": _list(
                _object(
                    {
                        "template": _STR,
                        "message_id": _STR,
                        "recipient": _STR,
                        "sent_at": _nullable(_TIME),
                        "skipped": {"type": "boolean"},
                    }
                )
            ),
            "dead_letters": _list(_ref("DeadLetter")),
            "dead_letters_unavailable": {
                "type": "string",
                "description": "present when the DLQs could not be read (RabbitMQ down, busy)",
            },
        },
        optional=("dead_letters_unavailable",),
    ),
    "Event": _object(_WEBHOOK),
    "EventPage": _object(
        {
            "events": _list(_ref("Event")),
            "next_cursor": {
                **_nullable(_STR),
                "description": "`cursor` of the next page; null on the last one",
            },
        }
    ),
    "EventDetail": _object(
        {
            **_WEBHOOK,
            "last_seen_at": {**_TIME, "description": "when its latest copy came"},
            "headers": {
                "type": "object",
                "additionalProperties": _STR,
                "description": "as received, without the signature and other credentials",
            },
            "body": {"description": "the JSON it holds, or its text (body_format)"},
            "body_format": {"enum": ["json", "text"]},
            "dead_letters": _list(_ref("DeadLetter")),
            "dead_letters_unavailable": {
                "type": "string",
                "description": "present when the DLQs could not be read (RabbitMQ down, busy)",
            },
        },
        optional=("dead_letters_unavailable",),
    ),
    "UserBonus": _object(
        {
            "user_id": _STR,
            "balance": _INT,
            "entries": _list(
                _object(
                    {
                        "payment_id": _STR,
                        "kind": {"enum": ["grant", "clawback", "restore"]},
                        "points": _INT,
                        "created_at": _TIME,
                    }
                )
            ),
        }
    ),
    "DlqList": _object(
        {
            "queues": _list(
                _object(
                    {
                        "queue": _STR,
                        "messages": _INT,
                        "oldest_age_seconds": _nullable({"type": "number"}),
                    }
                )
            )
        }
    ),
    "DlqPage": _object(
        {
            "queue": _STR,
            "total": _INT,
            "offset": {"type": "integer", "description": "where this page starts"},
            "limit": _INT,
            "messages": _list(_ref("DeadLetter")),
            "next_cursor": {
                **_nullable(_STR),
                "description": "`cursor` of the next page; null on the last one",
            },
        }
    ),
    "RequeueRequest": {
        "type": "object",
        "description": 'Say what to requeue: "ids", "all": true, or a filter (all must hold).',
        "properties": {
            "ids": {**_list(_STR), "description": "message or event ids"},
            "all": {"type": "boolean", "default": False},
            "dry_run": {"type": "boolean", "default": False},
            "limit": {"type": "integer", "minimum": 1},
            "reason": _nullable(_STR),
            "event_type": _nullable(_STR),
            "payment_id": _nullable(_STR),
            "since": {**_nullable(_STR), "description": "ISO 8601, UTC without an offset"},
            "until": {**_nullable(_STR), "description": "ISO 8601, UTC without an offset"},
        },
    },
    "RequeueResult": _object(
        {
            "requeued": _INT,
            "would_requeue": {**_nullable(_INT), "description": "dry runs only"},
            "dry_run": {"type": "boolean"},
            "ids": _list(_STR),
            "not_found": _list(_STR),
        }
    ),
    "Unrouted": _object(
        {
            "queue": _STR,
            "total": _INT,
            "oldest_age_seconds": _nullable({"type": "number"}),
            "by_event": {"type": "object", "additionalProperties": _INT},
            "shown": _INT,
            "messages": _list(
                _object(
                    {
                        "id": _STR,
                        "event": _nullable(_STR),
                        "payment_id": _nullable(_STR),
                        "provider": _nullable(_STR),
                        "published_at": _nullable(_TIME),
                    }
                )
            ),
        }
    ),
}

_OPEN: dict[str, Any] = {"security": []}

_PATHS: dict[str, Any] = {
    "/api/orders": {
        "post": {
            "summary": "Register an order (idempotent on order_id)",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("NewOrder")}},
            },
            "responses": _protected(
                {
                    "200": _ok(_ref("Order"), "already registered with the same details"),
                    "201": _ok(_ref("Order"), "registered"),
                    "400": _problem("not JSON, or bad fields", "invalid_request", "invalid_order"),
                    "409": _problem(
                        "order or payment id registered with other details", "order_conflict"
                    ),
                    **_BODY_ERRORS,
                },
                unavailable=("unavailable",),
            ),
        }
    },
    "/api/orders/{order_id}": {
        "get": {
            "summary": "An order",
            "parameters": [_path_id("order_id", "the shop's order id")],
            "responses": _protected(
                {
                    "200": _ok(_ref("Order"), "the order"),
                    **_ID_ANSWERS,
                    "404": _problem("no such order", "not_found"),
                },
                unavailable=("unavailable",),
            ),
        }
    },
    "/api/payments/{payment_id}": {
        "get": {
            "summary": "Everything known about a payment (the support view)",
            "parameters": [_path_id("payment_id", "the provider's payment id")],
            "responses": _protected(
                {
                    "200": _ok(
                        _ref("PaymentView"),
                        "the payment; without RabbitMQ, from the database alone",
                    ),
                    **_ID_ANSWERS,
                    "404": _problem("no order and no webhook for it", "not_found"),
                },
                unavailable=("unavailable",),
            ),
        }
    },
    "/api/users/{user_id}/bonus": {
        "get": {
            "summary": "A user's bonus balance and ledger entries (an unknown user has none)",
            "parameters": [_path_id("user_id", "the shop's user id")],
            "responses": _protected(
                {"200": _ok(_ref("UserBonus"), "balance and entries"), **_ID_ANSWERS},
                unavailable=("unavailable",),
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
            "parameters": _EVENT_QUERY,
            "responses": _protected(
                {
                    "200": _ok(_ref("EventPage"), "the page"),
                    "400": _problem("a bad filter, limit or cursor", "invalid_request"),
                },
                unavailable=("unavailable",),
            ),
        }
    },
    "/api/events/{event_id}": {
        "get": {
            "summary": "One webhook: headers, body, outcome and any dead letter of it",
            "parameters": [_path_id("event_id", "the provider's event id (X-Webhook-Id)")],
            "responses": _protected(
                {
                    "200": _ok(
                        _ref("EventDetail"), "the event; without RabbitMQ, from the database"
                    ),
                    **_ID_ANSWERS,
                    "404": _problem("no such event in the inbox", "not_found"),
                },
                unavailable=("unavailable",),
            ),
        }
    },
    "/api/dlq": {
        "get": {
            "summary": "Every DLQ: its messages and the age of its oldest",
            "responses": _protected(
                {"200": _ok(_ref("DlqList"), "one entry per DLQ")},
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
                _QUEUE,
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
                    "schema": _STR,
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
            "responses": _protected(
                {
                    "200": _ok(_ref("DlqPage"), "the page"),
                    "400": _problem("bad limit, offset or cursor", "invalid_request"),
                    "404": _problem("no such DLQ", "not_found"),
                },
                unavailable=("unavailable", "dlq_busy"),
            ),
        }
    },
    "/api/dlq/{queue}/requeue": {
        "post": {
            "summary": "Move the selected messages back to their original queue",
            "parameters": [_QUEUE],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("RequeueRequest")}},
            },
            "responses": _protected(
                {
                    "200": _ok(_ref("RequeueResult"), "what moved (or would move)"),
                    "400": _problem("not JSON, or a selection that is not one", "invalid_request"),
                    "404": _problem("no such DLQ", "not_found"),
                    "409": _problem(
                        "an original queue is gone: that message stays in the DLQ",
                        "requeue_unroutable",
                    ),
                    **_BODY_ERRORS,
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
            "responses": _protected(
                {
                    "200": _ok(_ref("Unrouted"), "the look"),
                    "400": _problem("bad limit", "invalid_request"),
                },
                unavailable=("unavailable", "dlq_busy"),
            ),
        }
    },
    PATH: {
        "get": {
            **_OPEN,
            "summary": "This document (no token: a contract holds no data)",
            "responses": {
                "200": _ok({"type": "object"}, "OpenAPI 3.1"),
                "503": _unavailable("unavailable"),
            },
        }
    },
    "/healthz": {
        "get": {
            **_OPEN,
            "summary": "The process is alive",
            "responses": {"200": _ok(_object({"status": {"const": "ok"}}), "alive")},
        }
    },
    "/readyz": {
        "get": {
            **_OPEN,
            "summary": "A real round trip to PostgreSQL and RabbitMQ",
            "responses": {
                "200": _ok(_object({"status": {"const": "ready"}}), "ready"),
                "503": _ok(
                    _object({"status": {"const": "unavailable"}, "failing": _list(_STR)}),
                    "the failing checks, by name",
                ),
            },
        }
    },
    "/metrics": {
        "get": {
            **_OPEN,
            "summary": "Prometheus metrics",
            "responses": {"200": _ok(_STR, "Prometheus text format", "text/plain")},
        }
    },
}

DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "payhooks admin api",
        "version": "1",
        "description": (
            "Operator and shop routes, behind `Authorization: Bearer <ADMIN_TOKEN>`. Errors"
            " are RFC 9457 problem details (application/problem+json) with a stable `code`."
            " A method a path does not have is 405 (method_not_allowed), an unknown path 404."
        ),
    },
    "security": [{"adminToken": []}],
    "paths": _PATHS,
    "components": {
        "schemas": _SCHEMAS,
        "securitySchemes": {"adminToken": {"type": "http", "scheme": "bearer"}},
    },
}
