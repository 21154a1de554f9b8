"""Topology as data: names under a prefix, quorum arguments, retry ladders, routing."""

from __future__ import annotations

import pytest

from shared.amqp.topology import (
    DELIVERY_LIMIT,
    QueueSpec,
    Topology,
    build_topology,
    is_routed,
    retry_queue_name,
    routing_key,
)

DELAYS_S = (1.0, 5.0, 30.0)


@pytest.fixture
def topology() -> Topology:
    return build_topology("t1.", DELAYS_S)


def queue(topology: Topology, name: str) -> QueueSpec:
    [spec] = [q for q in topology.queues if q.name == name]
    return spec


def test_exchange_and_unrouted_names_carry_the_prefix(topology: Topology) -> None:
    assert topology.prefix == "t1."
    assert topology.exchange == "t1.payhooks.events"
    assert topology.alternate_exchange == "t1.payhooks.unrouted"
    assert topology.unrouted == "t1.unrouted"


def test_without_prefix_names_are_the_spec_names() -> None:
    topology = build_topology("", (1.0,))

    assert topology.exchange == "payhooks.events"
    assert topology.unrouted == "unrouted"
    assert {w.name for w in topology.work.values()} == {"orders", "bonuses", "emails"}
    assert {w.dlq for w in topology.work.values()} == {"orders.dlq", "bonuses.dlq", "emails.dlq"}


def test_work_queues_have_a_dlq_and_a_retry_queue_per_delay(topology: Topology) -> None:
    orders = topology.work_queue("orders")

    assert orders.name == "t1.orders"
    assert orders.dlq == "t1.orders.dlq"
    assert orders.retry_queues == (
        "t1.orders.retry.1000ms",
        "t1.orders.retry.5000ms",
        "t1.orders.retry.30000ms",
    )
    assert topology.work_queue("bonuses").dlq == "t1.bonuses.dlq"
    assert topology.work_queue("emails").retry_queues[0] == "t1.emails.retry.1000ms"


def test_every_queue_is_declared_once_and_carries_the_prefix(topology: Topology) -> None:
    names = [q.name for q in topology.queues]

    assert len(names) == len(set(names))
    assert all(name.startswith("t1.") for name in names)
    # unrouted + 3 x (work queue, DLQ, one retry queue per delay)
    assert len(names) == 1 + 3 * (2 + len(DELAYS_S))


def test_every_queue_is_a_quorum_queue(topology: Topology) -> None:
    assert all(q.arguments["x-queue-type"] == "quorum" for q in topology.queues)


@pytest.mark.parametrize("base", ["orders", "bonuses", "emails"])
def test_work_queue_dead_letters_at_least_once_into_its_dlq(topology: Topology, base: str) -> None:
    work = topology.work_queue(base)

    args = queue(topology, work.name).arguments

    assert args["x-dead-letter-exchange"] == ""
    assert args["x-dead-letter-routing-key"] == work.dlq
    assert args["x-dead-letter-strategy"] == "at-least-once"
    assert args["x-overflow"] == "reject-publish"
    assert args["x-delivery-limit"] == DELIVERY_LIMIT


def test_retry_queue_expires_back_into_its_work_queue(topology: Topology) -> None:
    orders = topology.work_queue("orders")

    for name, delay_s in zip(orders.retry_queues, DELAYS_S, strict=True):
        args = queue(topology, name).arguments
        assert args["x-message-ttl"] == round(delay_s * 1000)
        assert args["x-dead-letter-exchange"] == ""
        assert args["x-dead-letter-routing-key"] == orders.name
        assert args["x-dead-letter-strategy"] == "at-least-once"
        assert args["x-overflow"] == "reject-publish"
        assert queue(topology, name).bindings == ()


def test_dlq_keeps_its_messages(topology: Topology) -> None:
    args = queue(topology, "t1.orders.dlq").arguments

    assert "x-message-ttl" not in args
    assert "x-dead-letter-exchange" not in args


def test_orders_is_bound_to_payment_and_refund_events(topology: Topology) -> None:
    assert queue(topology, "t1.orders").bindings == ("payment.status_changed", "refund.*")
    assert queue(topology, "t1.bonuses").bindings == ("order.*",)
    assert queue(topology, "t1.emails").bindings == ("order.*",)


@pytest.mark.parametrize(
    ("delay_s", "name"),
    [(1.0, "q.retry.1000ms"), (0.2, "q.retry.200ms"), (600, "q.retry.600000ms")],
)
def test_retry_queue_name_carries_the_delay_in_milliseconds(delay_s: float, name: str) -> None:
    assert retry_queue_name("q", delay_s) == name


def test_a_new_retry_ladder_gets_new_queue_names() -> None:
    before = build_topology("", (1.0, 5.0)).work_queue("orders").retry_queues
    after = build_topology("", (1.0, 10.0)).work_queue("orders").retry_queues

    assert before[1] != after[1]


@pytest.mark.parametrize(
    "event_type",
    [
        "payment.status_changed",
        "refund.completed",
        "refund.reversed",
        "refund.failed",
        "order.paid",
        "order.refunded",
    ],
)
def test_consumed_event_types_are_routed(event_type: str) -> None:
    assert is_routed(event_type)


@pytest.mark.parametrize(
    "event_type",
    [
        "kyc.status_changed",
        "withdrawal.status_changed",
        "payment.status_changed.v2",
        "payment",
        "refund",
        "refund.completed.extra",
        "x" * 300,
    ],
)
def test_other_event_types_are_not_routed(event_type: str) -> None:
    assert not is_routed(event_type)


def test_routing_key_is_the_event_type() -> None:
    assert routing_key("payment.status_changed") == "payment.status_changed"
    assert routing_key("kyc.status_changed") == "kyc.status_changed"


def test_event_type_of_300_characters_gets_unroutable() -> None:
    assert routing_key("x" * 300) == "unroutable"


def test_routing_key_limit_counts_utf8_bytes() -> None:
    assert routing_key("x" * 255) == "x" * 255
    assert routing_key("é" * 128) == "unroutable"  # 256 bytes in 128 characters
