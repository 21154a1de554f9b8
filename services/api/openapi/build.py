"""Building blocks of the api's OpenAPI document: schemas, answers, parameters."""

from __future__ import annotations

from typing import Any

from services.api.responses import PROBLEM_JSON
from shared.ops import dlq, inbox_view

PATH = "/api/openapi.json"

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def object_of(properties: dict[str, Schema], *, optional: tuple[str, ...] = ()) -> Schema:
    """An object with exactly these members, all present unless optional."""
    return {
        "type": "object",
        "required": [p for p in properties if p not in optional],
        "properties": properties,
        "additionalProperties": False,
    }


def list_of(items: Schema) -> Schema:
    return {"type": "array", "items": items}


STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
TIME: Schema = {"type": "string", "format": "date-time"}
MONEY: Schema = {"type": "string", "pattern": r"^[0-9]+\.[0-9]{2}$", "examples": ["100.00"]}


def ok(schema: Schema, description: str, media: str = "application/json") -> Schema:
    return {"description": description, "content": {media: {"schema": schema}}}


def problem(description: str, *codes: str) -> Schema:
    """An error answer whose `code` is one of `codes`."""
    schema = {"allOf": [ref("Problem"), {"properties": {"code": {"enum": list(codes)}}}]}
    return {
        "description": f"{description} (code: {', '.join(codes)})",
        "content": {PROBLEM_JSON: {"schema": schema}},
    }


def unavailable_answer(*codes: str) -> Schema:
    answer = problem("PostgreSQL or RabbitMQ unavailable, or the DLQ busy; retry later", *codes)
    answer["headers"] = {"Retry-After": {"schema": INT, "description": "seconds"}}
    # Shed by shared/process/http_limits.py before the api's own code runs: too many in flight.
    answer["content"]["application/json"] = {"schema": ref("Shed")}
    return answer


def protected(
    responses: dict[str, Schema], *, unavailable: tuple[str, ...] = ("unavailable",)
) -> dict[str, Any]:
    """The answers every route behind the admin token may give besides its own (the 403 of an
    `orders` token is added from services/api/auth.py's allow-list: paths.py)."""
    return {
        **responses,
        "401": problem("missing or invalid admin token", "unauthorized"),
        "500": problem("a bug, logged", "internal_error"),
        "503": unavailable_answer(*unavailable),
    }


BODY_ERRORS = {
    "408": problem("the body did not arrive in time", "request_timeout"),
    "413": problem("the body is over 1 MiB", "payload_too_large"),
}


def path_id(name: str, description: str) -> Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": f"{description}; one with a NUL character is 400",
        "schema": STR,
    }


ID_ANSWERS = {"400": problem("the id contains a NUL character", "invalid_request")}
QUEUE = {
    "name": "queue",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "enum": list(dlq.QUEUES)},
    "description": "the work queue whose DLQ this is; any other name is 404",
}

# A stored webhook as every view describes it (shared/ops/inbox_view.py webhook_json).
WEBHOOK: dict[str, Schema] = {
    "event_id": STR,
    "provider": {
        **STR,
        "description": "who sent it (xhub, standard, ...): event ids are unique per provider",
    },
    "event": STR,
    "payment_id": nullable(STR),
    "received_at": TIME,
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
PROVIDER_QUERY: Schema = {
    "name": "provider",
    "in": "query",
    "schema": {**STR, "examples": ["standard"]},
    "description": "whose webhooks (a provider's name: xhub, standard, ...)",
}
EVENT_QUERY: list[Schema] = [
    {"name": "payment_id", "in": "query", "schema": STR},
    PROVIDER_QUERY,
    {"name": "event", "in": "query", "schema": {**STR, "examples": ["refund.failed"]}},
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
            "schema": STR,
            "description": f"received {word} (inclusive); ISO 8601, UTC without an offset",
        }
        for name, word in (("since", "at or after"), ("until", "at or before"))
    ),
    {
        "name": "cursor",
        "in": "query",
        "schema": STR,
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
