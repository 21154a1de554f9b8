"""The audit trail (operator_actions): recorded after an action succeeded, where a failure
to record is logged loudly and never undoes the action; read newest first by keyset."""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from shared.db import Executor

log = structlog.get_logger(__name__)

REQUEUE = "dlq.requeue"
PURGE = "dlq.purge"
ORDER_REGISTER = "order.register"
REPLAY = "event.replay"
ORDER_RESOLVE = "order.resolve"
PERSON_ERASE = "person.erase"
WORKER_PAUSE = "worker.pause"
WORKER_RESUME = "worker.resume"
WORKER_THROTTLE = "worker.throttle"
WORKER_UNTHROTTLE = "worker.unthrottle"
ACTIONS = (
    REQUEUE,
    PURGE,
    ORDER_REGISTER,
    REPLAY,
    ORDER_RESOLVE,
    WORKER_PAUSE,
    WORKER_RESUME,
    WORKER_THROTTLE,
    WORKER_UNTHROTTLE,
    PERSON_ERASE,
)
SOURCES = ("api", "cli", "console")  # the operator_actions.source constraint (migration 013)
MAX_LIMIT = 1000
DEFAULT_LIMIT = 100


@dataclass(frozen=True, slots=True)
class Action:
    actor: str
    source: str  # one of SOURCES
    action: str  # REQUEUE, PURGE, ORDER_REGISTER
    target: str  # a DLQ's name, an order id
    ids: Sequence[str] = ()
    count: int = 0
    filter: Mapping[str, Any] = field(default_factory=dict)


def cli_actor() -> str:
    """`cli:` and the OS user who ran the command."""
    try:
        user = os.environ.get("USER") or getpass.getuser()
    except (OSError, KeyError):  # no such user in a container's passwd
        user = "unknown"
    return f"cli:{user}"


async def record(conn: Executor, action: Action) -> bool:
    """Insert the action; False (and an error logged) if it could not be."""
    try:
        await conn.execute(
            "INSERT INTO operator_actions (actor, source, action, target, filter, ids, count)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7)",
            action.actor,
            action.source,
            action.action,
            action.target,
            dict(action.filter),
            list(action.ids),
            action.count,
        )
    except Exception as e:  # whatever it is, the action stands: say so loudly
        not_recorded(action, e)
        return False
    return True


async def record_in_transaction(conn: Executor, action: Action) -> None:
    """Insert the action in the caller's transaction: an action that must not stand
    unrecorded (a resolution of an order) fails with its audit row."""
    await conn.execute(
        "INSERT INTO operator_actions (actor, source, action, target, filter, ids, count)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7)",
        action.actor,
        action.source,
        action.action,
        action.target,
        dict(action.filter),
        list(action.ids),
        action.count,
    )


def not_recorded(action: Action, error: BaseException) -> None:
    log.error(
        "audit_record_failed",
        error=f"{type(error).__name__}: {error}",
        actor=action.actor,
        source=action.source,
        action=action.action,
        target=action.target,
        count=action.count,
        ids=list(action.ids),
        note="the action itself succeeded; the audit trail misses it",
    )


async def page(conn: Executor, limit: int, before_id: int | None) -> list[dict[str, Any]]:
    """Up to `limit` actions, newest first, older than `before_id` when given."""
    rows = await conn.fetch(
        "SELECT id, at, actor, source, action, target, filter, ids, count FROM operator_actions"
        " WHERE $1::bigint IS NULL OR id < $1 ORDER BY id DESC LIMIT $2",
        before_id,
        limit,
    )
    return [{**dict(row), "at": row["at"].isoformat(), "ids": list(row["ids"])} for row in rows]


def next_cursor(actions: Sequence[Mapping[str, Any]], limit: int) -> str | None:
    """Opaque to clients: the id the next page starts below; None after the last page."""
    return str(actions[-1]["id"]) if len(actions) == limit else None


def parse_cursor(text: str) -> int:
    """ValueError if it is not one next_cursor gave."""
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        raise ValueError("cursor is not one this api gave")
    return int(text)
