"""The table bench.copies prints: both stacks side by side with ratios, and the sizing
arithmetic of docs/high-availability.md ("What copies cost") from what it measured."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from bench import leader

PAYHOOKS = ("ingest", "orders", "bonuses", "email")
# The load each component must carry at most, as a share of its cores, in the sizing: room
# for bursts and for a lost node's or copy's work.
UTILISATION = 0.6
TARGETS = (1_000, 10_000)
WORK_QUEUES = ("orders", "bonuses", "emails")  # one message each per paid payment


@dataclass(slots=True)
class WorkersRun:
    per_s: float
    us: dict[str, float]  # CPU us per payment per group, the servers' idle taken off
    p99_ms: float  # end-to-end (accept -> email)
    ingest_p99_ms: float
    ok: bool
    servers_idle_pct: float  # the servers' CPU with no load just before (taken off), % of a core
    others_pct: float  # what other processes took meanwhile, % of a core


@dataclass(slots=True)
class IngestRun:
    per_s: float
    p99_ms: float
    us: dict[str, float]
    ok: bool


# --- the table ---------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> str:
    return f"{b / a:.2f}x" if a and not math.isnan(a) and not math.isnan(b) else "-"


def _payhooks_us(us: dict[str, float]) -> float:
    return sum(us.get(g, 0.0) for g in PAYHOOKS)


def _total_us(us: dict[str, float]) -> float:
    return _payhooks_us(us) + us.get("rabbitmq", 0.0) + us.get("postgres", 0.0)


def _idle(run: WorkersRun) -> float:
    return run.servers_idle_pct


def _node_rows(us: dict[str, float], prefix: str) -> list[str]:
    return sorted(g for g in us if g.startswith(prefix + "/"))


def table(
    runs: dict[tuple[str, int, bool], WorkersRun],
    ingests: dict[str, IngestRun],
    leaders: dict[str, tuple[leader.Measured, str]],
    rate: float,
) -> list[str]:
    """Markdown: single and cluster side by side, one copy and two, with ratios."""
    head = (
        "| | single, 1 copy | cluster, 1 copy | cluster / single"
        " | single, 2 copies | cluster, 2 copies | cluster / single | cluster 2 / single 1 |"
    )
    lines = [head, "|---" * 8 + "|"]

    def group_of(group: str) -> Callable[[WorkersRun], float]:
        return lambda r: r.us.get(group, 0.0)

    def workers_row(label: str, value: Callable[[WorkersRun], float], spec: str) -> None:
        cells: list[str] = []
        for replicas in (1, 2):
            a, b = value(runs["single", replicas, False]), value(runs["cluster", replicas, False])
            cells += [format(a, spec), format(b, spec), _ratio(a, b)]
        first = value(runs["single", 1, False])
        last = value(runs["cluster", 2, False])
        lines.append(f"| {label} | {' | '.join(cells)} | {_ratio(first, last)} |")

    def paced_row(label: str, value: Callable[[WorkersRun], float]) -> None:
        cells: list[str] = []
        for replicas in (1, 2):
            a, b = value(runs["single", replicas, True]), value(runs["cluster", replicas, True])
            cells += [f"{a:,.0f}", f"{b:,.0f}", _ratio(a, b)]
        first, last = value(runs["single", 1, True]), value(runs["cluster", 2, True])
        lines.append(f"| {label} | {' | '.join(cells)} | {_ratio(first, last)} |")

    def short_row(label: str, a: float, b: float, spec: str) -> None:
        lines.append(
            f"| {label} | {format(a, spec)} | {format(b, spec)} | {_ratio(a, b)} | | | | |"
        )

    lines.append("| **bench.workers** (paid payments, open-ended) | | | | | | | |")
    workers_row("payments/s", lambda r: r.per_s, ",.0f")
    workers_row("CPU us/payment, all", lambda r: _total_us(r.us), ",.0f")
    workers_row("  payhooks (4 services)", lambda r: _payhooks_us(r.us), ",.0f")
    for group in PAYHOOKS:
        workers_row(f"    {group}", group_of(group), ",.0f")
    workers_row("  RabbitMQ (all nodes)", lambda r: r.us.get("rabbitmq", 0.0), ",.0f")
    sample = runs["cluster", 1, False].us
    for group in _node_rows(sample, "rabbitmq"):
        workers_row(f"    {group}", group_of(group), ",.0f")
    workers_row("  PostgreSQL (both)", lambda r: r.us.get("postgres", 0.0), ",.0f")
    for group in _node_rows(sample, "postgres"):
        workers_row(f"    {group}", group_of(group), ",.0f")
    workers_row("servers' CPU with no load (taken off), % of a core", _idle, ".0f")
    workers_row("other work meanwhile, % of a core", lambda r: r.others_pct, ".0f")
    lines.append(f"| **bench.workers paced at {rate:,.0f}/s** | | | | | | | |")
    paced_row("end-to-end p99 ms (200 -> email)", lambda r: r.p99_ms)
    paced_row("ingest answer p99 ms", lambda r: r.ingest_p99_ms)
    one, two = ingests["single"], ingests["cluster"]
    lines.append("| **bench.ingest** (batched, 10 % duplicates) | | | | | | | |")
    short_row("accepted/s", one.per_s, two.per_s, ",.0f")
    short_row("answer p99 ms", one.p99_ms, two.p99_ms, ".1f")
    for group in ("ingest", "rabbitmq", "postgres"):
        short_row(f"CPU us/request {group}", one.us.get(group, 0), two.us.get(group, 0), ",.0f")
    (m1, g1), (m2, g2) = leaders["single"], leaders["cluster"]
    lines.append("| **one quorum queue** (publishers + 2 consumers) | | | | | | | |")
    short_row("messages/s", m1.per_s, m2.per_s, ",.0f")
    short_row("CPU us/message, leader's node", m1.us_per_message(g1), m2.us_per_message(g2), ".0f")
    followers = [g for g in m2.cpu_pct if g.startswith("rabbitmq/") and g != g2]
    for group in sorted(followers):
        lines.append(
            f"| CPU us/message, follower {group} | - | {m2.us_per_message(group):.0f} | | | | | |"
        )
    short_row(
        "CPU us/message, all nodes",
        m1.us_per_message("rabbitmq"),
        m2.us_per_message("rabbitmq"),
        ".0f",
    )
    return lines


def sizing(
    runs: dict[tuple[str, int, bool], WorkersRun], leaders: dict[str, tuple[leader.Measured, str]]
) -> list[str]:
    """Cores, copies and queue partitions for TARGETS payments/s, from the cluster's CPU per
    payment with two copies of every service (the configuration deployed) and from one
    quorum queue's leader."""
    us = runs["cluster", 2, False].us
    measured, group = leaders["cluster"]
    leader_us = measured.us_per_message(group)
    # One queue's leader is one Erlang process, so it gets at most one core whatever the
    # node has. All of its node's CPU per message (channels and connections included) is
    # more than that process's own, so one core / that is a floor under its ceiling.
    floor = 1e6 / leader_us if leader_us else math.nan
    lines = [
        f"sizing from the cluster, 2 copies: CPU per payment, each component at most"
        f" {UTILISATION:.0%} busy",
    ]
    for target in TARGETS:

        def cores(value_us: float, target: int = target) -> float:
            return target * value_us / 1e6 / UTILISATION

        copies = ", ".join(
            f"{name} {max(2, math.ceil(cores(us.get(name, 0.0))))}" for name in PAYHOOKS
        )
        nodes = sorted(g for g in us if g.startswith("rabbitmq/"))
        busiest = max((us[g] for g in nodes), default=0.0)
        total = cores(sum(us.get(g, 0.0) for g in (*PAYHOOKS, "rabbitmq", "postgres")))
        lines += [
            f"  {target:,} payments/s: {total:.1f} cores in all",
            f"    payhooks {cores(sum(us.get(g, 0.0) for g in PAYHOOKS)):.1f} cores;"
            f" copies of one core each (at least 2): {copies}",
            f"    RabbitMQ {cores(us.get('rabbitmq', 0.0)):.1f} cores over {len(nodes)} nodes,"
            f" the busiest node {cores(busiest):.1f}",
            f"    PostgreSQL primary {cores(us.get('postgres/primary', 0.0)):.1f} cores,"
            f" standby {cores(us.get('postgres/standby', 0.0)):.1f}",
        ]
    lines.append(
        f"one quorum queue: {measured.per_s:,.0f} messages/s measured here (the box, not the"
        f" leader, was the limit); the leader's node spent {leader_us:.0f} us/message:"
        f" one core of leader holds at least {floor:,.0f} messages/s"
    )
    for target in TARGETS:
        need = math.ceil(target / (UTILISATION * floor)) if not math.isnan(floor) else 0
        lines.append(
            f"  {target:,} payments/s = {target:,} messages/s on each of"
            f" {', '.join(WORK_QUEUES)}: {need} partition(s) each by that floor"
            f" at {UTILISATION:.0%}"
        )
    return lines
