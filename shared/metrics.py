"""Prometheus metrics: one dataclass per service kind, each on a registry made at startup."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Latency buckets in seconds: the accept path lives in milliseconds, the hard budget is 10 s.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

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

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> IngestMetrics:
        registry = registry or CollectorRegistry()
        received = Counter(
            "payhooks_webhooks_received",
            "Webhook requests received, by outcome.",
            ["provider", "outcome"],
            registry=registry,
        )
        for outcome in WEBHOOK_OUTCOMES:
            received.labels(provider="xhub", outcome=outcome)
        return cls(
            registry=registry,
            webhooks_received=received,
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
        )


WORKER_OUTCOMES = ("ok", "skipped_duplicate", "retried", "dead_lettered")


@dataclass(frozen=True, slots=True)
class WorkerMetrics:
    registry: CollectorRegistry
    worker: str
    messages_processed: Counter
    processing_duration: Histogram

    @classmethod
    def create(cls, worker: str, registry: CollectorRegistry | None = None) -> WorkerMetrics:
        registry = registry or CollectorRegistry()
        processed = Counter(
            "payhooks_messages_processed",
            "Messages a worker finished with, by outcome.",
            ["worker", "outcome"],
            registry=registry,
        )
        for outcome in WORKER_OUTCOMES:
            processed.labels(worker=worker, outcome=outcome)
        return cls(
            registry=registry,
            worker=worker,
            messages_processed=processed,
            processing_duration=Histogram(
                "payhooks_processing_duration_seconds",
                "Time a worker spent on one message, from delivery to ack.",
                ["worker"],
                buckets=_LATENCY_BUCKETS,
                registry=registry,
            ),
        )

    def observe(self, outcome: str, duration_s: float) -> None:
        self.messages_processed.labels(worker=self.worker, outcome=outcome).inc()
        self.processing_duration.labels(worker=self.worker).observe(duration_s)


@dataclass(frozen=True, slots=True)
class BonusMetrics:
    points_granted: Counter
    entries: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> BonusMetrics:
        entries = Counter(
            "payhooks_bonus_entries",
            "Bonus ledger entries written, by kind (grant, clawback, restore).",
            ["kind"],
            registry=registry,
        )
        for kind in ("grant", "clawback", "restore"):
            entries.labels(kind=kind)
        return cls(
            points_granted=Counter(
                "payhooks_bonus_points_granted",
                "Bonus points granted (first PAID/SETTLED of a payment).",
                registry=registry,
            ),
            entries=entries,
        )


@dataclass(frozen=True, slots=True)
class EmailMetrics:
    emails_sent: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> EmailMetrics:
        sent = Counter(
            "payhooks_emails_sent",
            "Customer emails accepted by the SMTP server, by template.",
            ["template"],
            registry=registry,
        )
        for template in ("payment_succeeded", "payment_refunded"):
            sent.labels(template=template)
        return cls(emails_sent=sent)


def new_registry() -> CollectorRegistry:
    return CollectorRegistry()


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    """Backlogs an operator watches, refreshed by the api's monitor loop."""

    queue_messages: Gauge
    oldest_age: Gauge
    outbox_backlog: Gauge
    inbox_unpublished: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> QueueMetrics:
        return cls(
            queue_messages=Gauge(
                "payhooks_queue_messages",
                "Messages in a RabbitMQ queue (work queues, unrouted and DLQs).",
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
        )
