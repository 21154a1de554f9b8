"""The OpenAPI document's paths and schemas of an order's resolution and of what is missing
(services/api/resolve_routes.py)."""

from __future__ import annotations

from typing import Any

from services.api.openapi.build import (
    BODY_ERRORS,
    ID_ANSWERS,
    INT,
    STR,
    TIME,
    Schema,
    list_of,
    nullable,
    object_of,
    ok,
    path_id,
    problem,
    protected,
    ref,
)
from shared.ops import missing
from shared.resolution import MAX_REASON_CHARS
from shared.vocabulary import OrderStatus

STATUS: Schema = {"type": "string", "enum": [s.value for s in OrderStatus]}

RESOLVE_PATHS: dict[str, Any] = {
    "/api/payments/{payment_id}/resolve": {
        "post": {
            "summary": "Resolve the payment's order: an audited transition by the operator",
            "description": (
                "Moves the order to `to` as the operator's transition (source `operator`), under"
                " the payment's lock; the bonus ledger and the emails follow it as they follow a"
                " provider's event. A move the order machine forbids needs `force` and is shown"
                " as forced. Refused (409 resolve_in_flight) while a provider event of the"
                " payment is parked or stored and not yet processed by the orders worker."
            ),
            "parameters": [path_id("payment_id", "the provider's payment id")],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref("ResolveRequest")}},
            },
            "responses": protected(
                {
                    "200": ok(ref("Resolution"), "resolved"),
                    **ID_ANSWERS,
                    "400": problem(
                        "not JSON, or bad fields", "invalid_request", "invalid_resolution"
                    ),
                    "404": problem("no order for the payment", "not_found"),
                    "409": problem(
                        "an event in flight, a forbidden move without force, or no change",
                        "resolve_in_flight",
                        "resolve_forbidden",
                        "resolve_no_change",
                    ),
                    **BODY_ERRORS,
                },
            ),
        }
    },
    "/api/missing": {
        "get": {
            "summary": "Undecided payments and refused event ids: what to ask the provider for",
            "parameters": [
                *(
                    {
                        "name": name,
                        "in": "query",
                        "schema": STR,
                        "description": f"{what}; ISO 8601, UTC without an offset",
                    }
                    for name, what in (
                        ("since", "window start (default: 35 days before `until`)"),
                        ("until", "window end (default: now)"),
                    )
                ),
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": missing.MAX_LIMIT,
                        "default": missing.DEFAULT_LIMIT,
                    },
                    "description": "at most this many of each list",
                },
            ],
            "responses": protected(
                {
                    "200": ok(ref("Missing"), "the lists"),
                    "400": problem("a bad time or limit", "invalid_request"),
                },
            ),
        }
    },
}

RESOLVE_SCHEMAS: dict[str, Schema] = {
    "ResolveRequest": {
        "type": "object",
        "required": ["to", "reason"],
        "properties": {
            "to": STATUS,
            "reason": {"type": "string", "minLength": 1, "maxLength": MAX_REASON_CHARS},
            "force": {"type": "boolean", "default": False},
        },
        "additionalProperties": False,
    },
    "Resolution": object_of(
        {
            "payment_id": STR,
            "from": STATUS,
            "to": STATUS,
            "forced": {"type": "boolean"},
            "reason": STR,
            "actor": STR,
            "transition_id": INT,
            "event_id": {"type": "string", "description": "operator:<uuid>, the transition's"},
            "order": ref("Order"),
        }
    ),
    "Missing": object_of(
        {
            "since": TIME,
            "until": TIME,
            "undecided": list_of(
                object_of(
                    {
                        "payment_id": STR,
                        "order_id": STR,
                        "status": STATUS,
                        "since": TIME,
                        "last_at": nullable(TIME),
                        "reason": nullable(STR),
                    }
                )
            ),
            "refused": list_of(
                object_of(
                    {
                        "provider": STR,
                        "event_id": STR,
                        "status": INT,
                        "outcome": STR,
                        "first_at": TIME,
                        "last_at": TIME,
                        "refusals": INT,
                    }
                )
            ),
        }
    ),
}

# Operator-only (services/api/auth.py ORDERS_ROUTES has neither): an `orders` token gets 403.
for _operations in RESOLVE_PATHS.values():
    for _operation in _operations.values():
        _operation["responses"]["403"] = problem(
            "an `orders` token: this needs `operator`", "forbidden"
        )
