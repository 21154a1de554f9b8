"""The traffic of a chaos round: the simulator's payments, sent as X-Hub (or the round's
provider) sends them (its default flows, settled then refunded and expired then paid among
them; duplicates, reordering, lost webhooks), delivered at a steady pace with X-Hub's retry
ladders (time-scaled), so that some are in flight before,
during and after the fault."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import asyncpg

from services.sim import scenario
from services.sim.deliverer import Deliverer, DeliveryRecord
from shared.providers import registry
from tests.chaos.stack import SECRET, STANDARD_SECRET, STRIPE_SECRET, Stack

SECRETS = {"xhub": SECRET, "standard": STANDARD_SECRET, "stripe": STRIPE_SECRET}


@dataclass(frozen=True, slots=True)
class StormConfig:
    payments: int = 300
    sends_per_s: float = 20.0
    time_scale: float = 10.0  # X-Hub's ladders 10x faster: 1 s -> 0.1 s, 5 min -> 30 s
    concurrency: int = 16
    lost_rate: float = 0.03
    seed: int | None = None
    providers: tuple[str, ...] = ("xhub",)  # who sends them (dealt round-robin)


def keys() -> dict[str, bytes]:
    """The key every provider the stack serves signs with."""
    return {
        name: registry.BY_NAME[name].parse_secrets(secret)[0] for name, secret in SECRETS.items()
    }


async def prepare(stack: Stack, config: StormConfig) -> scenario.Plan:
    """The round's plan, its orders registered and its payments known to the provider's API."""
    plan = scenario.generate(
        scenario.ScenarioConfig(
            payments=config.payments,
            duplicate_rate=0.1,
            reorder_rate=0.2,
            lost_rate=config.lost_rate,
            concurrency=config.concurrency,
            seed=config.seed,
            prefix=f"chaos{int(time.time())}",
            providers=config.providers,
        )
    )
    scenario.publish_to_api(plan, stack.book)
    pool = await asyncpg.create_pool(stack.database_url, min_size=1, max_size=2)
    try:
        await scenario.register_orders(pool, plan.payments)
    finally:
        await pool.close()
    return plan


async def deliver(stack: Stack, plan: scenario.Plan, config: StormConfig) -> list[DeliveryRecord]:
    """Start one delivery every 1/sends_per_s seconds; wait until every one has ended
    (delivered, or failed after X-Hub's ladder)."""
    async with Deliverer(
        stack.ingest_url,
        SECRET.encode(),
        keys=keys(),
        time_scale=config.time_scale,
        concurrency=config.concurrency,
    ) as deliverer:
        tasks = []
        loop = asyncio.get_running_loop()
        started = loop.time()
        for n, (webhook, copy) in enumerate(plan.sends, 1):
            tasks.append(asyncio.create_task(deliverer.deliver(webhook, copy)))
            # On a schedule, not a fixed sleep per send: the sleeps' overhead made a 30-minute
            # soak send at 115/s instead of 130/s and run long.
            if (wait := started + n / config.sends_per_s - loop.time()) > 0:
                await asyncio.sleep(wait)
        records = list(await asyncio.gather(*tasks))
    return records + scenario.lost_records(plan)
