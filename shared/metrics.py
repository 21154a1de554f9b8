"""Prometheus metrics: one dataclass per service kind, every metric name payhooks exports
spelled here; a labelled counter exports its known label values at 0 from the start, so
`rate()` and alerts see a series before the first event."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.multiprocess import MultiProcessCollector

from shared.providers.xhub import PROVIDER
from shared.vocabulary import RECONCILE_CLASSES

# No `*_created` series (process-wide): nothing reads them, and each counter and histogram
# child would cost Prometheus one more series.
disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated upstream

# Latency buckets in seconds: the accept path lives in milliseconds, the hard budget is 10 s.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# Our clock minus X-Webhook-Timestamp, signed (negative: the timestamp is in our future).
# Transit and whole-second timestamps put a healthy skew in [0, 2) s; the tolerance (300 s by
# default) is where `stale` begins; beyond an hour it is a wrong unit or a dead clock.
_CLOCK_SKEW_BUCKETS = (
    *(-b for b in (3600.0, 600.0, 300.0, 120.0, 60.0, 30.0, 10.0, 5.0, 2.0, 1.0)),
    0.0,
    *(1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 3600.0),
)

# Webhook received -> effect (an order transition, a bonus grant, an email accepted by the
# SMTP server): a healthy pipeline takes well under a second; retries take minutes.
_EFFECT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)

_PROVIDER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@cache
def build_version() -> str:
    """The installed payhooks distribution's version ("unknown" when run from a bare tree)."""
    try:
        return version("payhooks")
    except PackageNotFoundError:
        return "unknown"


def new_registry() -> CollectorRegistry:
    """A service's registry, with what every Prometheus target is expected to carry besides
    its own metrics: `payhooks_build_info{version}` (1), process_* and python_info."""
    registry = CollectorRegistry()
    build_info = Gauge(
        "payhooks_build_info",
        "Always 1; the running payhooks version in its label.",
        ["version"],
        registry=registry,
        multiprocess_mode="max",  # one series for a service's copies, not one per pid
    )
    build_info.labels(version=build_version()).set(1)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def multiprocess_registry(path: str) -> CollectorRegistry:
    """What /metrics exports when a service runs as several processes sharing `path`: every
    payhooks metric summed over them, and python_info. process_* are left out: they would
    describe only whichever process answered the scrape."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path)  # type: ignore[no-untyped-call]
    PlatformCollector(registry=registry)
    return registry


def _counter(
    name: str,
    documentation: str,
    registry: CollectorRegistry,
    label: str | None = None,
    values: Iterable[str] = (),
    **fixed: str,
) -> Counter:
    """A counter, labelled by `fixed` then `label`, with each of `values` exported at 0."""
    labelnames = [*fixed, label] if label is not None else list(fixed)
    counter = Counter(name, documentation, labelnames, registry=registry)
    for value in values:
        counter.labels(**fixed, **{str(label): value})
    return counter


def _secret_matched(registry: CollectorRegistry, secrets: Mapping[str, int]) -> Counter:
    """payhooks_webhook_secret_matched{provider, secret_index}: each configured index at 0."""
    counter = Counter(
        "payhooks_webhook_secret_matched",
        "Authentically signed webhooks, by provider and the position of the matching secret"
        " in its secrets variable (XHUB_WEBHOOK_SECRETS, STANDARD_WEBHOOK_SECRETS, ...;"
        " 0 = the first).",
        ["provider", "secret_index"],
        registry=registry,
    )
    for provider, count in secrets.items():
        for index in range(count):
            counter.labels(provider=provider, secret_index=str(index))
    return counter


SHED_REASONS = ("predicted_wait", "pending_cap")
WEBHOOK_OUTCOMES = (
    "accepted",
    "duplicate",
    "malformed",
    "invalid_signature",
    "stale",
    "too_large",
    "unavailable",
)


@dataclass(frozen=True, slots=True)
class IngestMetrics:
    registry: CollectorRegistry
    webhooks_received: Counter
    ingest_duration: Histogram
    publish_confirm_duration: Histogram
    accept_batch_size: Histogram
    sweeper_published: Counter
    clock_skew: Histogram
    secret_matched: Counter
    shed: Counter
    accept_rate: Gauge
    # The providers with a route (their names): webhooks_received is exported for each.
    providers: tuple[str, ...] = (PROVIDER,)
    # webhooks_received's children by provider, then outcome, looked up once (labels() on
    # every request costs more than the increment).
    received: dict[str, dict[str, Counter]] = field(default_factory=dict)
    _signed_with: dict[tuple[str, int], Counter] = field(default_factory=dict)
    _skew: dict[str, Histogram] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for provider in self.providers:
            self.skew(provider)  # exported (empty) from the start
            self.received[provider] = {
                outcome: self.webhooks_received.labels(provider=provider, outcome=outcome)
                for outcome in WEBHOOK_OUTCOMES
            }

    def signed_with(self, secret_index: int, provider: str = PROVIDER) -> Counter:
        counter = self._signed_with.get((provider, secret_index))
        if counter is None:
            counter = self.secret_matched.labels(provider=provider, secret_index=str(secret_index))
            self._signed_with[provider, secret_index] = counter
        return counter

    def skew(self, provider: str = PROVIDER) -> Histogram:
        histogram = self._skew.get(provider)
        if histogram is None:
            histogram = self._skew[provider] = self.clock_skew.labels(provider=provider)
        return histogram

    @classmethod
    def create(
        cls,
        registry: CollectorRegistry | None = None,
        *,
        secrets: int | Mapping[str, int] = 0,
        providers: tuple[str, ...] = (PROVIDER,),
    ) -> IngestMetrics:
        """`secrets`: how many webhook secrets each provider has (each index exported at 0;
        a number: X-Hub's); `providers`: those with a route."""
        counts = {PROVIDER: secrets} if isinstance(secrets, int) else dict(secrets)
        registry = registry or new_registry()
        return cls(
            registry=registry,
            providers=providers,
            webhooks_received=Counter(
                "payhooks_webhooks_received",
                "Webhook requests received, by provider and outcome.",
                ["provider", "outcome"],
                registry=registry,
            ),
            ingest_duration=Histogram(
                "payhooks_ingest_duration_seconds",
                "Time from request start to answer on the webhook endpoint.",
                buckets=_LATENCY_BUCKETS,
                registry=registry,
            ),
            publish_confirm_duration=Histogram(
                "payhooks_publish_confirm_duration_seconds",
                "Time from publish to broker confirm, per batch of messages.",
                buckets=_LATENCY_BUCKETS,
                registry=registry,
            ),
            accept_batch_size=Histogram(
                "payhooks_ingest_batch_size",
                "Webhooks sharing one database transaction and one batch of confirms.",
                buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                registry=registry,
            ),
            sweeper_published=Counter(
                "payhooks_ingest_sweeper_published",
                "Stored webhooks whose publish was never confirmed, published by the sweeper.",
                registry=registry,
            ),
            clock_skew=Histogram(
                "payhooks_webhook_clock_skew_seconds",
                "Our clock minus the signed timestamp header of authentically signed webhooks"
                " (stale ones included), by provider; negative: the timestamp is in our future.",
                ["provider"],
                buckets=_CLOCK_SKEW_BUCKETS,
                registry=registry,
            ),
            secret_matched=_secret_matched(registry, counts),
            shed=_counter(
                "payhooks_ingest_shed",
                "Webhooks answered 503 at once by admission (also counted unavailable): their"
                " predicted wait exceeded their answer budget, or the waiting cap was reached.",
                registry,
                "reason",
                SHED_REASONS,
            ),
            accept_rate=Gauge(
                "payhooks_ingest_accept_rate",
                "Webhooks per second admission predicts the accept path finishes (measured"
                " while webhooks wait, else assumed); set at each batch's end.",
                registry=registry,
                multiprocess_mode="livesum",
            ),
        )


# `parked`: the orders worker's event for a payment without an order yet (SPEC section 5).
WORKER_OUTCOMES = ("ok", "skipped_duplicate", "retried", "dead_lettered", "parked")


@dataclass(frozen=True, slots=True)
class WorkerMetrics:
    registry: CollectorRegistry
    worker: str
    messages_processed: Counter
    processing_duration: Histogram
    paused: Gauge
    effect_latency: Histogram

    @classmethod
    def create(cls, worker: str, registry: CollectorRegistry | None = None) -> WorkerMetrics:
        registry = registry or new_registry()
        return cls(
            registry=registry,
            worker=worker,
            messages_processed=_counter(
                "payhooks_messages_processed",
                "Messages a worker finished with, by outcome.",
                registry,
                "outcome",
                WORKER_OUTCOMES,
                worker=worker,
            ),
            processing_duration=Histogram(
                "payhooks_processing_duration_seconds",
                "Time a worker spent on one message, from delivery to ack.",
                ["worker"],
                buckets=_LATENCY_BUCKETS,
                registry=registry,
            ),
            paused=Gauge(
                "payhooks_worker_paused",
                "1 while a worker takes no work because a dependency it needs is down (it"
                " resumes by itself once the dependency answers), else 0.",
                ["worker", "dependency"],
                registry=registry,
                multiprocess_mode="max",
            ),
            effect_latency=Histogram(
                "payhooks_payment_effect_latency_seconds",
                "From the webhook's arrival at ingest to a worker's effect of it (orders: the"
                " transition; bonuses: the grant; email: the SMTP server's acceptance),"
                " observed when that effect commits.",
                ["worker"],
                buckets=_EFFECT_BUCKETS,
                registry=registry,
            ),
        )

    def observe(self, outcome: str, duration_s: float) -> None:
        self.messages_processed.labels(worker=self.worker, outcome=outcome).inc()
        self.processing_duration.labels(worker=self.worker).observe(duration_s)

    def observe_effect(self, latency_s: float) -> None:
        self.effect_latency.labels(worker=self.worker).observe(latency_s)


@dataclass(frozen=True, slots=True)
class OrderMetrics:
    undecided: Counter
    refund_failures: Counter
    parked_released: Counter
    parked_dead_lettered: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> OrderMetrics:
        return cls(
            undecided=_counter(
                "payhooks_orders_undecided_events",
                "Provider events the state machine could not decide (the provider is asked),"
                " by reason.",
                registry,
                "reason",
                ("reversal_before_refund", "amount_mismatch_ignored", "currency_mismatch"),
            ),
            refund_failures=_counter(
                "payhooks_refund_failures",
                "refund.failed and refund.rejected events received: the merchant must know.",
                registry,
                "event",
                ("refund.failed", "refund.rejected"),
            ),
            parked_released=_counter(
                "payhooks_parked_events_released",
                "Parked events published back to the orders queue after their order was"
                " registered.",
                registry,
            ),
            parked_dead_lettered=_counter(
                "payhooks_parked_events_dead_lettered",
                "Parked events whose order was not registered within"
                " UNKNOWN_PAYMENT_PARK_SECONDS, dead-lettered with reason unknown_payment.",
                registry,
            ),
        )


@dataclass(frozen=True, slots=True)
class BonusMetrics:
    points_granted: Counter
    entries: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> BonusMetrics:
        return cls(
            points_granted=_counter(
                "payhooks_bonus_points_granted",
                "Bonus points granted (first PAID/SETTLED of a payment).",
                registry,
            ),
            entries=_counter(
                "payhooks_bonus_entries",
                "Bonus ledger entries written, by kind (grant, clawback, restore).",
                registry,
                "kind",
                ("grant", "clawback", "restore"),
            ),
        )


@dataclass(frozen=True, slots=True)
class EmailMetrics:
    emails_sent: Counter
    emails_skipped: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> EmailMetrics:
        return cls(
            emails_sent=_counter(
                "payhooks_emails_sent",
                "Customer emails accepted by the SMTP server, by template.",
                registry,
                "template",
                ("payment_succeeded", "payment_refunded"),
            ),
            emails_skipped=_counter(
                "payhooks_emails_skipped",
                "Customer emails not sent because a later one went out first (a success email"
                " after the refund email), by template.",
                registry,
                "template",
                ("payment_succeeded",),
            ),
        )


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    """Backlogs an operator watches, refreshed by the api's monitor loop."""

    queue_messages: Gauge
    queue_consumers: Gauge
    oldest_age: Gauge
    outbox_backlog: Gauge
    inbox_unpublished: Gauge
    orders_undecided: Gauge
    orders_undecided_oldest: Gauge
    parked_events: Gauge
    parked_oldest: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> QueueMetrics:
        return cls(
            queue_messages=Gauge(
                "payhooks_queue_messages",
                "Messages in a RabbitMQ queue (work queues, unrouted and DLQs).",
                ["queue"],
                registry=registry,
            ),
            queue_consumers=Gauge(
                "payhooks_queue_consumers",
                "Consumers on a work queue (0 while it has messages: nobody processes them).",
                ["queue"],
                registry=registry,
            ),
            oldest_age=Gauge(
                "payhooks_queue_oldest_message_age_seconds",
                "Age of the oldest message in a DLQ (0 when empty).",
                ["queue"],
                registry=registry,
            ),
            outbox_backlog=Gauge(
                "payhooks_outbox_backlog",
                "Order transitions committed but not yet published by the outbox relay.",
                registry=registry,
            ),
            inbox_unpublished=Gauge(
                "payhooks_inbox_unpublished",
                "Stored webhooks not yet confirmed by RabbitMQ (the sweeper's backlog).",
                registry=registry,
            ),
            orders_undecided=Gauge(
                "payhooks_orders_undecided",
                "Orders with an event the state machine could not decide (the reconciler asks"
                " the provider about them).",
                registry=registry,
            ),
            orders_undecided_oldest=Gauge(
                "payhooks_orders_undecided_oldest_seconds",
                "How long the oldest undecided order has been undecided (0 when none).",
                registry=registry,
            ),
            parked_events=Gauge(
                "payhooks_parked_events",
                "Provider events parked for a payment whose order is not registered yet.",
                registry=registry,
            ),
            parked_oldest=Gauge(
                "payhooks_parked_events_oldest_seconds",
                "How long the oldest parked event has been parked (0 when none).",
                registry=registry,
            ),
        )


PROVIDER_OUTCOMES = (
    "ok",
    "not_found",
    "unauthorized",
    "unexpected_status",
    "invalid_response",
    "server_error",
    "rate_limited",
    "network_error",
    "timeout",
)


@dataclass(frozen=True, slots=True)
class ProviderMetrics:
    """The payment API clients' requests (shared/providers/xhub/client.py), in the reconciler,
    by provider: with X-Hub's and Stripe's keys both set, an alert names whose key is refused."""

    requests: Counter
    request_duration: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ProviderMetrics:
        return cls(
            requests=Counter(
                "payhooks_provider_requests",
                "HTTP requests to a provider's payment API (each retry counts), by provider and"
                " outcome.",
                ["provider", "outcome"],
                registry=registry,
            ),
            request_duration=Histogram(
                "payhooks_provider_request_duration_seconds",
                "Time one HTTP request to a provider's payment API took, failed ones included.",
                ["provider"],
                buckets=_PROVIDER_BUCKETS,
                registry=registry,
            ),
        )

    def track(self, provider: str) -> None:
        """Export each outcome of `provider`'s client at 0 from the start, so that increase()
        sees its first 401 too (PayhooksProviderAuthFailing)."""
        for outcome in PROVIDER_OUTCOMES:
            self.requests.labels(provider=provider, outcome=outcome)

    def observe(self, provider: str, outcome: str, duration_s: float) -> None:
        self.requests.labels(provider=provider, outcome=outcome).inc()
        self.request_duration.labels(provider=provider).observe(duration_s)


# resolved: an undecided order the provider's answer confirmed; undecided: one it didn't settle
RECONCILE_RESULTS = (
    "in_sync",
    "repaired",
    "resolved",
    "undecided",
    "not_found",
    "provider_error",
    "publish_failed",
    "stale_answer",
    # Not asked: the payment's webhooks came from providers without a payment API only
    # (Standard Webhooks, docs/providers.md).
    "no_provider_api",
)


# What a housekeeping pass did with an inbox day past the retention (shared/ops/archive.py);
# `failed` counts the passes whose expiry stopped at an error, whichever day it was on.
INBOX_EXPIRY_OUTCOMES = ("archived", "refused", "failed", "postponed")


@dataclass(frozen=True, slots=True)
class ReconcilerMetrics:
    repairs: Counter
    checked: Counter
    asked: Counter
    due: Gauge
    overdue: Gauge
    budget: Gauge
    interval: Gauge
    inbox_oldest_day_age: Gauge
    inbox_retention: Gauge
    inbox_expiry: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ReconcilerMetrics:
        metrics = cls._families(registry)
        for check_class in RECONCILE_CLASSES:  # a series each from the start, as counters have
            metrics.due.labels(**{"class": check_class}).set(0)
            metrics.overdue.labels(**{"class": check_class}).set(0)
        return metrics

    @classmethod
    def _families(cls, registry: CollectorRegistry) -> ReconcilerMetrics:
        return cls(
            repairs=Counter(
                "payhooks_reconcile_repairs",
                "Orders moved by a synthetic event after asking the provider, by transition.",
                ["from", "to"],
                registry=registry,
            ),
            checked=_counter(
                "payhooks_reconcile_checked",
                "Stale orders checked against the provider, by result.",
                registry,
                "result",
                RECONCILE_RESULTS,
            ),
            asked=_counter(
                "payhooks_reconcile_asked",
                "Orders the provider was asked about, by schedule class.",
                registry,
                "class",
                RECONCILE_CLASSES,
            ),
            due=Gauge(
                "payhooks_reconcile_due_orders",
                "Orders due for a question to the provider, by schedule class.",
                ["class"],
                registry=registry,
            ),
            overdue=Gauge(
                "payhooks_reconcile_overdue_seconds",
                "How long the most overdue order of each schedule class has been due.",
                ["class"],
                registry=registry,
            ),
            budget=Gauge(
                "payhooks_reconcile_budget_calls_per_second",
                "The provider-call budget: the reconciler's rate limit on the provider's API.",
                registry=registry,
            ),
            interval=Gauge(
                "payhooks_reconcile_interval_seconds",
                "RECONCILE_INTERVAL: a due order of undecided money is asked within two.",
                registry=registry,
            ),
            # The two an alert compares (deploy/prometheus/alerts.yml), so that it names no
            # number of days: a day is archived once wholly past the retention, so a held
            # day much older than RETENTION_DAYS + 1 is one the housekeeping could not expire.
            inbox_oldest_day_age=Gauge(
                "payhooks_inbox_oldest_day_age_seconds",
                "Age of the oldest UTC day the inbox still holds (its partition's, or a row's"
                " in the default partition), at the last housekeeping pass.",
                registry=registry,
            ),
            inbox_retention=Gauge(
                "payhooks_inbox_retention_seconds",
                "RETENTION_DAYS: inbox days wholly older than this are archived and dropped.",
                registry=registry,
            ),
            inbox_expiry=_counter(
                "payhooks_inbox_expiry",
                "Inbox days past the retention met by a housekeeping pass, by outcome: archived"
                " (and dropped), refused (no ARCHIVE_DIR), postponed (unpublished rows, a lock"
                " timeout), each day kept counted again at every pass; failed: passes whose"
                " expiry stopped at an error (the archive volume).",
                registry,
                "outcome",
                INBOX_EXPIRY_OUTCOMES,
            ),
        )


@dataclass(frozen=True, slots=True)
class WorkerControlMetrics:
    """What operators set on a worker (shared/worker/controls.py): every replica exports the
    same values, read from the worker_controls row."""

    operator_paused: Gauge
    operator_paused_since: Gauge
    rate_limit: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> WorkerControlMetrics:
        return cls(
            operator_paused=Gauge(
                "payhooks_worker_operator_paused",
                "1 while an operator has paused the worker (payhooks worker pause), else 0.",
                ["worker"],
                registry=registry,
                multiprocess_mode="max",
            ),
            operator_paused_since=Gauge(
                "payhooks_worker_operator_paused_since_timestamp_seconds",
                "When the operator's pause of the worker began (Unix time); 0 when it runs.",
                ["worker"],
                registry=registry,
                multiprocess_mode="max",
            ),
            rate_limit=Gauge(
                "payhooks_worker_rate_limit_per_second",
                "The operator's cap on the messages the worker takes per second, shared by"
                " its replicas (payhooks worker throttle); 0 when it has none.",
                ["worker"],
                registry=registry,
                multiprocess_mode="max",
            ),
        )

    def set(self, worker: str, paused_at: datetime | None, per_second: float | None) -> None:
        self.operator_paused.labels(worker=worker).set(0 if paused_at is None else 1)
        self.operator_paused_since.labels(worker=worker).set(
            0 if paused_at is None else paused_at.timestamp()
        )
        self.rate_limit.labels(worker=worker).set(per_second or 0)
