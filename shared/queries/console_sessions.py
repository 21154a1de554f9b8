"""console_sessions: the operator console's sign-ins, found by the SHA-256 of the cookie's
value (services/api/console/sessions.py); expired rows are deleted at each sign-in."""

from __future__ import annotations

import datetime as dt

from shared.db import Executor


async def open_session(
    conn: Executor, id_hash: bytes, actor: str, token_fingerprint: bytes, lifetime: dt.timedelta
) -> None:
    # Expired sessions are nobody's: deleted here, the table needs no job of its own.
    await conn.execute("DELETE FROM console_sessions WHERE expires_at <= now()")
    await conn.execute(
        "INSERT INTO console_sessions (id_hash, actor, token_fingerprint, expires_at)"
        " VALUES ($1, $2, $3, now() + $4::interval)",
        id_hash,
        actor,
        token_fingerprint,
        lifetime,
    )


async def live_session(conn: Executor, id_hash: bytes) -> tuple[str, bytes] | None:
    """(actor, token fingerprint) of an unexpired session; None if there is none."""
    row = await conn.fetchrow(
        "SELECT actor, token_fingerprint FROM console_sessions"
        " WHERE id_hash = $1 AND expires_at > now()",
        id_hash,
    )
    return None if row is None else (row["actor"], bytes(row["token_fingerprint"]))


async def close_session(conn: Executor, id_hash: bytes) -> None:
    await conn.execute("DELETE FROM console_sessions WHERE id_hash = $1", id_hash)
