"""A highly available stack on one box, beside the machine's shared servers: three RabbitMQ
nodes joined into one cluster and a PostgreSQL primary with a synchronous streaming hot
standby, each on ports, names and files of its own (docs/high-availability.md).

`python -m tests.cluster up` (`make cluster-up`) makes it and prints what to export;
`python -m tests.cluster down` (`make cluster-down`) removes every node, cluster and file. The
functions below are what a harness does to it: kill or stop and start a node, find the node that
leads a quorum queue, kill the primary and promote the standby, as an operator (or a Kubernetes
operator such as CloudNativePG) would; payhooks itself ships no failover manager.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.processes import free_ports
from tests import faults
from tests.private_servers import _chown, _clusters, _epmd_names, _postgres_version, drop_postgres
from tests.run_vhost import alive

DATABASE = "payhooks"
NODES = 3
# What the primary waits for before a commit returns (docs/high-availability.md): `on` with
# a synchronous standby is "flushed to disk on both servers", so a webhook answered 200 is on
# the standby too when the primary dies. remote_apply would also wait for the standby to
# replay it, which payhooks does not need (it never reads from the standby).
SYNCHRONOUS_COMMIT = "on"


@dataclass(frozen=True, slots=True)
class RabbitCluster:
    nodes: tuple[faults.RabbitNode, ...]

    @property
    def amqp_url(self) -> str:
        """AMQP_URL for payhooks: every node, comma-separated (tried in turn)."""
        return ",".join(node.url for node in self.nodes)

    def node(self, name: str) -> faults.RabbitNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class PgPair:
    """Two clusters streaming one into the other; which is primary changes on promotion."""

    first: faults.PgCluster
    second: faults.PgCluster

    @property
    def members(self) -> tuple[faults.PgCluster, faults.PgCluster]:
        return (self.first, self.second)

    def database_url(self, database: str = DATABASE) -> str:
        """DATABASE_URL for payhooks: both hosts, only the read-write one used."""
        hosts = ",".join(f"127.0.0.1:{c.port}" for c in self.members)
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"


@dataclass(frozen=True, slots=True)
class Cluster:
    rabbit: RabbitCluster
    postgres: PgPair
    base: Path

    def environment(self) -> dict[str, str]:
        return {"AMQP_URL": self.rabbit.amqp_url, "DATABASE_URL": self.postgres.database_url()}

    def to_json(self) -> str:
        return json.dumps(
            {
                "base": str(self.base),
                "rabbit": [
                    [n.name, n.amqp_port, n.dist_port, str(n.base)] for n in self.rabbit.nodes
                ],
                "postgres": [[c.version, c.name, c.port] for c in self.postgres.members],
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> Cluster:
        data = json.loads(text)
        nodes = tuple(
            faults.RabbitNode(name, amqp, dist, Path(base))
            for name, amqp, dist, base in data["rabbit"]
        )
        first, second = (faults.PgCluster(v, n, p) for v, n, p in data["postgres"])
        return cls(RabbitCluster(nodes), PgPair(first, second), Path(data["base"]))


# --- RabbitMQ ----------------------------------------------------------------------------------


def _prepare_node(name: str, base: Path, amqp_port: int, dist_port: int) -> faults.RabbitNode:
    node = faults.RabbitNode(f"{name}@localhost", amqp_port, dist_port, base)
    for folder in ("mnesia", "log"):
        (base / folder).mkdir(parents=True)
    # Its own listener (the machine's rabbitmq.conf pins 5672); quorum queue leaders spread
    # over the nodes instead of all on the node the declaring client happened to reach.
    (base / "rabbitmq.conf").write_text(
        f"listeners.tcp.local = 127.0.0.1:{amqp_port}\n"
        "loopback_users.guest = true\n"
        "queue_leader_locator = balanced\n"
    )
    (base / "advanced.config").write_text("[].\n")
    (base / "enabled_plugins").write_text("[].\n")  # no management or prometheus listener
    (base / "rabbitmq-env.conf").write_text(
        'ERL_EPMD_ADDRESS=127.0.0.1\nexport ERL_FLAGS="-kernel inet_dist_use_interface'
        ' {127,0,0,1}"\n'
    )
    _chown(base, "rabbitmq")
    return node


def start_rabbit_cluster(prefix: str, base: Path) -> RabbitCluster:
    """Three fresh nodes `<prefix>1..3@localhost`, the second and third joined to the first."""
    ports = free_ports(2 * NODES)
    nodes = tuple(
        _prepare_node(f"{prefix}{i + 1}", base / f"rabbit{i + 1}", ports[2 * i], ports[2 * i + 1])
        for i in range(NODES)
    )
    cluster = RabbitCluster(nodes)
    try:
        for node in nodes:  # all three boot at once: ~30 s on 2 cores instead of ~60
            _spawn(node)
        for node in nodes:
            faults.wait_rabbitmq(node, timeout_s=180)
        for node in nodes[1:]:
            ctl(node, "stop_app")
            ctl(node, "join_cluster", nodes[0].name)
            ctl(node, "start_app", timeout_s=120)
            faults.wait_rabbitmq(node)
    except BaseException:
        stop_rabbit_cluster(cluster)
        raise
    return cluster


def _spawn(node: faults.RabbitNode) -> None:
    with (node.base / "log" / "server.out").open("ab") as out:
        subprocess.Popen(
            ["rabbitmq-server"],
            env=node.environment(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_rabbit_cluster(cluster: RabbitCluster) -> None:
    for node in reversed(cluster.nodes):
        faults.rabbitmq_stop(node)


def ctl(node: faults.RabbitNode, *args: str, timeout_s: float = 60.0) -> str:
    return faults.run_tool("rabbitmqctl", "-q", "-n", node.name, *args, timeout_s=timeout_s).stdout


def running_nodes(cluster: RabbitCluster) -> list[faults.RabbitNode]:
    return [node for node in cluster.nodes if faults.port_open(node.address)]


def kill_node(node: faults.RabbitNode) -> None:
    """kill -9 of the node's Erlang VM (a machine lost); start_node brings it back."""
    faults.rabbitmq_kill(node)


def stop_node(node: faults.RabbitNode) -> None:
    """A clean stop of the whole node (`rabbitmqctl stop`): its VM exits."""
    faults.rabbitmq_stop(node)


def start_node(node: faults.RabbitNode) -> None:
    """Start a stopped or killed node again; it rejoins its cluster by itself."""
    faults.rabbitmq_start(node)


def queues(cluster: RabbitCluster) -> list[dict[str, Any]]:
    """Every queue with its type, leader, members and members online, asked of a running
    node."""
    for node in running_nodes(cluster):
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            out = ctl(
                node,
                "list_queues",
                "name",
                "type",
                "leader",
                "members",
                "online",
                "--formatter",
                "json",
            )
            found: list[dict[str, Any]] = json.loads(out or "[]")
            return found
    raise RuntimeError("no RabbitMQ node of the cluster answers")


def leader_of(cluster: RabbitCluster, queue: str) -> faults.RabbitNode:
    """The node that leads quorum queue `queue` now."""
    for row in queues(cluster):
        if row.get("name") == queue:
            return cluster.node(str(row["leader"]))
    raise KeyError(f"no queue {queue}")


# --- PostgreSQL --------------------------------------------------------------------------------

_HBA = """\
# A private pair for tests on loopback: trust, replication included.
local all all trust
host all all 127.0.0.1/32 trust
local replication all trust
host replication all 127.0.0.1/32 trust
"""


def _create(name: str, port: int, data: Path, log: Path) -> faults.PgCluster:
    cluster = faults.PgCluster(_postgres_version(), name, port)
    faults.run_tool(
        "pg_createcluster",
        cluster.version,
        name,
        "-p",
        str(port),
        "-d",
        str(data),
        "-l",
        str(log),
        "--",
        "--auth=trust",
        timeout_s=120,
    )
    config = Path("/etc/postgresql") / cluster.version / name
    # Quoted by hand (pg_conftool writes addresses unquoted: a syntax error). wal_level and
    # max_wal_senders are PostgreSQL 15's defaults (replica, 10), named for the reader.
    with (config / "postgresql.conf").open("a") as conf:
        conf.write(
            "listen_addresses = '127.0.0.1'\n"
            "wal_level = replica\n"
            "max_wal_senders = 10\n"
            "hot_standby = on\n"
            f"synchronous_commit = {SYNCHRONOUS_COMMIT}\n"
            "wal_log_hints = on\n"
        )
    (config / "pg_hba.conf").write_text(_HBA)
    return cluster


def _as_postgres(*command: str, timeout_s: float = 120.0) -> None:
    faults.run_tool("runuser", "-u", "postgres", "--", *command, timeout_s=timeout_s)


def data_directory(cluster: faults.PgCluster) -> Path:
    conf = Path("/etc/postgresql") / cluster.version / cluster.name / "postgresql.conf"
    for line in conf.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "data_directory":
            return Path(value.split("#")[0].strip().strip("'"))
    raise RuntimeError(f"no data_directory in {conf}")


def create_pg_pair(prefix: str, base: Path) -> PgPair:
    """`<prefix>_a` primary and `<prefix>_b` its hot standby, streaming synchronously."""
    faults.require("pg_createcluster")
    faults.require("pg_basebackup")
    (base / "a").mkdir(parents=True)
    (base / "b").mkdir(parents=True)
    _chown(base, "postgres")
    first_port, second_port = free_ports(2)
    made: list[faults.PgCluster] = []
    try:
        primary = _create(f"{prefix}_a", first_port, base / "a" / "data", base / "a" / "log")
        made.append(primary)
        faults.postgres_start(primary)
        standby = _create(f"{prefix}_b", second_port, base / "b" / "data", base / "b" / "log")
        made.append(standby)
        make_standby(standby, primary)
        pair = PgPair(primary, standby)
        wait_streaming(primary, standby.name)
        set_synchronous(primary, standby.name)
    except BaseException:
        for cluster in made:
            with contextlib.suppress(Exception):
                drop_postgres(cluster)
        raise
    return pair


def make_standby(standby: faults.PgCluster, primary: faults.PgCluster) -> None:
    """Make `standby` a fresh copy of `primary` streaming from it (stopped first, its data
    replaced by a base backup), and start it."""
    with contextlib.suppress(RuntimeError):
        faults.postgres_stop(standby)
    data = data_directory(standby)
    shutil.rmtree(data)
    _as_postgres(
        "pg_basebackup",
        "-h",
        "127.0.0.1",
        "-p",
        str(primary.port),
        "-U",
        "postgres",
        "-D",
        str(data),
        "-X",
        "stream",
        "-c",
        "fast",
    )
    # application_name: the name synchronous_standby_names and pg_stat_replication know it by.
    conninfo = f"host=127.0.0.1 port={primary.port} user=postgres application_name={standby.name}"
    with (data / "postgresql.auto.conf").open("a") as auto:
        auto.write(f"primary_conninfo = '{conninfo}'\nsynchronous_standby_names = ''\n")
    (data / "standby.signal").touch()
    _chown(data, "postgres")
    faults.postgres_start(standby)


def psql(cluster: faults.PgCluster, sql: str, *, database: str = "postgres") -> str:
    return faults.run_tool(
        "psql",
        "-X",
        "-A",
        "-t",
        "-h",
        "127.0.0.1",
        "-p",
        str(cluster.port),
        "-U",
        "postgres",
        "-d",
        database,
        "-c",
        sql,
        timeout_s=30,
    ).stdout.strip()


def replication(primary: faults.PgCluster) -> dict[str, tuple[str, str]]:
    """pg_stat_replication on `primary`: application_name -> (state, sync_state)."""
    out = psql(primary, "SELECT application_name, state, sync_state FROM pg_stat_replication")
    rows = [line.split("|") for line in out.splitlines() if line]
    return {row[0]: (row[1], row[2]) for row in rows}


def wait_streaming(primary: faults.PgCluster, standby: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while replication(primary).get(standby, ("", ""))[0] != "streaming":
        if time.monotonic() > deadline:
            raise TimeoutError(f"{standby} not streaming from {primary.name} after {timeout_s} s")
        time.sleep(0.3)


def set_synchronous(primary: faults.PgCluster, standby: str) -> None:
    """Commits on `primary` wait for `standby` from now on: set only once it streams, since
    with it set and no standby every commit waits (CREATE DATABASE included)."""
    psql(primary, f"ALTER SYSTEM SET synchronous_standby_names = '{standby}'")
    psql(primary, "SELECT pg_reload_conf()")
    deadline = time.monotonic() + 30
    while replication(primary).get(standby, ("", ""))[1] != "sync":
        if time.monotonic() > deadline:
            raise TimeoutError(f"{standby} not synchronous after 30 s")
        time.sleep(0.2)


def is_primary(cluster: faults.PgCluster) -> bool:
    try:
        return psql(cluster, "SELECT pg_is_in_recovery()") == "f"
    except (RuntimeError, subprocess.TimeoutExpired):
        return False


def primary_of(pair: PgPair) -> faults.PgCluster:
    for cluster in pair.members:
        if is_primary(cluster):
            return cluster
    raise RuntimeError("no primary answers")


def standby_of(pair: PgPair) -> faults.PgCluster:
    primary = primary_of(pair)
    return pair.second if primary == pair.first else pair.first


def _postmaster(cluster: faults.PgCluster) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((data_directory(cluster) / "postmaster.pid").read_text().split()[0])
    return None


def kill_postgres(cluster: faults.PgCluster) -> None:
    """kill -9 of the server and every backend of it (a machine lost, not a shutdown)."""
    pid = _postmaster(cluster)
    if pid is None:
        raise RuntimeError(f"{cluster.name} is not running")
    victims = [pid, *_children(pid)]
    for victim in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    faults.wait_port(cluster.address, open_=False)
    # Gone for good before anything starts on its port again: a postmaster not yet reaped
    # holds its socket's lock file, and a start there fails ("lock file already exists").
    deadline = time.monotonic() + 30
    while any(alive(victim) for victim in victims) and time.monotonic() < deadline:
        time.sleep(0.1)


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            # Field 4 of stat is the parent pid; the name (field 2) may hold spaces.
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
    return found


def promote(cluster: faults.PgCluster, timeout_s: float = 30.0) -> float:
    """Promote the standby; the seconds until it takes writes."""
    started = time.monotonic()
    faults.run_tool(
        "pg_ctlcluster",
        "--skip-systemctl-redirect",
        cluster.version,
        cluster.name,
        "promote",
        timeout_s=60,
    )
    while not is_primary(cluster):
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{cluster.name} not promoted after {timeout_s} s")
        time.sleep(0.1)
    return time.monotonic() - started


def fail_over(pair: PgPair) -> tuple[faults.PgCluster, float]:
    """kill -9 of the primary, then promotion of the standby: the new primary and the
    seconds from the kill until it takes writes."""
    old = primary_of(pair)
    new = pair.second if old == pair.first else pair.first
    started = time.monotonic()
    kill_postgres(old)
    promote(new)
    return new, time.monotonic() - started


def rebuild_standby(pair: PgPair) -> faults.PgCluster:
    """Make the member that is not primary a fresh synchronous standby of the one that is
    (the old primary after a failover: a base backup, as pg_rewind's simpler cousin)."""
    primary = primary_of(pair)
    standby = pair.second if primary == pair.first else pair.first
    # The old primary's synchronous_standby_names came over in the base backup: cleared by
    # make_standby, set again on the new primary once the standby streams.
    make_standby(standby, primary)
    wait_streaming(primary, standby.name)
    set_synchronous(primary, standby.name)
    return standby


def drop_pg_pair(pair: PgPair) -> None:
    for cluster in pair.members:
        with contextlib.suppress(Exception):
            drop_postgres(cluster)


# --- the whole -----------------------------------------------------------------------------


def base_for(prefix: str) -> Path:
    return Path(tempfile.gettempdir()) / f"payhooks-cluster-{prefix}"


def up(prefix: str = "ha") -> Cluster:
    """Make the stack (removing a previous one of the same prefix first)."""
    down(prefix)
    base = base_for(prefix)
    base.mkdir(mode=0o755)
    base.chmod(0o755)  # the servers' users reach their folders below it
    rabbit: RabbitCluster | None = None
    try:
        postgres = create_pg_pair(prefix, base / "postgres")
        psql(postgres.first, f"CREATE DATABASE {DATABASE}")
        rabbit = start_rabbit_cluster(prefix, base / "rabbitmq")
        cluster = Cluster(rabbit, postgres, base)
        (base / "cluster.json").write_text(cluster.to_json())
        return cluster
    except BaseException:
        down(prefix)
        raise


def load(prefix: str = "ha") -> Cluster:
    return Cluster.from_json((base_for(prefix) / "cluster.json").read_text())


def down(prefix: str = "ha") -> list[str]:
    """Remove every node, cluster and file of the stack `prefix`, also one half made."""
    removed = []
    names = {f"{prefix}{i + 1}" for i in range(NODES)}
    for short in _epmd_names():
        if short in names:
            faults.rabbitmq_stop(faults.RabbitNode(f"{short}@localhost", 0, 0, Path("/")))
            removed.append(f"{short}@localhost")
    # A node that never registered with epmd: by its pid file's environment.
    for short in sorted(names):
        node = faults.RabbitNode(f"{short}@localhost", 0, 0, base_for(prefix) / "rabbitmq" / "x")
        if (pid := faults.rabbitmq_pid(node)) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            removed.append(f"{short}@localhost (killed)")
    for version, name, port in _clusters():
        if name in (f"{prefix}_a", f"{prefix}_b"):
            drop_postgres(faults.PgCluster(version, name, port))
            removed.append(f"{version}/{name}")
    if base_for(prefix).exists():
        shutil.rmtree(base_for(prefix), ignore_errors=True)
        removed.append(str(base_for(prefix)))
    return removed


@contextlib.contextmanager
def pg_pair_for_run(purpose: str) -> Iterator[PgPair]:
    """A primary and its synchronous standby named `<purpose><pid>_a/_b` for one process (a
    test run), removed on the way out; pairs of runs that died are removed first."""
    for version, name, port in _clusters():
        match = re.fullmatch(rf"{purpose}([0-9]+)_[ab]", name)
        if match and not alive(int(match[1])):
            drop_postgres(faults.PgCluster(version, name, port))
            shutil.rmtree(base_for(name[:-2]), ignore_errors=True)
    prefix = f"{purpose}{os.getpid()}"
    base = base_for(prefix)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    try:
        pair = create_pg_pair(prefix, base)
        try:
            yield pair
        finally:
            drop_pg_pair(pair)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def running(prefix: str) -> Iterator[Cluster]:
    """The stack for the length of a block, removed on the way out whatever happens."""
    try:
        yield up(prefix)
    finally:
        down(prefix)


def status(prefix: str = "ha") -> str:
    cluster = load(prefix)
    lines = []
    for node in cluster.rabbit.nodes:
        state = "up" if faults.port_open(node.address) else "down"
        lines.append(f"rabbitmq {node.name} 127.0.0.1:{node.amqp_port} {state}")
    for member in cluster.postgres.members:
        if not faults.port_open(member.address):
            role = "down"
        else:
            role = "primary" if is_primary(member) else "standby"
        lines.append(f"postgresql {member.version}/{member.name} 127.0.0.1:{member.port} {role}")
    with contextlib.suppress(RuntimeError):
        primary = primary_of(cluster.postgres)
        for name, (state, sync) in replication(primary).items():
            lines.append(f"replication {primary.name} -> {name}: {state} {sync}")
    with contextlib.suppress(RuntimeError):
        for row in queues(cluster.rabbit):
            if row.get("type") == "quorum":
                lines.append(
                    f"queue {row['name']} leader {row['leader']} "
                    f"online {len(row.get('online') or [])}/{len(row.get('members') or [])}"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--prefix", default="ha", help="names of nodes and clusters [ha]")
    args = parser.parse_args(argv)
    if args.command == "up":
        started = time.monotonic()
        cluster = up(args.prefix)
        print(f"# up in {time.monotonic() - started:.0f} s; `make cluster-down` removes it")
        for name, value in cluster.environment().items():
            print(f"export {name}='{value}'")
    elif args.command == "down":
        for line in down(args.prefix):
            print(f"removed {line}")
    else:
        print(status(args.prefix))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
