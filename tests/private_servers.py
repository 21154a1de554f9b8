"""A RabbitMQ node and a PostgreSQL cluster of a run's own, for harnesses that stop, kill or
restart servers (`make chaos`): made at the start, removed at the end, whatever happens.

The machine's own broker (rabbit@localhost, 5672) and database (15/main, 5432) are shared by
everything on it and never touched. Each private server has its own name (`chaos_<pid>`), ports
and files under one temporary directory; a run killed before its cleanup leaves servers whose
name carries a dead pid, and the next run removes them first (docs/chaos.md).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.processes import free_ports
from tests import faults
from tests.run_vhost import alive

_TMP_PREFIX = "payhooks-private-"
_NAME = re.compile(r"^(?P<purpose>[a-z]+)_(?P<pid>[0-9]+)$")


@dataclass(frozen=True, slots=True)
class PrivateServers:
    rabbit: faults.RabbitNode
    postgres: faults.PgCluster
    base: Path


def _chown(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, entry.pw_uid, entry.pw_gid)


def _postgres_version() -> str:
    versions = sorted(Path("/usr/lib/postgresql").iterdir(), key=lambda p: int(p.name))
    if not versions:
        raise faults.FaultUnavailableError("no PostgreSQL server installed here")
    return versions[-1].name


# --- RabbitMQ ----------------------------------------------------------------------------------


def start_rabbitmq(name: str, base: Path) -> faults.RabbitNode:
    """A fresh node `name@localhost` with its own listener, config and files under `base`."""
    amqp_port, dist_port = free_ports(2)
    node = faults.RabbitNode(f"{name}@localhost", amqp_port, dist_port, base)
    for folder in ("mnesia", "log"):
        (base / folder).mkdir(parents=True)
    # The machine's rabbitmq.conf pins 127.0.0.1:5672: this node reads its own file instead.
    (base / "rabbitmq.conf").write_text(
        f"listeners.tcp.local = 127.0.0.1:{amqp_port}\nloopback_users.guest = true\n"
    )
    (base / "advanced.config").write_text("[].\n")
    (base / "enabled_plugins").write_text("[].\n")  # no management listener on 15672
    (base / "rabbitmq-env.conf").write_text(
        'ERL_EPMD_ADDRESS=127.0.0.1\nexport ERL_FLAGS="-kernel inet_dist_use_interface'
        ' {127,0,0,1}"\n'
    )
    # rabbitmq-server, started as root, runs as rabbitmq: every file of the node is its.
    _chown(base, "rabbitmq")
    try:
        faults.rabbitmq_start(node)
    except BaseException:
        faults.rabbitmq_stop(node)
        raise
    return node


def _epmd_names() -> list[str]:
    try:
        done = subprocess.run(
            ["epmd", "-names"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return re.findall(r"^name (\S+) at port", done.stdout, re.MULTILINE)


# --- PostgreSQL --------------------------------------------------------------------------------

_HBA = """\
# A private cluster for tests on loopback: trust, like the machine's own test setup.
local all all trust
host all all 127.0.0.1/32 trust
host all all ::1/128 trust
"""


def create_postgres(name: str, base: Path) -> faults.PgCluster:
    """A fresh cluster VERSION/`name` on a port of its own, its data under `base`, started."""
    faults.require("pg_createcluster")
    (port,) = free_ports(1)
    cluster = faults.PgCluster(_postgres_version(), name, port)
    data = base / "data"
    try:
        faults.run_tool(
            "pg_createcluster",
            cluster.version,
            name,
            "-p",
            str(port),
            "-d",
            str(data),
            "-l",
            str(base / "postgresql.log"),
            "--",
            "--auth=trust",
            timeout_s=120,
        )
        config = Path("/etc/postgresql") / cluster.version / name
        # Written by hand and quoted: pg_conftool writes addresses unquoted (a syntax error).
        with (config / "postgresql.conf").open("a") as conf:
            conf.write("listen_addresses = '127.0.0.1'\n")
        (config / "pg_hba.conf").write_text(_HBA)
        faults.postgres_start(cluster)
    except BaseException:
        drop_postgres(cluster)
        raise
    return cluster


def drop_postgres(cluster: faults.PgCluster) -> None:
    """Stop the cluster at once and delete it (data, config, log)."""
    with contextlib.suppress(Exception):
        faults.run_tool(
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            cluster.version,
            cluster.name,
            "stop",
            "-m",
            "immediate",
            timeout_s=60,
        )
    faults.run_tool("pg_dropcluster", "--stop", cluster.version, cluster.name, timeout_s=60)


def _clusters() -> list[tuple[str, str, int]]:
    """(version, name, port) of every cluster `pg_lsclusters` lists."""
    try:
        out = faults.run_tool("pg_lsclusters", "--no-header", timeout_s=30).stdout
    except (RuntimeError, OSError):
        return []
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return [(row[0], row[1], int(row[2])) for row in rows if len(row) >= 3]


# --- the pair ----------------------------------------------------------------------------------


def remove_leftovers(purpose: str) -> list[str]:
    """Remove the servers and directories of runs for `purpose` whose process died."""
    removed = []

    def dead(name: str) -> bool:
        match = _NAME.match(name)
        return bool(match and match["purpose"] == purpose and not alive(int(match["pid"])))

    for version, name, port in _clusters():
        if dead(name):
            drop_postgres(faults.PgCluster(version, name, port))
            removed.append(f"{version}/{name}")
    for short in _epmd_names():
        if dead(short):
            # Stopped by its name, never by process name: the machine's broker is a beam too.
            faults.rabbitmq_stop(faults.RabbitNode(f"{short}@localhost", 0, 0, Path("/")))
            removed.append(f"{short}@localhost")
    for path in Path(tempfile.gettempdir()).glob(f"{_TMP_PREFIX}{purpose}_*"):
        if dead(path.name.removeprefix(_TMP_PREFIX).split("-")[0]):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


@contextlib.contextmanager
def running(purpose: str) -> Iterator[PrivateServers]:
    """A private RabbitMQ node and PostgreSQL cluster named `<purpose>_<pid>`, removed on the
    way out (a failure, Ctrl-C or SIGTERM turned into SystemExit included)."""
    remove_leftovers(purpose)
    name = f"{purpose}_{os.getpid()}"
    base = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{name}-"))
    base.chmod(0o755)  # the servers' users reach their folders below it
    rabbit: faults.RabbitNode | None = None
    postgres: faults.PgCluster | None = None
    try:
        (base / "postgres").mkdir()
        _chown(base / "postgres", "postgres")
        postgres = create_postgres(name, base / "postgres")
        rabbit = start_rabbitmq(name, base / "rabbitmq")
        yield PrivateServers(rabbit, postgres, base)
    finally:
        try:
            if rabbit is not None:
                faults.rabbitmq_stop(rabbit)
            else:  # it may have died half-started: stop it by name all the same
                with contextlib.suppress(Exception):
                    faults.rabbitmq_stop(
                        faults.RabbitNode(f"{name}@localhost", 0, 0, base / "rabbitmq")
                    )
        finally:
            try:
                if postgres is not None:
                    drop_postgres(postgres)
            finally:
                shutil.rmtree(base, ignore_errors=True)
