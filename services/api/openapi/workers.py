"""The workers' operator controls in the OpenAPI document (services/api/worker_routes.py):
their paths and schemas, merged into PATHS and SCHEMAS by services/api/openapi/__init__.py."""

from __future__ import annotations

from typing import Any

from services.api.openapi.build import (
    BODY_ERRORS,
    STR,
    TIME,
    Schema,
    list_of,
    nullable,
    object_of,
    ok,
    problem,
    protected,
    ref,
)
from shared.ops import worker_input
from shared.queries import worker_controls

_WORKER = {
    "name": "worker",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "enum": [*worker_input.WORKERS, "emails"]},
    "description": "`emails` (the queue's name) is the email worker; any other name is 404",
}
_NOT_FOUND = problem("no such worker", "not_found")
_FORBIDDEN = problem("an `orders` token: this needs `operator`", "forbidden")


def _action(summary: str, answers: dict[str, Schema], body: str | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary,
        "parameters": [_WORKER],
        "responses": protected(
            {
                "200": ok(ref("WorkerChanged"), "done: the worker's controls now, and before"),
                "404": _NOT_FOUND,
                "403": _FORBIDDEN,
                **answers,
            }
        ),
    }
    if body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": ref(body)}},
        }
    return operation


_STATE = problem("the worker is in that state already", "worker_state")
_BAD = problem("not JSON, or a bad field", "invalid_request")

WORKER_PATHS: dict[str, Any] = {
    "/api/workers": {
        "get": {
            "summary": "Each worker's operator pause and rate limit (shared by its replicas)",
            "responses": protected({"200": ok(ref("Workers"), "every worker"), "403": _FORBIDDEN}),
        }
    },
    "/api/workers/{worker}/pause": {
        "post": _action(
            "Pause every replica of a worker (it stops taking messages; they wait in RabbitMQ)",
            {"400": _BAD, "409": _STATE, **BODY_ERRORS},
            "WorkerPause",
        )
    },
    "/api/workers/{worker}/resume": {
        "post": _action("End an operator's pause of a worker", {"409": _STATE})
    },
    "/api/workers/{worker}/throttle": {
        "post": _action(
            "Cap the messages a worker takes per second, over all its replicas (replaces a cap)",
            {"400": _BAD, **BODY_ERRORS},
            "WorkerThrottle",
        ),
        "delete": _action("Lift a worker's rate limit", {"409": _STATE}),
    },
}

_CONTROLS: dict[str, Schema] = {
    "worker": {"type": "string", "enum": list(worker_input.WORKERS)},
    "paused": {"type": "boolean"},
    "paused_at": nullable(TIME),
    "paused_by": nullable({**STR, "description": "a token's name, or cli:<OS user>"}),
    "paused_reason": nullable(STR),
    "rate_limit_per_second": nullable({"type": "number"}),
    "throttled_at": nullable(TIME),
    "throttled_by": nullable(STR),
}

WORKER_SCHEMAS: dict[str, Schema] = {
    "WorkerControls": object_of(_CONTROLS),
    "Workers": object_of({"workers": list_of(ref("WorkerControls"))}),
    "WorkerChanged": object_of(
        {
            **_CONTROLS,
            "previous": {
                "type": "object",
                "description": "what the action ended or replaced (a resume: who paused, why,"
                " since when; a throttle: the cap before, or null)",
            },
        }
    ),
    "WorkerPause": object_of(
        {
            "reason": {
                "type": "string",
                "minLength": 1,
                "maxLength": worker_input.MAX_REASON_CHARS,
                "description": "why: shown wherever the pause is",
            }
        }
    ),
    "WorkerThrottle": object_of(
        {
            "per_second": {
                "type": "number",
                "minimum": worker_controls.MIN_RATE,
                "maximum": worker_controls.MAX_RATE,
                "description": "messages per second, over all the worker's replicas",
            }
        }
    ),
}
