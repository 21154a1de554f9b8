"""The simulator's scenario: N payments with a mix of flows (FLOWS), sent as X-Hub would, with
duplicates (same X-Webhook-Id, later), reordering (newest first) and lost webhooks (never sent:
only the payments API knows the status they carried).

Which losses matter: the provider's API answers only a payment's current status (its flow's
last one). A lost webhook that a later one covers (the `paid` before a `settled`, the `settled`
before a `refunded`, the `expired` before a `paid`) changes nothing: the order machine reaches
the same state without it. A lost last webhook leaves the order behind the provider, and only
the reconciler, asking for the current status, brings it there. The flows hold nothing a
current status cannot show (a refund later reversed, a partial refund), so every loss here is
either harmless or repairable.

Providers (`providers`): the payments are dealt round-robin among them (payment n to
providers[n % len]), each payment's webhooks sent as its provider sends them. A provider
without a payments API (Standard Webhooks) cannot be asked: its lost webhooks stay lost, the
API does not know its payments, and its expected end state is what its webhooks that were
sent bring it to (summary.expect; docs/simulator.md)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Final

from services.sim.api import PaymentBook
from services.sim.deliverer import Deliverer, DeliveryRecord, Result, SimWebhook
from shared.db import Executor
from shared.providers import registry
from shared.providers.xhub.events import status_changed
from shared.queries import orders as orders_sql

FLOWS: Final[Mapping[str, tuple[str, ...]]] = {
    "paid": ("paid",),
    "settled": ("paid", "settled"),
    "refunded": ("paid", "refunded"),
    "expired": ("expired",),
    "settled_refunded": ("paid", "settled", "refunded"),  # a refund after settlement
    "expired_paid": ("expired", "paid"),  # paid after all (CANCELLED -> PAID)
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioConfig:
    payments: int = 100
    flows: Mapping[str, float] = field(default_factory=lambda: dict.fromkeys(FLOWS, 1.0))
    duplicate_rate: float = 0.1
    reorder_rate: float = 0.2
    lost_rate: float = 0.05  # share of all webhooks never sent (exactly, rounded)
    concurrency: int = 10
    merchants: int = 3
    amount: Decimal = Decimal("100.00")
    currency: str = "USD"
    seed: int | None = None
    prefix: str = "sim"  # payment ids are f"{prefix}_{run}_{n}"
    # Who sends the payments' webhooks, dealt round-robin (registry names).
    providers: tuple[str, ...] = (registry.DEFAULT.name,)

    def __post_init__(self) -> None:
        for name in ("duplicate_rate", "reorder_rate", "lost_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1")
        if self.payments < 0 or self.concurrency < 1 or self.merchants < 1:
            raise ValueError("payments >= 0, concurrency >= 1 and merchants >= 1 are required")
        unknown = set(self.flows) - set(FLOWS)
        if unknown or not any(w > 0 for w in self.flows.values()):
            raise ValueError(f"flows must weigh some of {sorted(FLOWS)}; unknown: {unknown}")
        if not self.providers or set(self.providers) - set(registry.BY_NAME):
            raise ValueError(f"providers must be some of {sorted(registry.BY_NAME)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SimPayment:
    payment_id: str
    order_id: str
    user_id: str
    email: str
    merchant_id: str
    amount: Decimal
    currency: str
    flow: str
    statuses: tuple[str, ...]  # in provider time order
    events: tuple[SimWebhook, ...]  # one per status, same order
    lost_ids: frozenset[str]  # event ids never sent
    reordered: bool  # sent newest first
    provider: str = registry.DEFAULT.name

    @property
    def repairable(self) -> bool:
        """The reconciler can bring it to its final status whatever webhooks were lost: its
        provider has a payments API, and the reconciler knows to ask it. Orders do not record
        their provider, so it asks X-Hub about an order no webhook has named: a payment of
        another provider (Stripe) all of whose webhooks were lost is answered 404 there and
        stays where its (no) webhooks bring it (docs/simulator.md)."""
        if not registry.BY_NAME[self.provider].has_payment_api:
            return False
        return registry.asks_xhub(self.provider) or bool(self.sent_events)

    @property
    def final_status(self) -> str:
        return self.statuses[-1]

    @property
    def lost(self) -> bool:
        """Some webhook of this payment is never sent."""
        return bool(self.lost_ids)

    @property
    def sent_events(self) -> tuple[SimWebhook, ...]:
        """The events sent at least once, in provider time order."""
        return tuple(w for w in self.events if w.event_id not in self.lost_ids)

    @property
    def lost_events(self) -> tuple[SimWebhook, ...]:
        return tuple(w for w in self.events if w.event_id in self.lost_ids)

    @property
    def sent_statuses(self) -> tuple[str, ...]:
        return tuple(str(w.status) for w in self.sent_events)

    @property
    def updated_at(self) -> datetime:
        return datetime.fromisoformat(str(self.events[-1].payload["created_at"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    payments: tuple[SimPayment, ...]
    sends: tuple[tuple[SimWebhook, int], ...]  # (webhook, copy number) in send order


def generate(config: ScenarioConfig, *, now: datetime | None = None) -> Plan:
    """Pure: the payments and the order their webhooks are sent in (same seed, same plan)."""
    rng = random.Random(config.seed)
    run = f"{rng.getrandbits(32):08x}"
    start = now or datetime.now(UTC)
    names = [name for name, weight in config.flows.items() if weight > 0]
    weights = [config.flows[name] for name in names]
    drafts: list[SimPayment] = []
    for n in range(config.payments):
        flow = rng.choices(names, weights)[0]
        payment_id = f"{config.prefix}_{run}_{n:05d}"
        merchant_id = f"merchant_{n % config.merchants}"
        provider = config.providers[n % len(config.providers)]
        # A provider without settlement (Stripe) sends none: `settled` is its `paid`, and
        # `settled_refunded` its `refunded` (docs/simulator.md).
        settles = registry.BY_NAME[provider].has_settlement
        statuses = tuple(s for s in FLOWS[flow] if settles or s != "settled")
        events = tuple(
            SimWebhook(
                event_id=f"evt_{payment_id}_{i}_{status}",
                merchant_id=merchant_id,
                provider=provider,
                payload=status_changed(
                    payment_id,
                    status,
                    f"{config.amount:.2f}",
                    config.currency,
                    (start + timedelta(seconds=i + 1)).isoformat(),
                    external_id=f"ord_{payment_id}",
                ),
            )
            for i, status in enumerate(statuses)
        )
        drafts.append(
            SimPayment(
                payment_id=payment_id,
                order_id=f"ord_{payment_id}",
                user_id=f"user_{payment_id}",
                email=f"{payment_id}@customer.test",
                merchant_id=merchant_id,
                amount=config.amount,
                currency=config.currency,
                flow=flow,
                statuses=statuses,
                events=events,
                lost_ids=frozenset(),
                reordered=len(events) > 1 and rng.random() < config.reorder_rate,
                provider=provider,
            )
        )
    lost = _lost(rng, [w.event_id for p in drafts for w in p.events], config)
    payments = [replace(p, lost_ids=frozenset(w.event_id for w in p.events) & lost) for p in drafts]
    streams = [
        list(reversed(p.sent_events)) if p.reordered else list(p.sent_events) for p in payments
    ]
    sends = _interleave(rng, streams)
    return Plan(payments=tuple(payments), sends=_with_duplicates(rng, sends, config))


def _lost(rng: random.Random, event_ids: list[str], config: ScenarioConfig) -> frozenset[str]:
    """`lost_rate` of all the events, picked at random whatever their payment or position."""
    return frozenset(rng.sample(event_ids, round(config.lost_rate * len(event_ids))))


def _interleave(rng: random.Random, streams: list[list[SimWebhook]]) -> list[SimWebhook]:
    """Merge the payments' streams at random, keeping each stream's own order."""
    pending = [list(reversed(s)) for s in streams if s]
    merged: list[SimWebhook] = []
    while pending:
        i = rng.randrange(len(pending))
        merged.append(pending[i].pop())
        if not pending[i]:
            pending[i] = pending[-1]
            pending.pop()
    return merged


def _with_duplicates(
    rng: random.Random, sends: list[SimWebhook], config: ScenarioConfig
) -> tuple[tuple[SimWebhook, int], ...]:
    """Each event is sent again with probability duplicate_rate, somewhere after itself.

    Linear: the copy of the send at position i gets a random place in (i, n], and everything
    is sorted by place (a search and an insert per copy made a soak's plan take half an hour).
    """
    n = len(sends)
    placed = [(float(i), 0, w) for i, w in enumerate(sends)]
    for i, webhook in enumerate(sends):
        if rng.random() < config.duplicate_rate:
            placed.append((rng.uniform(i, n), 1, webhook))  # a tie sorts after the original
    placed.sort(key=lambda p: (p[0], p[1]))
    return tuple((w, copy) for _, copy, w in placed)


def publish_to_api(plan: Plan, book: PaymentBook) -> None:
    """The provider knows every payment's final status (lost ones included): the payments of
    providers with an API, each answered on its provider's route in its provider's shape; a
    provider without an API has none to ask."""
    for p in plan.payments:
        if registry.BY_NAME[p.provider].has_payment_api:
            book.set_status(
                p.payment_id, p.final_status, p.amount, p.currency, p.updated_at, p.provider
            )


async def register_orders(db: Executor, payments: Sequence[SimPayment]) -> int:
    """Register the shop's orders (idempotent); return how many were new."""
    created = 0
    for p in payments:
        _, new = await orders_sql.register_order(
            db,
            orders_sql.NewOrder(
                order_id=p.order_id,
                payment_id=p.payment_id,
                user_id=p.user_id,
                email=p.email,
                amount=p.amount,
                currency=p.currency,
            ),
        )
        created += int(new)
    return created


async def deliver(plan: Plan, deliverer: Deliverer) -> list[DeliveryRecord]:
    """Send every planned delivery (at most the deliverer's concurrency in flight) and wait
    for each to end; lost webhooks are listed as LOST with no attempt."""
    tasks = [asyncio.create_task(deliverer.deliver(w, copy)) for w, copy in plan.sends]
    return [*await asyncio.gather(*tasks), *lost_records(plan)]


def lost_records(plan: Plan) -> list[DeliveryRecord]:
    """The records of the webhooks the provider never sends (the lost ones)."""
    return [lost_record(w) for p in plan.payments for w in p.lost_events]


def lost_record(webhook: SimWebhook) -> DeliveryRecord:
    """The record of a webhook the provider never sent (a lost one)."""
    return DeliveryRecord(
        event_id=webhook.event_id,
        payment_id=webhook.payment_id,
        merchant_id=webhook.merchant_id,
        event_type=webhook.event_type,
        status=webhook.status,
        provider=webhook.provider,
        result=Result.LOST,
    )
