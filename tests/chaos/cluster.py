"""`make chaos-cluster` / `python -m tests.chaos.cluster`: make chaos's storm against the highly
available stack, one fault per round, judged from the outside as `make chaos` judges.

The stack is tests/cluster.py's (three clustered RabbitMQ nodes, a PostgreSQL primary with a
synchronous streaming standby; names `hachaos*`, private ports, removed at the end whatever
happens) and `payhooks run all --replicas 2` on it: two copies of every service, ingest behind a
balancer that sends each connection to the next copy that accepts it, as an ingress does. The
services reach the cluster directly (AMQP_URL lists the three nodes, DATABASE_URL names both
PostgreSQL servers with target_session_attrs=read-write), no TCP proxy between.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from bench.processes import ports_for
from services.cli.run_all import REPLICA_PORT_STEP
from shared.process.logs import configure_logging
from tests import cluster, dlx_guard, faults
from tests.chaos.__main__ import RoundResult, render, round_arguments, run_on
from tests.chaos.stack import RETRY_DELAYS, SERVICES, Stack
from tests.proxy import TcpProxy

PREFIX = "hachaos"
REPLICAS = 2
NODE_DOWN_S = 30.0
KILLED_FOR_S = 5.0

Action = Callable[[], Awaitable[None]]


class Balancer(TcpProxy):
    """Each new connection to the next of `ports` that accepts it (round robin)."""

    def __init__(self, ports: list[int]) -> None:
        super().__init__("127.0.0.1", ports[0])
        self.ports = ports
        self._turn = 0

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        error: OSError | None = None
        for _ in self.ports:
            port = self.ports[self._turn % len(self.ports)]
            self._turn += 1
            try:
                return await asyncio.open_connection(self.target_host, port)
            except OSError as e:  # that copy is restarting: the next one
                error = e
        raise error or OSError("no upstream")


class ClusterStack(Stack):
    """A round's system on the cluster: REPLICAS copies of every service."""

    def __init__(self, ha: cluster.Cluster, workdir: Path, replicas: int = REPLICAS) -> None:
        super().__init__(
            ha.postgres.database_url("postgres"),
            ha.rabbit.amqp_url,
            workdir,
            name="chaoscl",
            proxied=False,
            retry_delays=RETRY_DELAYS,
            run_args=("--replicas", str(replicas)),
        )
        self.ha = ha
        self.replicas = replicas
        # Each copy r listens on its service's port + REPLICA_PORT_STEP * r: those must be
        # free too (the cluster's own nodes took ports from the same range).
        while not all(_free(p) for s in self.ports for p in self.replica_ports(s)):
            self.ports = ports_for(self.ports)
        self.balancer = Balancer(self.replica_ports("ingest"))

    def replica_ports(self, service: str) -> list[int]:
        return [self.ports[service] + REPLICA_PORT_STEP * r for r in range(self.replicas)]

    @property
    def ingest_url(self) -> str:
        return f"http://127.0.0.1:{self.balancer.port}"

    async def start(self, log_path: Path) -> None:
        await self.balancer.start()
        await super().start(log_path)

    async def close(self) -> None:
        await super().close()
        await self.balancer.close()

    def admin_amqp_url(self) -> str:
        nodes = cluster.running_nodes(self.ha.rabbit)
        return (nodes or list(self.ha.rabbit.nodes))[0].url

    async def guard_dead_lettering(self) -> None:
        for node in cluster.running_nodes(self.ha.rabbit):
            await asyncio.to_thread(dlx_guard.ensure, node.name)

    async def readiness(self) -> dict[str, int]:
        """/readyz per copy (0: no answer): `orders` (the first copy), `orders#2`, ..."""
        assert self._session is not None
        session = self._session

        async def one(port: int) -> int:
            try:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                    return response.status
            except (aiohttp.ClientError, TimeoutError):
                return 0

        names = [
            (service if r == 0 else f"{service}#{r + 1}", port)
            for service in self.ports
            for r, port in enumerate(self.replica_ports(service))
        ]
        statuses = await asyncio.gather(*(one(port) for _, port in names))
        return {name: status for (name, _), status in zip(names, statuses, strict=True)}


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


# --- the faults ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterFault:
    name: str
    what: str
    inject: Callable[[ClusterStack], Awaitable[None]]
    hold_s: float = 0.0
    restore: Callable[[ClusterStack], Awaitable[None]] | None = None


async def _nodes_up(stack: ClusterStack) -> None:
    """Every RabbitMQ node running (one by one: a node restarting syncs with a running one)."""
    for node in stack.ha.rabbit.nodes:
        if not faults.port_open(node.address):
            await asyncio.to_thread(faults.ensure_rabbitmq, node)


async def _standby_streaming(stack: ClusterStack) -> None:
    """A primary and a synchronous standby streaming from it, whatever the round did."""
    pair = stack.ha.postgres
    primary = await asyncio.to_thread(cluster.primary_of, pair)
    standby = pair.second if primary == pair.first else pair.first
    state = await asyncio.to_thread(cluster.replication, primary)
    if state.get(standby.name) != ("streaming", "sync"):
        await asyncio.to_thread(cluster.rebuild_standby, pair)


async def _all_up(stack: ClusterStack) -> None:
    await _nodes_up(stack)
    await _standby_streaming(stack)


def _orders_queue(stack: ClusterStack) -> str:
    return stack.topology.work["orders"].name


async def _kill_orders_leader(stack: ClusterStack) -> None:
    leader = await asyncio.to_thread(cluster.leader_of, stack.ha.rabbit, _orders_queue(stack))
    print(f"  killing {leader.name}, leader of {_orders_queue(stack)}", file=sys.stderr)
    await asyncio.to_thread(cluster.kill_node, leader)


async def _kill_orders_follower(stack: ClusterStack) -> None:
    leader = await asyncio.to_thread(cluster.leader_of, stack.ha.rabbit, _orders_queue(stack))
    follower = next(n for n in stack.ha.rabbit.nodes if n != leader)
    print(f"  killing {follower.name}, a follower of {_orders_queue(stack)}", file=sys.stderr)
    await asyncio.to_thread(cluster.kill_node, follower)


async def _stop_one_node(stack: ClusterStack) -> None:
    await asyncio.to_thread(cluster.stop_node, stack.ha.rabbit.nodes[1])


async def _stop_two_nodes(stack: ClusterStack) -> None:
    for node in stack.ha.rabbit.nodes[1:]:
        await asyncio.to_thread(cluster.stop_node, node)


async def _one_back_then_all(stack: ClusterStack) -> None:
    """The majority back with one node; the last one 10 s later."""
    await asyncio.to_thread(faults.ensure_rabbitmq, stack.ha.rabbit.nodes[1])
    await asyncio.sleep(10)
    await _all_up(stack)


async def _fail_over(stack: ClusterStack) -> None:
    new, took_s = await asyncio.to_thread(cluster.fail_over, stack.ha.postgres)
    print(f"  primary killed, {new.name} promoted in {took_s:.1f} s", file=sys.stderr)


async def _stop_standby(stack: ClusterStack) -> None:
    standby = await asyncio.to_thread(cluster.standby_of, stack.ha.postgres)
    await asyncio.to_thread(faults.postgres_stop, standby)


async def _start_standby(stack: ClusterStack) -> None:
    for member in stack.ha.postgres.members:
        if not faults.port_open(member.address):
            await asyncio.to_thread(faults.postgres_start, member)
    await _all_up(stack)


async def _kill_one_copy_each(stack: ClusterStack) -> None:
    for service in SERVICES:
        with contextlib.suppress(ProcessLookupError, IndexError):
            os.kill(stack.copies(service)[0], signal.SIGKILL)


async def _kill_every_orders_copy(stack: ClusterStack) -> None:
    for pid in stack.copies("orders"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def _rolling_restart(stack: ClusterStack) -> None:
    """SIGTERM to each copy of each service in turn, the next once the stack is ready again
    (`payhooks run all` starts a copy that exited again, as an orchestrator would)."""
    for service in SERVICES:
        for pid in stack.copies(service):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            for _ in range(300):  # its graceful stop: at most 60 s
                if pid not in stack.copies(service):
                    break
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.5)  # run all's restart backoff
            await stack.wait_ready(90)


FAULTS: tuple[ClusterFault, ...] = (
    ClusterFault("none", "no fault (the baseline)", lambda stack: _nothing()),
    ClusterFault(
        "kill-orders-leader",
        "kill -9 of the RabbitMQ node leading the orders queue, started again after 5 s",
        _kill_orders_leader,
        hold_s=KILLED_FOR_S,
    ),
    ClusterFault(
        "kill-follower",
        "kill -9 of a RabbitMQ node following the orders queue, started again after 5 s",
        _kill_orders_follower,
        hold_s=KILLED_FOR_S,
    ),
    ClusterFault(
        "stop-node",
        "a RabbitMQ node stopped (rabbitmqctl stop) for 30 s",
        _stop_one_node,
        hold_s=NODE_DOWN_S,
    ),
    ClusterFault(
        "stop-two-nodes",
        "two RabbitMQ nodes stopped (majority lost) 30 s, one back, the other 10 s later",
        _stop_two_nodes,
        hold_s=NODE_DOWN_S,
        restore=_one_back_then_all,
    ),
    ClusterFault(
        "pg-failover",
        "kill -9 of the PostgreSQL primary, promotion of the standby",
        _fail_over,
    ),
    ClusterFault(
        "standby-stop",
        "the synchronous standby stopped for 20 s",
        _stop_standby,
        hold_s=20,
        restore=_start_standby,
    ),
    ClusterFault(
        "kill-one-copy-each",
        "kill -9 of one copy of every service at once",
        _kill_one_copy_each,
    ),
    ClusterFault(
        "kill-all-orders",
        "kill -9 of both copies of orders at once",
        _kill_every_orders_copy,
    ),
    ClusterFault(
        "rolling-restart",
        "every copy of every service restarted (SIGTERM) one at a time",
        _rolling_restart,
    ),
)
BY_NAME = {f.name: f for f in FAULTS}


async def _nothing() -> None:
    return None


async def run_cluster_round(
    fault: ClusterFault, args: argparse.Namespace, ha: cluster.Cluster, stacks: list[Stack]
) -> RoundResult:
    stack = ClusterStack(ha, args.out)
    restore = fault.restore or _all_up

    async def inject() -> None:
        await fault.inject(stack)

    async def restored() -> None:
        await restore(stack)

    return await run_on(
        stack, RoundResult(fault.name, fault.what), inject, fault.hold_s, restored, args, stacks
    )


def _run_interruptibly(
    fault: ClusterFault, args: argparse.Namespace, ha: cluster.Cluster
) -> RoundResult:
    stacks: list[Stack] = []
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run_cluster_round(fault, args, ha, stacks))
    except BaseException:
        for stack in stacks:
            stack.kill_now()
        loop.set_exception_handler(lambda loop, context: None)
        sys.unraisablehook = lambda unraisable: None
        raise
    finally:
        loop.close()


def main(argv: list[str] | None = None) -> int:
    parser = round_arguments(
        "python -m tests.chaos.cluster", __doc__, [f.name for f in FAULTS], "chaos-cluster-out"
    )
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    names = [f.name for f in FAULTS] if args.rounds == "all" else args.rounds.split(",")
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown rounds {unknown}")
    if len(args.providers) != 1:  # every round's traffic is one provider's here
        parser.error("--provider takes one provider for the cluster's rounds")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    results: list[RoundResult] = []
    try:
        with cluster.running(PREFIX) as ha:
            print(f"cluster: {cluster.status(PREFIX)}", file=sys.stderr)
            for name in names:
                started = time.monotonic()
                result = _run_interruptibly(BY_NAME[name], args, ha)
                results.append(result)
                verdict_text = "ok" if result.passed else "FAILED"
                took = time.monotonic() - started
                print(f"{name}: {verdict_text} in {took:.0f} s", file=sys.stderr)
                for line in ([result.error] if result.error else []) + result.examples:
                    print(f"  {line}", file=sys.stderr)
                (args.out / "results.json").write_text(
                    json.dumps([asdict(r) for r in results], indent=2)
                )
    except KeyboardInterrupt:
        print("interrupted: the services killed, the cluster removed", file=sys.stderr)
        return 130
    print(render(results))
    print(f"\nlogs and results.json in {args.out}/", file=sys.stderr)
    return 0 if results and all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
