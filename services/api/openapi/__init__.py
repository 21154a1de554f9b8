"""The api's contract as an OpenAPI 3.1 document, served at PATH; the one source of truth.
tests/integration/test_api_contract.py holds the app and its answers to it."""

from __future__ import annotations

from typing import Any

from services.api.openapi.build import PATH as PATH
from services.api.openapi.erasure_paths import ERASURE_PATHS, ERASURE_SCHEMAS
from services.api.openapi.paths import PATHS
from services.api.openapi.resolve_paths import RESOLVE_PATHS, RESOLVE_SCHEMAS
from services.api.openapi.schemas import SCHEMAS
from services.api.openapi.workers import WORKER_PATHS, WORKER_SCHEMAS

DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "payhooks admin api",
        "version": "1",
        "description": (
            "Operator and shop routes, behind `Authorization: Bearer <token>` (ADMIN_TOKEN, or"
            " one of ADMIN_TOKENS: scope `orders` reaches orders, payments, bonus and events;"
            " `operator` everything, else 403 forbidden). Errors"
            " are RFC 9457 problem details (application/problem+json) with a stable `code`."
            " A method a path does not have is 405 (method_not_allowed), an unknown path 404."
        ),
    },
    "security": [{"adminToken": []}],
    "paths": PATHS | RESOLVE_PATHS | WORKER_PATHS | ERASURE_PATHS,
    "components": {
        "schemas": SCHEMAS | RESOLVE_SCHEMAS | WORKER_SCHEMAS | ERASURE_SCHEMAS,
        "securitySchemes": {"adminToken": {"type": "http", "scheme": "bearer"}},
    },
}
