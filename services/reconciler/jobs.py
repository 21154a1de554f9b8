"""Reconciliation and housekeeping passes. Orders due by the schedule (every state, RECONCILE_AFTER
after their last change, then at growing intervals; shared/queries/schedule.py) are checked
against the provider's API; where it knows more, a synthetic `payment.status_changed` goes
through the orders queue like a webhook (D11), marked as the reconciler's by its headers."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import structlog

from services.reconciler import schedule
from shared.amqp.broker import Broker
from shared.amqp.outgoing import Outgoing
from shared.config import Settings
from shared.errors import PermanentError, TransientError
from shared.messages import reconciler_headers
from shared.metrics import ReconcilerMetrics
from shared.ops import archive
from shared.ops.archive_files import ArchiveCorruptError
from shared.order_machine import OrderState, Reason, agrees, decide
from shared.providers.registry import asks_xhub
from shared.providers.xhub import PROVIDER, STATUS_CHANGED
from shared.providers.xhub.client import PaymentNotFoundError, ProviderAuthError, ProviderClient
from shared.providers.xhub.events import ProviderEvent, status_changed
from shared.providers.xhub.payments import ProviderPayment
from shared.queries import inbox as inbox_sql
from shared.queries import orders as orders_sql
from shared.queries import partitions as partitions_sql
from shared.queries import retention as retention_sql
from shared.queries import schedule as schedule_sql
from shared.queries.schedule import CLASS_NAMES, Timing

log = structlog.get_logger(__name__)

_HOUSEKEEPING_BATCH = 1000
_PUBLISH_TIMEOUT_S = 5.0


def synthetic_event(payment: ProviderPayment, checked_at: datetime) -> tuple[str, bytes]:
    """The event id and body of the provider's current status as a webhook would carry it
    (the time it was asked for travels in the message's headers: reconciler_headers).

    The id is deterministic for one question: published twice (a retry), the orders worker's
    processed_events key applies it once. A later question is a new event: the answer may
    decide what the earlier one, overtaken by a change of the order, could not.
    """
    at = payment.updated_at.astimezone(UTC).isoformat()
    asked = checked_at.astimezone(UTC).isoformat()
    event_id = f"reconcile:{payment.payment_id}:{payment.status.lower()}:{at}:{asked}"
    body = orjson.dumps(
        status_changed(
            payment.payment_id,
            payment.status.lower(),
            # Exactly the provider's amount: rounding could turn 99.995 into a matching 100.00.
            format(payment.amount, "f"),
            payment.currency,
            at,
        )
    )
    return event_id, body


def claim_rate(clients: Mapping[str, ProviderClient]) -> float:
    """The questions a second a claim is sized for: X-Hub's budget where its API is set (the
    provider most orders come from), else the slowest configured API's; 0 with none."""
    if PROVIDER in clients:
        return clients[PROVIDER].policy.rate_per_s
    return min((c.policy.rate_per_s for c in clients.values()), default=0.0)


async def reconcile_once(
    pool: asyncpg.Pool[Any],
    broker: Broker,
    clients: Mapping[str, ProviderClient],
    metrics: ReconcilerMetrics,
    timing: Timing,
    size: int | None = None,
) -> int:
    """Check one claim of due orders (`size`, by default a second of claim_rate); return how
    many the providers were asked about (a full claim means more may be waiting; fewer, that
    none are or a provider is failing). An order whose question did not end (a repair not
    published, a crash) is due again when its lease runs out. `clients`: the payment APIs
    configured, by provider name (X-Hub's under XHUB_API_URL, Stripe's under STRIPE_API_KEY);
    with none, nothing is claimed."""
    if not clients:
        return 0
    size = size or schedule.claim_size(claim_rate(clients))
    rows = await schedule.claim(pool, size, timing)
    answered: list[asyncpg.Record] = []
    try:
        for index, row in enumerate(rows):
            metrics.asked.labels(**{"class": CLASS_NAMES[row["check_class"]]}).inc()
            try:
                if await _ask_about(row, pool, broker, clients, metrics):
                    answered.append(row)
            except _ProviderFailingError:
                # Asking about the next order would only hammer it: the pass ends, and the
                # rest of the claim is due again at once.
                await schedule_sql.reschedule_now(pool, [r["payment_id"] for r in rows[index:]])
                return index
        return len(rows)
    finally:
        if answered:
            await schedule_sql.schedule_next(pool, answered)


class _ProviderFailingError(Exception):
    """The provider is down, throttling us, or refuses our key."""


async def _ask_about(
    row: asyncpg.Record,
    pool: asyncpg.Pool[Any],
    broker: Broker,
    clients: Mapping[str, ProviderClient],
    metrics: ReconcilerMetrics,
) -> bool:
    """Ask the provider about one claimed order and act on the answer; False if the question
    did not end (the repair it called for was not published)."""
    payment_id = row["payment_id"]
    providers = await inbox_sql.providers_of_payment(pool, payment_id)
    asked = _whom_to_ask(providers, clients)
    if asked is None:
        # Its webhooks come from a provider with no API to ask (Standard Webhooks, or Stripe
        # without STRIPE_API_KEY, or X-Hub without XHUB_API_URL): asking another would only
        # earn a 404. Repaired by its sender's redeliveries; rescheduled.
        metrics.checked.labels(result="no_provider_api").inc()
        log.info("reconcile.no_provider_api", payment_id=payment_id, providers=providers)
        return True
    provider, client = asked
    try:
        payment = await client.get_payment(payment_id)
    except PaymentNotFoundError:
        metrics.checked.labels(result="not_found").inc()
        log.warning("reconcile.unknown_to_provider", payment_id=payment_id)
        return True
    except (TransientError, ProviderAuthError) as e:
        metrics.checked.labels(result="provider_error").inc()
        log.warning("reconcile.provider_failed", payment_id=payment_id, error=str(e))
        raise _ProviderFailingError from e
    except PermanentError as e:  # an answer about this payment we cannot use
        metrics.checked.labels(result="provider_error").inc()
        log.warning("reconcile.provider_failed", payment_id=payment_id, error=str(e))
        return True
    state = OrderState.from_row(row)
    try:
        event = ProviderEvent(
            event_type=STATUS_CHANGED,
            status=payment.status.lower(),  # as parse_event reads a webhook's
            payment_id=payment_id,
            amount=payment.amount,
            currency=payment.currency,
            occurred_at=payment.updated_at,
            checked_at=row["checked_at"],
        )
    except PermanentError as e:
        metrics.checked.labels(result="provider_error").inc()
        log.warning("reconcile.unusable_answer", payment_id=payment_id, error=str(e))
        return True
    decision = decide(state, event)
    if not decision.events:
        if decision.reason is Reason.REFUNDED_BEFORE_REVERSAL:
            metrics.checked.labels(result="stale_answer").inc()
            log.info("reconcile.stale_answer", payment_id=payment_id, status=payment.status)
        elif row["undecided_since"] is None:
            metrics.checked.labels(result="in_sync").inc()
        elif agrees(state, event):
            await orders_sql.clear_undecided(pool, payment_id, row["checked_at"])
            metrics.checked.labels(result="resolved").inc()
            log.info("reconcile.resolved", payment_id=payment_id, status=state.status.value)
        else:  # asked again every RECONCILE_INTERVAL; alerted on past a bound
            metrics.checked.labels(result="undecided").inc()
            log.warning(
                "reconcile.still_undecided",
                payment_id=payment_id,
                status=state.status.value,
                provider_status=payment.status,
                provider_amount=str(payment.amount),
            )
        return True
    event_id, body = synthetic_event(payment, row["checked_at"])
    [error] = await broker.publish_many(
        [
            Outgoing(
                STATUS_CHANGED,
                body,
                event_id,
                STATUS_CHANGED,
                {"provider": provider, **reconciler_headers(row["checked_at"])},
            )
        ],
        _PUBLISH_TIMEOUT_S,
    )
    if error is not None:  # the broker blinked: asked again once the lease runs out
        metrics.checked.labels(result="publish_failed").inc()
        log.warning("reconcile.publish_failed", payment_id=payment_id, error=repr(error))
        return False
    transition = decision.events[-1]
    metrics.checked.labels(result="repaired").inc()
    metrics.repairs.labels(**{"from": state.status.value, "to": transition.to_status.value}).inc()
    log.info(
        "reconcile.repaired",  # counted in payhooks_reconcile_repairs_total
        payment_id=payment_id,
        from_status=state.status.value,
        to_status=transition.to_status.value,
        provider_status=payment.status,
        provider=provider,
        event_id=event_id,
    )
    return True


def _whom_to_ask(
    providers: list[str], clients: Mapping[str, ProviderClient]
) -> tuple[str, ProviderClient] | None:
    """The provider (and its client) whose API answers about a payment the webhooks of
    `providers` named: one with a client of its own first, else X-Hub's if one of them asks
    X-Hub (or none named it yet: asked at X-Hub, as before providers had names); None if
    none of them can be asked."""
    for provider in providers:
        if provider != PROVIDER and provider in clients:
            return provider, clients[provider]
    xhub = clients.get(PROVIDER)
    if xhub is not None and (not providers or any(asks_xhub(p) for p in providers)):
        return PROVIDER, xhub
    return None


async def housekeeping_once(
    pool: asyncpg.Pool[Any],
    retention_days: int,
    archive_dir: Path | None = None,
    *,
    metrics: ReconcilerMetrics,
) -> dict[str, int]:
    """The inbox's partitions made days ahead, its days past the retention archived and
    dropped (shared/ops/archive.py), then rows past the retention deleted in small batches
    (short locks, no long transaction); the rows gone per table. The age of the oldest day
    the inbox still holds goes to a gauge beside the retention: an expiry refused, failing or
    postponed is only logged, and the gauge is what an alert sees grow."""
    retention_s = retention_days * 86_400.0
    deleted = {"inbox": 0}
    try:
        await partitions_sql.ensure_ahead(pool)
        expiry = await archive.expire(pool, retention_days, archive_dir)
        metrics.inbox_expiry.labels(outcome="archived").inc(len(expiry.archived))
        metrics.inbox_expiry.labels(outcome="refused").inc(expiry.refused)
        metrics.inbox_expiry.labels(outcome="postponed").inc(expiry.postponed)
        if archive_dir is not None:
            await archive.remove_unrecorded(pool, archive_dir)
        deleted["inbox"] = sum(a.rows for a in expiry.archived)
    except (OSError, ArchiveCorruptError, asyncpg.PostgresError):
        # A full disk or a lost volume must not stop the reconciler's passes (they would
        # fail at this step every interval): the inbox's days wait, the rest goes on.
        metrics.inbox_expiry.labels(outcome="failed").inc()
        log.exception("inbox.expiry_failed", archive_dir=str(archive_dir))
    await observe_inbox_age(pool, retention_days, metrics)
    started = time.monotonic()
    for table in ("inbox_keys", "outbox", "processed_events", "parked_events", "refused_webhooks"):
        total = 0
        while True:
            if table == "inbox_keys":
                count = await partitions_sql.delete_old_keys(
                    pool, retention_days, _HOUSEKEEPING_BATCH
                )
            else:
                count = await retention_sql.delete_old(
                    pool, table, retention_s, _HOUSEKEEPING_BATCH
                )
            total += count
            if count < _HOUSEKEEPING_BATCH or time.monotonic() - started > 30:
                break
        deleted[table] = total
    if any(deleted.values()):
        log.info(
            "housekeeping.deleted",
            **deleted,
            retention_days=retention_days,
            at=datetime.now(UTC).isoformat(),
        )
    return deleted


async def observe_inbox_age(
    pool: asyncpg.Pool[Any], retention_days: int, metrics: ReconcilerMetrics
) -> None:
    """Set the inbox's oldest-day age (0 while it holds no day) and the retention it is held
    to. Right after a pass that expired what it could, the age stays below the retention plus
    a day (a day goes once wholly past it); beyond, a day is held that should be gone."""
    oldest = await partitions_sql.oldest_day(pool)
    age_s = 0.0
    if oldest is not None:
        start = datetime.combine(oldest, datetime.min.time(), tzinfo=UTC)
        age_s = max(0.0, (datetime.now(UTC) - start).total_seconds())
    metrics.inbox_oldest_day_age.set(age_s)
    metrics.inbox_retention.set(retention_days * 86_400.0)


class Reconciler:
    """The reconciler's passes: due orders claim by claim until none is left, with the
    housekeeping and the schedule's gauges once an interval in between."""

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        broker: Broker,
        clients: Mapping[str, ProviderClient],
        metrics: ReconcilerMetrics,
        settings: Settings,
    ) -> None:
        self._pool, self._broker, self._metrics = pool, broker, metrics
        self._clients = dict(clients)
        self._timing = Timing(
            after_s=settings.reconcile_after_s,
            interval_s=settings.reconcile_interval_s,
            horizon_s=settings.reconcile_horizon_s,
        )
        rate = claim_rate(clients)
        self._size = schedule.claim_size(rate) if clients else 0
        self._retention_days = settings.retention_days
        self._archive_dir = settings.archive_dir
        self._swept = float("-inf")
        metrics.budget.set(rate)
        metrics.interval.set(self._timing.interval_s)

    async def run_pass(self) -> None:
        """Claims of a second's questions each, so that an order falling due waits about a
        second behind what is in hand, whatever the backlog; the pass ends when a claim comes
        back short (nothing more is due, or the provider is failing: then it waits an
        interval)."""
        while True:
            if time.monotonic() - self._swept >= self._timing.interval_s:
                self._swept = time.monotonic()
                await self.observe_backlog()
                await housekeeping_once(
                    self._pool, self._retention_days, self._archive_dir, metrics=self._metrics
                )
            asked = await reconcile_once(
                self._pool, self._broker, self._clients, self._metrics, self._timing, self._size
            )
            if asked < self._size or not self._clients:
                return

    async def observe_backlog(self) -> None:
        for name, due in (await schedule_sql.backlog(self._pool, self._timing)).items():
            self._metrics.due.labels(**{"class": name}).set(due.due)
            self._metrics.overdue.labels(**{"class": name}).set(due.overdue_s)
