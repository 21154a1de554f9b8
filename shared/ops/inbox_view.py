"""The inbox as operators and shops look at it (api and CLI alike): events newest first,
filtered, paged by a keyset cursor; one event in full; how every view describes a webhook."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aio_pika.abc import AbstractChannel

from shared.amqp.topology import Topology
from shared.db import Executor
from shared.errors import UnavailableError
from shared.ops import dlq, dlq_lock
from shared.ops.connections import UnreachableError
from shared.ops.dlq import DeadLetter
from shared.ops.order_input import text_problem
from shared.order_machine import Reason
from shared.providers import registry
from shared.queries import inbox as inbox_sql
from shared.queries.inbox import EventFilter, Position, storable_text

QUEUED = "queued"
UNPUBLISHED = "stored, not yet published"
# The outcome filter: any decision of the orders worker, or one of these.
OUTCOME_GROUPS = {
    "processed": "the orders worker decided (any outcome)",
    QUEUED: "published, not processed yet (in its queue, a retry, or a DLQ)",
    "unpublished": f"{UNPUBLISHED} (the sweeper publishes it)",
}
OUTCOME_FILTERS = (*OUTCOME_GROUPS, *(r.value for r in Reason))
DEFAULT_LIMIT = 100
MAX_LIMIT = 500
# The outcome is derived (processed_events, inbox_unpublished), so no index holds it: a page
# filtered by it reads at most MAX_SCAN rows of the index-ordered listing, then ends with a
# cursor, full or not.
MAX_SCAN = 5000
_CHUNK = 1000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_US = dt.timedelta(microseconds=1)
_MAX_ROW_ID = 2**63 - 1
_WHOLE_NUMBER = re.compile(r"[0-9]{1,6}")


def outcome_of(row: Any, dead: DeadLetter | None) -> str:
    """What the orders worker decided, or where the event is if not yet processed."""
    if row["processed_outcome"]:
        return str(row["processed_outcome"])
    if dead is not None:
        return f"dead_lettered: {dead.reason}"
    return QUEUED if row["published"] else UNPUBLISHED


def webhook_json(row: Any, dead: DeadLetter | None) -> dict[str, Any]:
    """A stored webhook as every view shows it (a row of inbox_sql's descriptions)."""
    return {
        "event_id": row["event_id"],
        "provider": row["provider"],
        "event": row["event_type"],
        "payment_id": row["payment_id"],
        "received_at": row["received_at"].isoformat(),
        "duplicates": row["duplicates"],
        "published": row["published"],
        "outcome": outcome_of(row, dead),
    }


def _outcome_matches(wanted: str, row: Any) -> bool:
    if wanted == "processed":
        return row["processed_outcome"] is not None
    return outcome_of(row, None) == (UNPUBLISHED if wanted == "unpublished" else wanted)


class BadQueryError(ValueError):
    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name} {why}")
        self.name = name
        self.why = why


def encode_cursor(position: Position) -> str:
    """Opaque to clients: the (received_at in microseconds, id) of the last row of a page."""
    at, row_id = position
    data = orjson.dumps([(at - _EPOCH) // _ONE_US, row_id])
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _decode_cursor(text: str) -> Position:
    try:
        pair = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        us, row_id = pair
        if not all(type(v) is int for v in pair) or not 0 <= row_id <= _MAX_ROW_ID:
            raise ValueError(pair)
        return _EPOCH + dt.timedelta(microseconds=us), row_id
    except (ValueError, TypeError, OverflowError, binascii.Error):
        raise BadQueryError("cursor", "is not one this api gave") from None


def _time(name: str, text: str) -> dt.datetime:
    at = dlq.parse_time(text)
    try:
        # PostgreSQL gets it in UTC: an offset that takes it past year 1 or 9999 is no time.
        if at is not None:
            return at.astimezone(dt.UTC)
    except OverflowError:
        pass
    raise BadQueryError(name, "must be an ISO 8601 time, e.g. 2026-11-30T10:00:00Z")


def _text(name: str, value: str) -> str:
    if why := text_problem(value):
        raise BadQueryError(name, why)
    return storable_text(value)  # as ingest stored it


@dataclass(frozen=True, slots=True)
class EventQuery:
    where: EventFilter
    outcome: str | None
    after: Position | None
    limit: int

    @classmethod
    def parse(
        cls,
        *,
        payment_id: str | None = None,
        event: str | None = None,
        outcome: str | None = None,
        since: str | None = None,
        until: str | None = None,
        cursor: str | None = None,
        limit: str | None = None,
        provider: str | None = None,
    ) -> EventQuery:
        """From text as given (a query string, a command line); BadQueryError names the bad
        one. Times are ISO 8601, UTC without an offset, both inclusive."""
        if outcome is not None and outcome not in OUTCOME_FILTERS:
            raise BadQueryError("outcome", f"must be one of {', '.join(OUTCOME_FILTERS)}")
        count = DEFAULT_LIMIT
        if limit is not None:
            if not _WHOLE_NUMBER.fullmatch(limit) or not 1 <= int(limit) <= MAX_LIMIT:
                raise BadQueryError("limit", f"must be a whole number 1-{MAX_LIMIT}")
            count = int(limit)
        where = EventFilter(
            payment_id=None if payment_id is None else _text("payment_id", payment_id),
            event_type=None if event is None else _text("event", event),
            since=None if since is None else _time("since", since),
            until=None if until is None else _time("until", until),
            provider=None if provider is None else provider_name(provider),
        )
        if where.since is not None and where.until is not None and where.since > where.until:
            raise BadQueryError("until", "is before since")
        after = None if cursor is None else _decode_cursor(cursor)
        return cls(where, outcome, after, count)


def provider_name(text: str) -> str:
    """A provider's name as given (query, command line); BadQueryError unless the registry's."""
    if text not in registry.BY_NAME:
        raise BadQueryError("provider", f"must be one of {', '.join(registry.BY_NAME)}")
    return text


def _position(row: Any) -> Position:
    return row["received_at"], row["id"]


async def list_events(db: Executor, query: EventQuery) -> dict[str, Any]:
    """A page of the inbox, newest first, and the cursor of the next (None: the last page).
    Filtered by outcome, a page may hold fewer events than the limit and still have a next."""
    kept: list[Any] = []
    position, scanned = query.after, 0
    async with inbox_sql.planned_for_values(db) as conn:
        while True:
            size = query.limit + 1 if query.outcome is None else min(_CHUNK, MAX_SCAN - scanned)
            rows = await inbox_sql.events_before(conn, query.where, position, size)
            scanned += len(rows)
            for row in rows:
                if query.outcome is None or _outcome_matches(query.outcome, row):
                    if len(kept) == query.limit:  # one more than the page: there is a next
                        return _page(kept, _position(kept[-1]))
                    kept.append(row)
            if len(rows) < size:
                return _page(kept, None)  # the inbox ends here
            position = _position(rows[-1])
            if scanned >= MAX_SCAN:
                return _page(kept, position)  # the next page reads on from here


def _page(rows: list[Any], after: Position | None) -> dict[str, Any]:
    return {
        "events": [webhook_json(row, None) for row in rows],
        "next_cursor": None if after is None else encode_cursor(after),
    }


async def dead_letters_for_event(
    channel: AbstractChannel, topology: Topology, event_id: str
) -> list[DeadLetter]:
    """Every DLQ's messages about one event (order.* messages name it as their source)."""
    letters: list[DeadLetter] = []
    for queue in dlq.QUEUES:
        found = await dlq.show(
            channel, dlq.dlq_name(topology, queue), lock_wait_s=dlq_lock.VIEW_LOCK_WAIT_S
        )
        letters.extend(d for d in found if d.event_id == event_id)
    return letters


async def event_view(
    db: Executor,
    event_id: str,
    read_dead_letters: Callable[[str], Awaitable[list[DeadLetter]]],
    provider: str = registry.DEFAULT.name,
) -> dict[str, Any] | None:
    """One stored webhook of `provider` (event ids are unique per provider only) with its
    headers (credentials were never stored), body and outcome; None if there is none.
    `read_dead_letters(message id)` looks in the DLQs for the id the workers know it by."""
    row = await inbox_sql.webhook(db, provider_name(provider), _text("event_id", event_id))
    if row is None:
        return None
    letters: list[DeadLetter] = []
    missing = None
    try:
        letters = await read_dead_letters(registry.worker_id(row["provider"], row["event_id"]))
    except (UnavailableError, UnreachableError, dlq_lock.DlqBusyError, dlq.MissingQueueError) as e:
        missing = str(e)  # the database holds most of the answer: give it, say what is missing
    try:
        body, body_format = orjson.loads(row["body"]), "json"
    except orjson.JSONDecodeError:
        body, body_format = row["body"].decode("utf-8", "replace"), "text"
    view = {
        **webhook_json(row, next(reversed(letters), None)),
        "last_seen_at": row["last_seen_at"].isoformat(),
        "headers": row["headers"],
        "body": body,
        "body_format": body_format,
        "dead_letters": [d.as_json() for d in letters],
    }
    if missing is not None:
        view["dead_letters_unavailable"] = missing
    return view
