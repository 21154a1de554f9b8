"""Prometheus metrics: one dataclass per service kind, each on a registry made at startup."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

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
