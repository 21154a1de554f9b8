"""`unrouted`, the queue of events no worker consumes (issue 11, point 5): bounded by length
and age, an unbounded one from an older version upgraded without a refusal, its oldest age
measured, shown by the CLI and the api without moving anything. Real RabbitMQ (and rabbitmqctl
for the policy, where the run has a vhost of its own)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
import aiormq
import orjson
import pytest
import yaml
from aio_pika.abc import AbstractChannel
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from services.api.app import create_app
from shared.amqp.broker import BROKER, Broker
from shared.amqp.outgoing import Outgoing, to_message
from shared.amqp.topology import (
    UNROUTED_ARGS,
    UNROUTED_MAX_MESSAGES,
    QueueSpec,
    Topology,
    declare,
)
from shared.config import Settings
from tests import run_vhost
from tests.conftest import TEST_AMQP_URL
from tests.helpers import drain, eventually
from tests.integration.system import depths
from tests.integration.test_cli_operators import cli_env, run_payhooks

AUTH = {"Authorization": "Bearer test-admin-token"}  # tests.conftest make_settings
# What versions before the bound declared.
OLD_ARGS = {"x-queue-type": "quorum"}


def with_unrouted_args(topology: Topology, arguments: dict[str, Any]) -> Topology:
    """`topology` with other arguments for `unrouted` (a small bound, or the old ones)."""
    queues = tuple(
        QueueSpec(q.name, arguments, q.bindings) if q.name == topology.unrouted else q
        for q in topology.queues
    )
    return dataclasses.replace(topology, queues=queues)


def unrouted_event(event: str, n: int) -> Outgoing:
    body = orjson.dumps({"event": event, "payment_id": f"pay_{n}", "n": n})
    return Outgoing(event, body, f"evt_{uuid.uuid4().hex}", event, {"provider": "xhub"})


async def publish(channel: AbstractChannel, topology: Topology, outgoing: list[Outgoing]) -> None:
    """Through the events exchange, as ingest publishes: mandatory, each one confirmed."""
    exchange = await channel.get_exchange(topology.exchange, ensure=False)
    for o in outgoing:
        await exchange.publish(to_message(o), o.routing_key, mandatory=True)


async def refuses(channel: AbstractChannel, queue: str, arguments: dict[str, Any]) -> bool:
    """Whether RabbitMQ refuses to declare `queue` with `arguments` (PRECONDITION_FAILED: the
    queue exists with other ones). Its own channel: the refusal closes it."""
    underlay = await channel.get_underlay_channel()
    probe = await underlay.connection.channel()
    try:
        await probe.queue_declare(queue, durable=True, arguments=arguments)
    except aiormq.exceptions.ChannelPreconditionFailed:
        return True
    finally:
        if not probe.is_closed:
            await probe.close()
    return False


# --- the bound -------------------------------------------------------------------------------


async def test_unrouted_is_declared_with_its_bound(
    channel: AbstractChannel, topology: Topology
) -> None:
    assert UNROUTED_ARGS == {
        "x-queue-type": "quorum",
        "x-message-ttl": 7 * 24 * 3600 * 1000,
        "x-max-length": 50_000,
        "x-max-length-bytes": 128 * 1024 * 1024,
        "x-overflow": "drop-head",
    }
    # RabbitMQ holds exactly these: the same declare again is accepted, the old one refused.
    assert not await refuses(channel, topology.unrouted, UNROUTED_ARGS)
    assert await refuses(channel, topology.unrouted, OLD_ARGS)


async def test_beyond_its_length_unrouted_drops_the_oldest_and_every_publish_is_confirmed(
    amqp: AbstractChannel, topology: Topology
) -> None:
    await declare(amqp, with_unrouted_args(topology, {**UNROUTED_ARGS, "x-max-length": 3}))
    sent = [unrouted_event("kyc.status_changed", n) for n in range(5)]
    await publish(amqp, topology, sent)  # drop-head: RabbitMQ refused none of them

    kept = await drain(amqp, topology.unrouted)
    assert [m.message_id for m in kept] == [o.message_id for o in sent[2:]]


async def test_unrouted_messages_expire_after_its_ttl(
    amqp: AbstractChannel, topology: Topology
) -> None:
    await declare(amqp, with_unrouted_args(topology, {**UNROUTED_ARGS, "x-message-ttl": 300}))
    await publish(amqp, topology, [unrouted_event("withdrawal.status_changed", n) for n in (1, 2)])
    queue = await amqp.get_queue(topology.unrouted, ensure=False)

    async def head() -> aio_pika.abc.AbstractIncomingMessage | None:
        message = await queue.get(no_ack=False, fail=False)
        if message is not None:
            await message.nack(requeue=True)  # not expired yet: back to where it was
        return message

    # Quorum queues drop expired messages when they are next asked for them.
    expired = await eventually(head, lambda message: message is None, timeout_s=5)
    assert expired is None
    assert await depths(amqp, [topology.unrouted]) == {topology.unrouted: 0}


# --- an existing deployment: `unrouted` declared before the bound -----------------------------


async def test_unrouted_declared_before_its_bound_keeps_working_and_is_reported(
    amqp: AbstractChannel, topology: Topology, settings: Settings
) -> None:
    await declare(amqp, with_unrouted_args(topology, OLD_ARGS))  # the previous version
    await publish(amqp, topology, [unrouted_event("kyc.status_changed", 0)])

    broker = Broker(settings.amqp_url, topology)
    with capture_logs() as logs:
        await broker.start()
        try:
            await broker.wait_connected(10)
            results = await broker.publish_many(
                [
                    unrouted_event("kyc.status_changed", 1),
                    unrouted_event("payment.status_changed", 2),
                ],
                5.0,
            )
        finally:
            await broker.close()

    assert results == [None, None]  # both confirmed: the service works as before
    assert await depths(amqp, [topology.unrouted, topology.work["orders"].name]) == {
        topology.unrouted: 2,  # the old message is still there
        topology.work["orders"].name: 1,
    }
    warnings = [e for e in logs if e["event"] == "topology.unrouted_unbounded"]
    assert len(warnings) == 1
    assert warnings[0]["log_level"] == "warning"
    assert warnings[0]["queue"] == topology.unrouted
    assert "PRECONDITION_FAILED" in warnings[0]["error"]
    assert not [e for e in logs if e["event"].startswith("broker.") and "unreachable" in e["event"]]
    # Still unbounded: nothing changed the queue.
    assert await refuses(amqp, topology.unrouted, UNROUTED_ARGS)


async def test_upgrade_by_recreating_unrouted_gives_it_its_bound(
    amqp: AbstractChannel, topology: Topology
) -> None:
    await declare(amqp, with_unrouted_args(topology, OLD_ARGS))
    await amqp.queue_delete(topology.unrouted)  # `rabbitmqctl delete_queue unrouted`
    # Until a service declares it again, an unrouted event has nowhere to go: a publish like
    # ingest's (mandatory, returns raise) fails, so ingest answers 503 and X-Hub retries.
    connection = await aio_pika.connect(TEST_AMQP_URL, timeout=10)
    try:
        raising = await connection.channel(on_return_raises=True)
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await publish(raising, topology, [unrouted_event("kyc.status_changed", 0)])
    finally:
        await connection.close()
    with capture_logs() as logs:
        await declare(amqp, topology)  # what the next service to start does
    assert not [e for e in logs if e["event"] == "topology.unrouted_unbounded"]
    assert not await refuses(amqp, topology.unrouted, UNROUTED_ARGS)


def _run_vhost() -> str:
    name = unquote(urlsplit(TEST_AMQP_URL).path.lstrip("/"))
    if not name.startswith("payhooks_run_"):
        pytest.skip("no vhost of the run's own (rabbitmqctl not on this machine)")
    return name


async def test_upgrade_by_policy_bounds_the_old_unrouted_in_place(
    amqp: AbstractChannel, topology: Topology
) -> None:
    """docs/operations.md's policy, with a length of 2 instead of 50,000: RabbitMQ 3.10
    accepts its keys for a quorum queue and applies them to the queue as it is, messages
    included."""
    vhost = _run_vhost()
    await declare(amqp, with_unrouted_args(topology, OLD_ARGS))
    policy = f"payhooks-unrouted-{uuid.uuid4().hex[:8]}"
    definition = {
        "max-length": 2,
        "max-length-bytes": 134217728,
        "overflow": "drop-head",
        "message-ttl": 604800000,
    }
    run_vhost._rabbitmqctl(
        "set_policy",
        "-p",
        vhost,
        "--apply-to",
        "queues",
        policy,
        f"^{re.escape(topology.unrouted)}$",
        orjson.dumps(definition).decode(),
    )
    try:
        sent = [unrouted_event("kyc.status_changed", n) for n in range(4)]
        await publish(amqp, topology, sent)
        kept = await drain(amqp, topology.unrouted)
        assert [m.message_id for m in kept] == [o.message_id for o in sent[2:]]
    finally:
        run_vhost._rabbitmqctl("clear_policy", "-p", vhost, policy)


# --- looking at it: CLI, api, gauge -----------------------------------------------------------


async def test_payhooks_unrouted_show_counts_and_shows_without_moving_anything(
    channel: AbstractChannel, topology: Topology, settings: Settings
) -> None:
    env = cli_env(settings)
    empty = await run_payhooks(env, "unrouted", "show")
    assert empty.code == 0, empty.err  # an empty queue is an answer, not a failure
    assert f"{topology.unrouted}: 0 message(s)" in empty.out

    sent = [
        unrouted_event("kyc.status_changed", 0),
        unrouted_event("withdrawal.status_changed", 1),
        unrouted_event("kyc.status_changed", 2),
        unrouted_event("subscription.renewed", 3),
    ]
    await publish(channel, topology, sent)

    shown = await run_payhooks(env, "unrouted", "show", "--limit", "3", "--json")
    assert shown.code == 0, shown.err
    data = shown.json()
    assert data["queue"] == topology.unrouted
    assert data["total"] == 4
    assert data["shown"] == 3
    assert data["by_event"] == {  # of all four
        "kyc.status_changed": 2,
        "withdrawal.status_changed": 1,
        "subscription.renewed": 1,
    }
    assert [m["id"] for m in data["messages"]] == [o.message_id for o in sent[:3]]
    assert data["messages"][1] == {
        "id": sent[1].message_id,
        "event": "withdrawal.status_changed",
        "payment_id": "pay_1",
        "provider": "xhub",
        "published_at": data["messages"][1]["published_at"],
    }
    published = dt.datetime.fromisoformat(data["messages"][0]["published_at"])
    assert abs((dt.datetime.now(dt.UTC) - published).total_seconds()) < 60
    assert 0 <= data["oldest_age_seconds"] < 60

    text = await run_payhooks(env, "unrouted", "show")
    assert text.code == 0, text.err
    assert f"{topology.unrouted}: 4 message(s) no worker consumes" in text.out
    assert "subscription.renewed" in text.out
    assert "all 4 by event: kyc.status_changed 2" in text.out

    # Looking moved nothing: all four, in their order.
    kept = await drain(channel, topology.unrouted)
    assert [m.message_id for m in kept] == [o.message_id for o in sent]


@pytest.fixture
async def api(
    aiohttp_client: Any, settings: Settings, db: Any, channel: AbstractChannel
) -> TestClient:
    app = create_app(settings, monitor_interval_s=0.05)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    return client


async def test_api_shows_unrouted_and_its_monitor_leaves_it_in_order(
    api: TestClient, channel: AbstractChannel, topology: Topology
) -> None:
    # Published an hour ago (the AMQP timestamp payhooks' publishers set), then two new ones.
    old = unrouted_event("kyc.status_changed", 0)
    message = aio_pika.Message(
        old.body,
        message_id=old.message_id,
        type=old.type,
        timestamp=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1),
    )
    exchange = await channel.get_exchange(topology.exchange, ensure=False)
    await exchange.publish(message, old.routing_key, mandatory=True)
    new = [unrouted_event("exchange.status_changed", n) for n in (1, 2)]
    await publish(channel, topology, new)
    # The monitor (every 50 ms here) counts unrouted.
    await eventually(lambda: metrics_text(api), lambda t: 'queue="unrouted"} 3.0' in t)

    unauthorized = await api.get("/api/unrouted")
    assert unauthorized.status == 401
    bad = await api.get("/api/unrouted?limit=0", headers=AUTH)
    assert bad.status == 400
    for _ in range(3):  # each look hands everything back in order
        response = await api.get("/api/unrouted?limit=1", headers=AUTH)
        assert response.status == 200
        data = await response.json()
        assert data["total"] == 3
        assert [m["id"] for m in data["messages"]] == [old.message_id]
        assert data["by_event"] == {"exchange.status_changed": 2, "kyc.status_changed": 1}
        assert 3600 <= data["oldest_age_seconds"] < 3660

    await api.close()  # the monitor stops: nothing holds the messages while they are drained
    kept = await drain(channel, topology.unrouted)
    assert [m.message_id for m in kept] == [old.message_id] + [o.message_id for o in new]


async def metrics_text(client: TestClient) -> str:
    return await (await client.get("/metrics")).text()


def test_near_limit_alert_is_eighty_percent_of_the_bound() -> None:
    alerts = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "deploy/prometheus/alerts.yml").read_text()
    )
    rules = {r["alert"]: r for g in alerts["groups"] for r in g["rules"]}
    expr = rules["PayhooksUnroutedNearLimit"]["expr"]
    assert expr.endswith(f"> {int(UNROUTED_MAX_MESSAGES * 0.8)}")
    assert (
        f"{UNROUTED_MAX_MESSAGES:,}" in rules["PayhooksUnroutedNearLimit"]["annotations"]["summary"]
    )
