"""Replay from the inbox: the stored events a ReplayRequest selects, planned per worker (the
raw event for the worker its type is bound to, the order transitions it caused for bonuses
and emails), counted with what each worker would skip as already processed, then published
to each chosen worker's own queue with publisher confirms, in bounded batches.

Effects stay exactly once by the workers' keys: the same message ids as the first time, so
a processed mark (orders, bonuses) or a recorded email (emails) makes a replayed copy a
duplicate. A replay marks its messages with the REPLAY header and, when an operator asked
to reprocess, REPROCESS (docs/runbook.md "Replaying events from the inbox")."""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import orjson
from aio_pika.abc import AbstractChannel, DeliveryMode
from pamqp.commands import Basic

from shared.amqp.topology import Topology, message_id, routing_key
from shared.db import Executor
from shared.messages import ORDER_TRANSITION_SCHEMA
from shared.ops.replay_selection import (
    EVENT,
    MAX_EVENTS,
    TRANSITIONS,
    WORKERS,
    ReplayRequest,
    outcome_matches,
    takes,
)
from shared.providers.registry import message_of, worker_id
from shared.queries import inbox as inbox_sql
from shared.queries import processed as processed_sql
from shared.queries import replay as replay_sql
from shared.vocabulary import EMAIL_FOR_TRANSITION, REPLAY, REPROCESS

PUBLISH_BATCH = 200  # publishes in flight at once, their confirms awaited together
_PUBLISH_TIMEOUT_S = 10.0
_CHUNK = 1000  # inbox rows read per statement
# With an outcome filter (not in any index) a selection reads at most this many rows.
MAX_SCAN = 100_000
# The processed marks of each worker, by its worker label (the email worker keeps none: its
# key is the email's (payment, template) record).
_MARKS = {"orders": "orders", "bonuses": "bonuses"}


class ReplayTooLargeError(Exception):
    """The selection holds more events than one run replays."""


class ReplayPublishError(Exception):
    """RabbitMQ did not confirm a replayed message (or its queue is gone): what was
    confirmed before stays published (`published`), the rest was not sent."""

    def __init__(self, message: str, published: dict[str, int], *, unroutable: bool) -> None:
        super().__init__(message)
        self.published = published
        self.unroutable = unroutable  # the queue refused or returned it (gone?), not a timeout


@dataclass(frozen=True, slots=True)
class Message:
    message_id: str
    routing_key: str
    body: bytes
    headers: dict[str, str]


@dataclass(slots=True)
class WorkerPlan:
    messages: list[Message] = field(default_factory=list)
    already_processed: int = 0  # marked processed (orders, bonuses) or email recorded
    would_skip: int = 0  # what the worker will answer skipped_duplicate
    not_stored: int = 0  # transitions whose outbox message retention has deleted
    published: int = 0

    def as_json(self) -> dict[str, int]:
        return {
            "messages": len(self.messages),
            "already_processed": self.already_processed,
            "would_skip": self.would_skip,
            "not_stored": self.not_stored,
            "published": self.published,
        }


@dataclass(slots=True)
class Plan:
    """What a run sends (or a dry run would): per worker, in the order they go."""

    request: ReplayRequest
    replay_id: str
    event_ids: list[str]  # the selected inbox events, oldest first
    more: bool  # a limit cut the selection short
    last_received_at: dt.datetime | None  # of the newest event taken: where a next run goes on
    workers: dict[str, WorkerPlan]
    no_route: dict[str, int]  # selected events no chosen worker takes today, by type
    dry_run: bool = True

    def as_json(self) -> dict[str, Any]:
        """The one answer of every edge."""
        return {
            "replay_id": self.replay_id,
            "dry_run": self.dry_run,
            "reprocess": self.request.reprocess,
            "reason": self.request.reason,
            "selection": self.request.as_json(),
            "workers_chosen": list(self.request.workers),
            "events": len(self.event_ids),
            "more": self.more,
            "last_received_at": None
            if self.last_received_at is None
            else self.last_received_at.isoformat(),
            "workers": {name: plan.as_json() for name, plan in self.workers.items()},
            "no_route": self.no_route,
        }

    @property
    def published(self) -> int:
        return sum(p.published for p in self.workers.values())

    @property
    def messages(self) -> int:
        return sum(len(p.messages) for p in self.workers.values())


async def select(db: Executor, request: ReplayRequest) -> tuple[list[Any], bool]:
    """The selected inbox rows, oldest first, and whether a limit cut them short;
    ReplayTooLargeError beyond MAX_EVENTS (without a limit) or MAX_SCAN rows read."""
    limit = request.limit or MAX_EVENTS
    kept: list[Any] = []
    after: inbox_sql.Position | None = None
    scanned = 0
    while True:
        # Planned for the values each time (a rare type's own index), as the event listing is.
        async with inbox_sql.planned_for_values(db) as conn:
            rows = await inbox_sql.events_after(conn, request.where, after, _CHUNK)
        scanned += len(rows)
        for row in rows:
            if not outcome_matches(request.outcome, row):
                continue
            if len(kept) == limit:
                if request.limit is None:
                    raise ReplayTooLargeError(
                        f"the selection holds more than {MAX_EVENTS} events: narrow it"
                        " (since/until, event type, payment) or replay the oldest N with a"
                        " limit, then go on from the last one's time"
                    )
                return kept, True
            kept.append(row)
        if len(rows) < _CHUNK:
            return kept, False
        if scanned >= MAX_SCAN:
            raise ReplayTooLargeError(
                f"the outcome filter read {MAX_SCAN} stored events and did not reach the end:"
                " narrow the time range"
            )
        after = (rows[-1]["received_at"], rows[-1]["id"])


async def plan(db: Executor, request: ReplayRequest) -> Plan:
    """Read the selection and everything each worker would get of it, and count."""
    rows, more = await select(db, request)
    replay_id = "rpl_" + secrets.token_hex(8)
    headers = {REPLAY: replay_id} | ({REPROCESS: replay_id} if request.reprocess else {})
    workers = {w: WorkerPlan() for w in WORKERS if w in (request.workers or WORKERS)}
    no_route: Counter[str] = Counter()
    caused: list[Any] = []  # the rows whose transitions bonuses or emails get
    for row in rows:
        what = takes(row["event_type"], request.workers)
        if not what:
            no_route[row["event_type"]] += 1
            continue
        for worker, kind in what.items():
            if kind == EVENT:
                # As ingest sent it: the canonical event under the id the workers know.
                mid, body = message_of(row["provider"], row["event_id"], bytes(row["body"]))
                workers[worker].messages.append(
                    Message(
                        message_id(mid),
                        routing_key(row["event_type"]),
                        body,
                        {"provider": row["provider"], **headers},
                    )
                )
        if TRANSITIONS in what.values():
            caused.append(row)
    if caused:
        await _add_transitions(db, caused, request, headers, workers)
    for worker, worker_plan in workers.items():
        await _count(db, worker, worker_plan, request.reprocess)
    # The workers with something to get, and those chosen (a zero is an answer then).
    workers = {
        w: p for w, p in workers.items() if p.messages or p.not_stored or w in request.workers
    }
    last = rows[-1]["received_at"] if rows else None
    event_ids = [r["event_id"] for r in rows]
    return Plan(request, replay_id, event_ids, more, last, workers, dict(no_route))


async def _add_transitions(
    db: Executor,
    rows: list[Any],
    request: ReplayRequest,
    headers: dict[str, str],
    workers: dict[str, WorkerPlan],
) -> None:
    sources = {message_id(worker_id(r["provider"], r["event_id"])): r for r in rows}
    payments = sorted({r["payment_id"] for r in rows if r["payment_id"] is not None})
    transitions = await replay_sql.transitions_caused(db, payments, list(sources))
    # The outbox message of each: its id is the transition's, as the orders worker made it.
    ids = [message_id(f"{t['event_id']}:order.{t['to_status'].lower()}") for t in transitions]
    stored = await replay_sql.outbox_messages(db, ids)
    for t, outbox_id in zip(transitions, ids, strict=True):
        for worker, kind in takes(sources[t["event_id"]]["event_type"], request.workers).items():
            if kind != TRANSITIONS:
                continue
            row = stored.get(outbox_id)
            if row is None:
                workers[worker].not_stored += 1
                continue
            workers[worker].messages.append(
                Message(
                    outbox_id,
                    row["routing_key"],
                    bytes(row["body"]),
                    {"schema": ORDER_TRANSITION_SCHEMA, **headers},
                )
            )


async def _count(db: Executor, worker: str, plan: WorkerPlan, reprocess: bool) -> None:
    """What the worker will skip: a marked message (unless reprocessed); for emails, a
    message whose email is recorded (sent or skipped) or asked for earlier in the run."""
    ids = [m.message_id for m in plan.messages]
    if worker in _MARKS:
        marked = await processed_sql.processed_of(db, _MARKS[worker], ids)
        plan.already_processed = sum(1 for i in ids if i in marked)
        plan.would_skip = 0 if reprocess else plan.already_processed
        return
    wanted = [
        (m, (_payment_of(m), template))
        for m in plan.messages
        if (template := EMAIL_FOR_TRANSITION.get(m.routing_key)) is not None
    ]
    recorded = await replay_sql.emails_recorded(db, [key for _, key in wanted])
    plan.already_processed = sum(1 for _, key in wanted if key in recorded)
    seen: set[tuple[str, str]] = set()
    for _, key in wanted:
        if key in recorded or key in seen:
            plan.would_skip += 1
        seen.add(key)


def _payment_of(message: Message) -> str:
    return str(orjson.loads(message.body).get("payment_id"))


async def publish(channel: AbstractChannel, topology: Topology, plan: Plan) -> None:
    """Send each worker its messages on its own queue (the default exchange: nothing else
    bound to the events exchange sees a replay), PUBLISH_BATCH at a time, each confirmed
    before the next batch goes; counts `published` as confirms come."""
    now = dt.datetime.now(dt.UTC)
    for worker, worker_plan in plan.workers.items():
        queue = topology.work[worker].name
        messages = worker_plan.messages
        for start in range(0, len(messages), PUBLISH_BATCH):
            batch = messages[start : start + PUBLISH_BATCH]
            confirms = await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        _amqp(m, now), queue, mandatory=True, timeout=_PUBLISH_TIMEOUT_S
                    )
                    for m in batch
                ),
                return_exceptions=True,
            )
            acked = sum(1 for c in confirms if isinstance(c, Basic.Ack))
            worker_plan.published += acked
            if acked < len(batch):
                failed = [c for c in confirms if not isinstance(c, Basic.Ack)]
                raise ReplayPublishError(
                    f"RabbitMQ did not queue {len(failed)} replayed message(s) on {queue}"
                    f" ({failed[0]!r}); {plan.published} were published and confirmed",
                    {w: p.published for w, p in plan.workers.items()},
                    unroutable=any(
                        isinstance(c, aio_pika.exceptions.DeliveryError)
                        or not isinstance(c, BaseException)  # returned: no queue took it
                        for c in failed
                    ),
                )


def _amqp(message: Message, now: dt.datetime) -> aio_pika.Message:
    return aio_pika.Message(
        message.body,
        headers=dict(message.headers),
        message_id=message.message_id,
        type=message.routing_key,
        content_type="application/json",
        delivery_mode=DeliveryMode.PERSISTENT,
        timestamp=now,
    )
