"""What an operator asks a replay for, checked (no I/O): which stored events (type, time range,
payment, provider, outcome, ids), which workers, whether to reprocess and why; and which
worker takes what of an event type today (BINDINGS)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from shared.amqp.topology import WORK_QUEUES, queues_for
from shared.ops.dlq import parse_time
from shared.ops.inbox_view import OUTCOME_FILTERS, UNPUBLISHED, outcome_of
from shared.ops.order_input import text_problem
from shared.providers.registry import DEFAULT
from shared.queries.inbox import EventFilter, storable_text

WORKERS = WORK_QUEUES  # orders, bonuses, emails: the names `--worker` takes
# The most events one run replays: beyond it, narrow the selection or take the oldest with
# a limit (each event is one message per worker, all read into memory and published).
MAX_EVENTS = 10_000
MAX_IDS = 1000
MAX_REASON = 500
# What a replay sends a worker of an event: the raw event as stored in the inbox (the worker
# its type is bound to), or the order transitions it caused as stored in the outbox (the
# workers bound to those: bonuses and emails take `order.*`, never raw provider events).
EVENT, TRANSITIONS = "event", "transitions"


class ReplayInputError(ValueError):
    """One field is wrong: `name` (as the api's JSON spells it) and why."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name} {why}")
        self.name = name
        self.why = why


def _text(name: str, value: str | None) -> str | None:
    if value is None:
        return None
    if not value.strip():
        raise ReplayInputError(name, "must not be empty")
    if why := text_problem(value):
        raise ReplayInputError(name, why)
    return storable_text(value)  # as ingest stored it


def _time(name: str, text: str | None) -> dt.datetime | None:
    if text is None:
        return None
    at = parse_time(text)
    try:
        if at is not None:
            return at.astimezone(dt.UTC)
    except OverflowError:
        pass
    raise ReplayInputError(name, "must be an ISO 8601 time, e.g. 2026-11-30T10:00:00Z")


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    where: EventFilter
    outcome: str | None = None
    workers: tuple[str, ...] = ()  # none: each event to the workers its type is bound to
    reprocess: bool = False
    reason: str | None = None
    limit: int | None = None  # None: refuse a selection of more than MAX_EVENTS

    @classmethod
    def parse(
        cls,
        *,
        event_type: str | None = None,
        since: str | None = None,
        until: str | None = None,
        payment_id: str | None = None,
        provider: str | None = None,
        outcome: str | None = None,
        event_ids: Sequence[str] = (),
        workers: Sequence[str] = (),
        reprocess: bool = False,
        reason: str | None = None,
        limit: int | None = None,
    ) -> ReplayRequest:
        """From what an edge was given; ReplayInputError names the first bad field. It must
        select something: a forgotten filter never means the whole inbox."""
        where = EventFilter(
            event_type=_text("event_type", event_type),
            payment_id=_text("payment_id", payment_id),
            provider=_text("provider", provider),
            since=_time("since", since),
            until=_time("until", until),
            event_ids=tuple(dict.fromkeys(_text("event_ids", i) or "" for i in event_ids)),
        )
        if where.event_ids and where.provider is None:
            # Event ids are unique per provider (the index that finds them starts with it).
            where = replace(where, provider=DEFAULT.name)
        if len(where.event_ids) > MAX_IDS:
            raise ReplayInputError("event_ids", f"must be at most {MAX_IDS}")
        if where.since is not None and where.until is not None and where.since > where.until:
            raise ReplayInputError("until", "is before since")
        if outcome is not None and outcome not in OUTCOME_FILTERS:
            raise ReplayInputError("outcome", f"must be one of {', '.join(OUTCOME_FILTERS)}")
        unknown = [w for w in workers if w not in WORKERS]
        if unknown:
            raise ReplayInputError("workers", f"must be among {', '.join(WORKERS)}")
        if limit is not None and not 1 <= limit <= MAX_EVENTS:
            raise ReplayInputError("limit", f"must be a whole number 1-{MAX_EVENTS}")
        reason = None if reason is None else reason.strip() or None
        if reason is not None and (len(reason) > MAX_REASON or text_problem(reason)):
            raise ReplayInputError("reason", f"must be text of at most {MAX_REASON} characters")
        if reprocess and reason is None:
            raise ReplayInputError("reason", "is required with reprocess (the audit trail's why)")
        if (
            where.event_type is None
            and where.payment_id is None
            and where.since is None
            and where.until is None
            and not where.event_ids
        ):
            raise ReplayInputError(
                "selection",
                "says nothing: give event_type, payment_id, since, until or event_ids",
            )
        chosen = tuple(w for w in WORKERS if w in workers)  # the order messages go out in
        return cls(where, outcome, chosen, reprocess, reason, limit)

    def as_json(self) -> dict[str, Any]:
        """What was asked, for the answer and the audit trail: unset criteria left out."""
        w = self.where
        given: dict[str, Any] = {
            "event_type": w.event_type,
            "payment_id": w.payment_id,
            "provider": w.provider,
            "since": None if w.since is None else w.since.isoformat(),
            "until": None if w.until is None else w.until.isoformat(),
            "event_ids": list(w.event_ids) or None,
            "outcome": self.outcome,
            "limit": self.limit,
        }
        return {k: v for k, v in given.items() if v is not None}


def outcome_matches(wanted: str | None, row: Any) -> bool:
    """The outcome filter of `payhooks event list`, on a row of the replay's selection."""
    if wanted is None:
        return True
    if wanted == "processed":
        return row["processed_outcome"] is not None
    return outcome_of(row, None) == (UNPUBLISHED if wanted == "unpublished" else wanted)


def takes(event_type: str, workers: Sequence[str]) -> dict[str, str]:
    """What each worker gets of an event of this type: EVENT or TRANSITIONS; a worker that
    takes nothing of it today is left out. `workers` empty: those its type is bound to."""
    bound = queues_for(event_type)
    transition_workers = queues_for("order.paid")  # the workers of order transitions
    chosen = workers or bound
    what: dict[str, str] = {}
    for worker in chosen:
        if worker in bound:
            what[worker] = EVENT
        elif worker in transition_workers and "orders" in bound:
            # A provider event reaches them as the transitions the orders worker made of it.
            what[worker] = TRANSITIONS
    return what
