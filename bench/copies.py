"""What copies cost: the same benches on the machine's single RabbitMQ node and PostgreSQL and
on a highly available stack of this run's own, in one sitting, side by side.

    python -m bench.copies [--n 4000] [--paced-n 3000] [--ingest-n 10000] [--leader-seconds 8]

`make bench-copies`. It brings up tests/cluster.py's stack under the prefix `copies` (three
clustered RabbitMQ nodes `copies1..3@localhost`, whose quorum queues have a member on each,
and PostgreSQL `15/copies_a` with `15/copies_b` its synchronous standby) and removes it at the
end whatever happens (an error, Ctrl-C, SIGTERM). Against each stack, in turn:

1. bench.workers open-ended (N paid payments through ingest, orders, bonuses, email) with one
   copy of every service, then with two (`--replicas 2`: competing consumers, the clients
   split over the two ingest copies);
2. the same four again paced at one rate for all (half the slowest open-ended rate), for the
   end-to-end p99 at a rate every configuration sustains;
3. bench.ingest's batched server (unique webhooks and 10 % duplicates, 1 KB);
4. one quorum queue driven by several publishers and a consumer (bench/leader.py).

The single stack is 127.0.0.1:5672 (a vhost of the run's own) and 127.0.0.1:5432 (database
`payhooks_bench_copies`, dropped at the end); the cluster is given to payhooks as payhooks
would be deployed: AMQP_URL listing the three nodes, a two-host DATABASE_URL with
target_session_attrs=read-write. CPU is counted per process from /proc for payhooks' processes
and for the servers of the stack measured: the single node's beam.smp and PostgreSQL `main`
(backends of other databases left out), or all three beam.smp and both PostgreSQL clusters
(walsender and walreceiver included). The servers' CPU with no load, sampled just before each
run, is taken off (what other people's tests cost the shared servers meanwhile, and the
cluster's idle chatter), so CPU per payment is the marginal cost of a payment. The load
clients and the SMTP sink are not counted. It ends with one table of both stacks side by side
with ratios, and the sizing arithmetic of docs/high-availability.md ("What copies cost")
from the figures it measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import asyncpg

from bench import ingest, leader, workers
from bench.backing import own_vhost
from bench.copies_table import IngestRun, WorkersRun, sizing, table
from bench.observe import Servers
from bench.processes import migrate
from tests import cluster as ha
from tests import faults
from tests.private_servers import _epmd_names

PREFIX = "copies"
SINGLE_DATABASE = "payhooks_bench_copies"
SINGLE_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
SINGLE_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


# --- the two stacks ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stack:
    name: str
    amqp_url: str  # what the services are given: one URL, or the cluster's list
    database_url: str
    servers: Servers
    nodes: dict[str, str] = field(default_factory=dict)  # group -> AMQP URL of that node
    cluster: ha.Cluster | None = None


def _clusters() -> dict[str, tuple[int, Path]]:
    """pg_lsclusters: cluster name -> (port, data directory)."""
    out = faults.run_tool("pg_lsclusters", "--no-header", timeout_s=30).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return {row[1]: (int(row[2]), Path(row[5])) for row in rows if len(row) >= 6}


def _postmaster(data: Path) -> int:
    return int((data / "postmaster.pid").read_text().split()[0])


def _default_beam() -> int:
    """The machine's broker's beam.smp, as the node itself tells (rabbitmqctl's own
    beam.smp and other people's private nodes are beam.smp processes too)."""
    out = faults.run_tool("rabbitmqctl", "-q", "eval", "os:getpid().", timeout_s=60).stdout
    pid = int(out.strip().strip('"'))
    if Path(f"/proc/{pid}/comm").read_text().strip() != "beam.smp":
        raise RuntimeError(f"rabbitmqctl's node runs as pid {pid}, not a beam.smp")
    return pid


def single_stack(amqp_url: str) -> Stack:
    _, data = _clusters()["main"]
    roots = {_default_beam(): "rabbitmq/node1", _postmaster(data): "postgres/primary"}
    database_url = f"postgresql://postgres@127.0.0.1:5432/{SINGLE_DATABASE}"
    return Stack("single", amqp_url, database_url, Servers(roots), {"rabbitmq/node1": amqp_url})


def cluster_stack(made: ha.Cluster) -> Stack:
    roots: dict[int, str] = {}
    nodes: dict[str, str] = {}
    for i, node in enumerate(made.rabbit.nodes, 1):
        pid = faults.rabbitmq_pid(node)
        if pid is None:
            raise RuntimeError(f"{node.name} has no beam.smp")
        roots[pid] = f"rabbitmq/node{i}"
        nodes[f"rabbitmq/node{i}"] = node.url
    found = _clusters()
    for role, member in zip(("primary", "standby"), made.postgres.members, strict=True):
        roots[_postmaster(found[member.name][1])] = f"postgres/{role}"
    return Stack(
        "cluster",
        made.rabbit.amqp_url,
        made.postgres.database_url(),
        Servers(roots),
        nodes,
        made,
    )


async def _drop_single_database() -> None:
    conn = await asyncpg.connect(SINGLE_ADMIN_URL, timeout=10)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {SINGLE_DATABASE} WITH (FORCE)")
    finally:
        await conn.close()


@contextlib.contextmanager
def stacks(keep_going: Callable[[], None]) -> Iterator[tuple[Stack, Stack]]:
    """Both stacks; the cluster and the single stack's database and vhost removed after."""
    started = time.monotonic()
    try:
        with ha.running(PREFIX) as made, own_vhost(SINGLE_AMQP_URL) as vhost_url:
            print(f"cluster up in {time.monotonic() - started:.0f} s", flush=True)
            for name, (state, sync) in ha.replication(made.postgres.first).items():
                print(f"  replication {made.postgres.first.name} -> {name}: {state} {sync}")
            keep_going()
            single, clustered = single_stack(vhost_url), cluster_stack(made)
            migrate(single.database_url)
            migrate(clustered.database_url)
            yield single, clustered
    finally:
        with contextlib.suppress(Exception):
            asyncio.run(_drop_single_database())
        print(f"\nremoved: cluster, {SINGLE_DATABASE}, the vhost; {leftovers()}", flush=True)


def leftovers() -> str:
    """What a run may leave and must not: a node, a cluster or the directory of `copies`."""
    left = [n for n in _epmd_names() if n.startswith(PREFIX)]
    left += [name for name in _clusters() if name.startswith(PREFIX)]
    if ha.base_for(PREFIX).exists():
        left.append(str(ha.base_for(PREFIX)))
    beams = subprocess.run(["pgrep", "-c", "beam.smp"], capture_output=True, text=True).stdout
    state = "nothing of the run left" if not left else f"LEFT BEHIND: {left}"
    return f"{state} (PostgreSQL clusters: {sorted(_clusters())}, beam.smp: {beams.strip()})"


# --- the runs ----------------------------------------------------------------------------------


def _us_per_payment(result: workers.Result) -> dict[str, float]:
    us: dict[str, float] = {}
    for group, pct in result.cpu_pct.items():
        if group.startswith(("rabbitmq", "postgres")):
            pct = max(0.0, pct - result.idle_pct.get(group, 0.0))
        us[group] = pct * 10_000 * result.window_s / result.n
    return us


def run_workers(stack: Stack, args: argparse.Namespace, replicas: int, rate: float) -> WorkersRun:
    n = args.paced_n if rate else args.n
    what = f"at {rate:,.0f}/s" if rate else "open-ended"
    print(f"\n== workers, {stack.name}, {replicas} copy(ies) of each, {n:,} payments {what}")
    wargs = workers.parse_args(
        [
            *("--n", str(n), "--warmup", str(args.warmup), "--replicas", str(replicas)),
            *("--rate", str(rate), "--quiet-wait", "2", "--other-wait", "0"),
            *("--idle-seconds", "3", "--database-url", stack.database_url),
            *("--amqp-url", stack.amqp_url, "--no-ceiling", "--log-dir", args.log_dir),
        ]
    )
    wargs.servers, wargs.ceilings = stack.servers, []
    result = workers.run(wargs)
    ok = workers.report(result, wargs)
    answers = result.summary
    return WorkersRun(
        per_s=workers.fully_processed_per_s(result),
        us=_us_per_payment(result),
        p99_ms=_p99(workers.end_to_end_ms(result)),
        ingest_p99_ms=answers.p99_ms,
        ok=ok,
        servers_idle_pct=sum(result.idle_pct.get(g, 0.0) for g in ("rabbitmq", "postgres")),
        others_pct=_others_pct(result.cpu_pct),
    )


def _others_pct(pct: dict[str, float]) -> float:
    """Other processes' share (and the kernel's, and processes gone by the end): the machine's
    busy time less every group of ours, as bench.workers' report counts it."""
    ours = ("ingest", "orders", "bonuses", "email", "postgres", "rabbitmq", "sink", "clients")
    return pct.get("all", 0.0) - sum(pct.get(g, 0.0) for g in (*ours, "driver"))


def _p99(values: list[float]) -> float:
    return values[min(len(values) - 1, int(0.99 * len(values)))] if values else math.nan


def run_ingest(stack: Stack, args: argparse.Namespace) -> IngestRun:
    print(f"\n== ingest (batched), {stack.name}, {args.ingest_n:,} requests")
    iargs = ingest.parse_args(
        [
            *("--n", str(args.ingest_n), "--quiet-wait", "2", "--settle-seconds", "15"),
            *("--database-url", stack.database_url, "--amqp-url", stack.amqp_url),
        ]
    )
    iargs.servers = stack.servers
    result = ingest.run_owned("batched", iargs)
    ingest.print_table([result])
    s = result.summary
    us = {g: pct * 10_000 / s.requests_per_s for g, pct in result.cpu_pct.items()}
    return IngestRun(s.accepted_per_s, s.p99_ms, us, result.correct)


def run_leader(stack: Stack, args: argparse.Namespace) -> tuple[leader.Measured, str]:
    queue = "copies.leader"
    leader.declare(stack.amqp_url, queue)
    group = "rabbitmq/node1"
    if stack.cluster is not None:
        node = ha.leader_of(stack.cluster.rabbit, queue)
        group = f"rabbitmq/node{stack.cluster.rabbit.nodes.index(node) + 1}"
        row = next(r for r in ha.queues(stack.cluster.rabbit) if r.get("name") == queue)
        print(f"  {queue}: {row.get('type')}, members online {len(row.get('online') or [])}")
    print(
        f"\n== one quorum queue, {stack.name}: {args.publishers} publishers and 2 consumers"
        f" on the leader's node ({group}), {args.leader_seconds:.0f} s",
        flush=True,
    )
    measured = leader.measure(
        stack.nodes[group], queue, args.leader_seconds, args.publishers, stack.servers
    )
    print(
        f"  {measured.per_s:,.0f} messages/s through the queue"
        f" (published {measured.published:,}, consumed {measured.consumed:,});"
        + "".join(
            f" {g} {measured.us_per_message(g):.0f}"
            for g in sorted(measured.cpu_pct)
            if g.startswith("rabbitmq/")
        )
        + " us/message",
        flush=True,
    )
    return measured, group


# --- command line ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.copies", description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=4000, help="payments per open-ended workers run")
    p.add_argument("--paced-n", type=int, default=3000, help="payments per paced workers run")
    p.add_argument("--warmup", type=int, default=300, help="warm-up payments per workers run")
    p.add_argument("--ingest-n", type=int, default=10_000, help="requests of the ingest run")
    p.add_argument("--leader-seconds", type=float, default=8.0, help="one quorum queue's run")
    p.add_argument("--publishers", type=int, default=3, help="publisher processes on it")
    p.add_argument(
        "--log-dir", default="/tmp/payhooks-bench-copies", help="the services' log files"
    )
    args = p.parse_args(argv)
    if min(args.n, args.paced_n, args.ingest_n, args.publishers) < 1 or args.warmup < 0:
        p.error("need positive counts")
    return args


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # through every finally: the cluster is removed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()

    def elapsed() -> None:
        print(f"  [{time.monotonic() - started:.0f} s]", flush=True)

    runs: dict[tuple[str, int, bool], WorkersRun] = {}
    ingests: dict[str, IngestRun] = {}
    leaders: dict[str, tuple[leader.Measured, str]] = {}
    rate = 0.0
    with stacks(elapsed) as (single, clustered):
        pair = (single, clustered)
        for replicas in (1, 2):  # interleaved: the machine's speed drifts within minutes
            for stack in pair:
                runs[stack.name, replicas, False] = run_workers(stack, args, replicas, 0.0)
                elapsed()
        rate = 0.5 * min(r.per_s for r in runs.values())
        for replicas in (1, 2):
            for stack in pair:
                runs[stack.name, replicas, True] = run_workers(stack, args, replicas, rate)
                elapsed()
        for stack in pair:
            ingests[stack.name] = run_ingest(stack, args)
            elapsed()
        for stack in pair:
            leaders[stack.name] = run_leader(stack, args)
            elapsed()
    print()
    print("\n".join(table(runs, ingests, leaders, rate)))
    print()
    print("\n".join(sizing(runs, leaders)))
    ok = all(r.ok for r in runs.values()) and all(r.ok for r in ingests.values())
    print(
        f"\nall checks {'passed' if ok else 'DID NOT pass'};"
        f" {time.monotonic() - started:.0f} s in all ({os.cpu_count()} cores)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
