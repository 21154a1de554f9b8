"""Waking a loop up from PostgreSQL NOTIFY: a connection of its own that listens on a channel
and reconnects after losing it (the loop keeps its own interval meanwhile)."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import structlog

from shared.db import CONNECT_TIMEOUT_S, probe

log = structlog.get_logger(__name__)

_RELISTEN_S = 5.0
_PROBE_S = 30.0


async def listen_forever(
    database_url: str, channel: str, wake: asyncio.Event, failed_event: str
) -> None:
    """Set `wake` at every notification on `channel`, and once on each (re)connection for
    what was notified while nobody listened."""
    while True:
        try:
            conn = await asyncpg.connect(database_url, timeout=CONNECT_TIMEOUT_S)
            try:
                await conn.add_listener(channel, lambda *_args: wake.set())
                wake.set()
                while True:  # a connection lost without a word fails this probe
                    await asyncio.sleep(_PROBE_S)
                    await probe(conn)
            finally:
                with contextlib.suppress(Exception):
                    await conn.close(timeout=1)
        except Exception as e:  # PostgreSQL away: try again, the interval loop goes on
            log.warning(failed_event, error=repr(e))
        await asyncio.sleep(_RELISTEN_S)
