"""POST /api/erasures: erase a person's data (shared/ops/erasure.py): parse, call the one
audited function, answer."""

from __future__ import annotations

from pathlib import Path

import orjson
from aiohttp import web

from services.api.auth import actor
from services.api.responses import json_response, problem
from shared.db import DB_POOL
from shared.ops import archive, erasure
from shared.ops.archive_files import ArchiveCorruptError
from shared.ops.operator_actions import Edge, Operator, erase_recorded
from shared.process.http_limits import read_body

FIELDS = ("email", "user_id", "order_id")
# The inbox's archives an erasure rewrites (Settings.archive_dir; None: not configured here).
ARCHIVE_DIR: web.AppKey[Path | None] = web.AppKey("archive_dir")


async def erase_person(request: web.Request) -> web.Response:
    try:
        data = orjson.loads(await read_body(request))
    except orjson.JSONDecodeError:
        return problem(400, "invalid_request", "body is not valid JSON")
    if not isinstance(data, dict):
        return problem(400, "invalid_request", "body must be a JSON object")
    if unknown := sorted(set(data) - set(FIELDS)):
        return problem(400, "invalid_erasure", f"not a field of an erasure: {', '.join(unknown)}")
    try:
        selector = erasure.parse_selector(*(data.get(f) for f in FIELDS))
    except erasure.ErasureInputError as e:
        return problem(400, "invalid_erasure", str(e))
    try:
        erased = await erase_recorded(
            request.app[DB_POOL],
            selector,
            Operator(actor(request).name, Edge.API),
            request.app[ARCHIVE_DIR],
        )
    except erasure.PersonNotFoundError as e:
        return problem(404, "not_found", str(e))
    except (ArchiveCorruptError, archive.ArchivesUnreachableError) as e:
        # Nothing was erased: an erasure that left an archive holding the address is none.
        return problem(503, "archives_unavailable", f"nothing erased: {e}")
    return json_response(erased.as_json())
