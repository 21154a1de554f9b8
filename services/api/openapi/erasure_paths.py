"""The OpenAPI document's path and schemas of an erasure (services/api/erasure_routes.py)."""

from __future__ import annotations

from typing import Any

from services.api.openapi.build import (
    BODY_ERRORS,
    INT,
    STR,
    Schema,
    list_of,
    object_of,
    ok,
    problem,
    protected,
    ref,
)
from shared.ops import erasure

ERASURE_PATHS: dict[str, Any] = {
    "/api/erasures": {
        "post": {
            "summary": "Erase a person's data: their email address everywhere, the money kept",
            "description": (
                "Exactly one of `email`, `user_id` (the addresses of that user's orders) or"
                " `order_id` (that order's address). Each address becomes"
                f" `{erasure.MARKER}` in every order registered with it so far, in the sent-email"
                " records and inside the stored raw bodies and headers of the inbox, the parked"
                " events, the outbox and the inbox's archives (`archives_unavailable`, nothing"
                " erased: an archive is corrupt or ARCHIVE_DIR is not set here); amounts,"
                " states, transitions, the ledger and the audit trail are kept. One"
                " transaction under the payments' locks; recorded in the audit trail"
                " (`person.erase`, without the address), a request that finds"
                " nothing left too. Idempotent: a second run changes no row (`erased` false)."
                " An address held nowhere is such an answer, not a 404."
            ),
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref("ErasureRequest")}},
            },
            "responses": protected(
                {
                    "200": ok(ref("Erasure"), "erased, or nothing left to erase"),
                    "400": problem(
                        "not JSON, not one well-formed selector",
                        "invalid_request",
                        "invalid_erasure",
                    ),
                    "403": problem("an `orders` token: this needs `operator`", "forbidden"),
                    "404": problem("no order with that user id or order id", "not_found"),
                    **BODY_ERRORS,
                },
                unavailable=("unavailable", "archives_unavailable"),
            ),
        }
    },
}

_ID: Schema = {"type": "string", "minLength": 1, "maxLength": erasure.MAX_ID_CHARS}

ERASURE_SCHEMAS: dict[str, Schema] = {
    "ErasureRequest": {
        "type": "object",
        "description": "exactly one of the three",
        "properties": {
            "email": {"type": "string", "minLength": 3, "maxLength": erasure.MAX_ADDRESS_CHARS},
            "user_id": _ID,
            "order_id": _ID,
        },
        "minProperties": 1,
        "maxProperties": 1,
        "additionalProperties": False,
    },
    "Erasure": object_of(
        {
            "by": {"type": "string", "enum": [b.value for b in erasure.By]},
            "erased": {"type": "boolean", "description": "false: no row was changed"},
            "rows_changed": INT,
            "rows": object_of(dict.fromkeys(erasure.TABLES, INT)),
            "orders": list_of(STR),
            "already_erased": list_of(STR),
            "marker": {"type": "string", "const": erasure.MARKER},
        }
    ),
}
