"""Real faults of a PRIVATE RabbitMQ node or PostgreSQL cluster, for `make chaos`.

Every function takes the node or cluster it acts on and refuses the machine's own (the
default `rabbit@localhost` on 5672, the `main` cluster on 5432): those are shared by everything
on this machine and no test stops, kills or restarts them. tests/private_servers.py makes the
private ones. RabbitMQ is stopped and started with `rabbitmqctl -n NODE stop_app` / `start_app`
(the node keeps running, the AMQP listener and every connection go away), or its Erlang VM
killed with SIGKILL and the node started again; PostgreSQL is restarted, stopped or started with
`pg_ctlcluster VERSION NAME`. Each waits until the change can be seen on the server's port.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SHARED_NODE = "rabbit@localhost"
SHARED_AMQP_PORT = 5672
SHARED_CLUSTER = "main"
SHARED_POSTGRES_PORT = 5432
_HOST = "127.0.0.1"


class FaultUnavailableError(Exception):
    """This machine can't inject the fault (no rabbitmqctl, no pg_ctlcluster, ...)."""


class SharedServerError(ValueError):
    """A fault was asked of the machine's shared broker or database: never."""


@dataclass(frozen=True, slots=True)
class RabbitNode:
    """A private RabbitMQ node: its name, ports and the directory holding all its files."""

    name: str  # e.g. chaos_1234@localhost
    amqp_port: int
    dist_port: int
    base: Path

    def __post_init__(self) -> None:
        if self.name == SHARED_NODE or self.amqp_port == SHARED_AMQP_PORT:
            raise SharedServerError(f"{self.name}:{self.amqp_port} is the machine's own broker")

    @property
    def address(self) -> tuple[str, int]:
        return (_HOST, self.amqp_port)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{_HOST}:{self.amqp_port}/"

    @property
    def pid_file(self) -> Path:
        return self.base / "node.pid"

    def environment(self) -> dict[str, str]:
        """What `rabbitmq-server` needs to start this node and no other (ha-one-box.md)."""
        return {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.base / "log"),
            "RABBITMQ_PID_FILE": str(self.pid_file),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.base / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.base / "rabbitmq.conf"),
            # Not the machine's rabbitmq-env.conf: it names the default node.
            "RABBITMQ_CONF_ENV_FILE": str(self.base / "rabbitmq-env.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.base / "advanced.config"),
        }


@dataclass(frozen=True, slots=True)
class PgCluster:
    """A private PostgreSQL cluster (`pg_lsclusters` lists it as VERSION NAME)."""

    version: str
    name: str  # e.g. chaos_1234
    port: int

    def __post_init__(self) -> None:
        if self.name == SHARED_CLUSTER or self.port == SHARED_POSTGRES_PORT:
            raise SharedServerError(f"{self.version}/{self.name} is the machine's own database")

    @property
    def address(self) -> tuple[str, int]:
        return (_HOST, self.port)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@{_HOST}:{self.port}/{database}"


def run_tool(*command: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command,
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,  # a prompt fails instead of hanging
        )
    except subprocess.CalledProcessError as e:
        detail = (e.stderr or e.stdout or "").strip()[-500:]
        raise RuntimeError(f"{' '.join(command)}: exit {e.returncode}: {detail}") from e


def require(tool: str) -> None:
    if shutil.which(tool) is None:
        raise FaultUnavailableError(f"{tool} is not installed here")


def port_open(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=1):
            return True
    except OSError:
        return False


def wait_port(address: tuple[str, int], *, open_: bool = True, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while port_open(address) != open_:
        if time.monotonic() > deadline:
            state = "open" if open_ else "closed"
            raise TimeoutError(f"{address[0]}:{address[1]} not {state} after {timeout_s:g} s")
        time.sleep(0.2)


# --- RabbitMQ ----------------------------------------------------------------------------------


def _ctl(node: RabbitNode, *args: str, timeout_s: float = 60.0) -> str:
    require("rabbitmqctl")
    return run_tool("rabbitmqctl", "-q", "-n", node.name, *args, timeout_s=timeout_s).stdout


def rabbitmq_start(node: RabbitNode) -> None:
    """Start the node's Erlang VM (in a session of its own, so a Ctrl-C of the harness does not
    reach it; the harness stops it) and wait until its AMQP listener accepts connections."""
    require("rabbitmq-server")
    with (node.base / "log" / "server.out").open("ab") as out:
        subprocess.Popen(
            ["rabbitmq-server"],
            env=node.environment(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_rabbitmq(node)


def wait_rabbitmq(node: RabbitNode, timeout_s: float = 120.0) -> None:
    """Until the node's AMQP listener accepts connections (`await_startup` fails at once while
    the node has not registered with epmd yet: retried while its VM runs)."""
    require("rabbitmqctl")
    deadline = time.monotonic() + timeout_s
    while True:
        left = max(1.0, deadline - time.monotonic())
        command = ["rabbitmqctl", "-q", "-n", node.name, "await_startup", "--timeout", "60"]
        done = subprocess.run(
            command, capture_output=True, timeout=left + 60, stdin=subprocess.DEVNULL
        )
        if done.returncode == 0:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"RabbitMQ node {node.name} not started after {timeout_s:g} s")
        time.sleep(1)
    wait_port(node.address, timeout_s=max(1.0, deadline - time.monotonic()))


def rabbitmq_stop_app(node: RabbitNode) -> None:
    """Stop the node's RabbitMQ application (connections closed, port closed); the VM stays."""
    _ctl(node, "stop_app")
    wait_port(node.address, open_=False)


def rabbitmq_start_app(node: RabbitNode) -> None:
    _ctl(node, "start_app", timeout_s=120)
    wait_rabbitmq(node)


def rabbitmq_pid(node: RabbitNode) -> int | None:
    """The node's beam.smp, by its pid file (written at boot), else by its environment."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(node.pid_file.read_text().strip())
        if _is_node_vm(pid, node):
            return pid
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _is_node_vm(int(entry.name), node):
            return int(entry.name)
    return None


def _is_node_vm(pid: int, node: RabbitNode) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"beam.smp" in cmdline and f"RABBITMQ_NODENAME={node.name}".encode() in environ


def rabbitmq_kill(node: RabbitNode) -> None:
    """Kill the node the hard way (SIGKILL of its Erlang VM); ensure_rabbitmq starts it."""
    pid = rabbitmq_pid(node)
    if pid is None:
        raise RuntimeError(f"RabbitMQ node {node.name} is not running")
    os.kill(pid, signal.SIGKILL)
    wait_port(node.address, open_=False)


def rabbitmq_stop(node: RabbitNode, timeout_s: float = 60.0) -> None:
    """Stop the node for good (`rabbitmqctl -n NODE stop`), killing its VM if it won't go."""
    with contextlib.suppress(Exception):
        _ctl(node, "stop", timeout_s=timeout_s)
    deadline = time.monotonic() + 15
    while (pid := rabbitmq_pid(node)) is not None:
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def ensure_rabbitmq(node: RabbitNode) -> None:
    """Whatever happened, leave the node running (its application and its VM)."""
    if port_open(node.address):
        return
    if rabbitmq_pid(node) is not None:
        try:
            rabbitmq_start_app(node)
            return
        except (RuntimeError, TimeoutError, subprocess.TimeoutExpired):
            rabbitmq_stop(node)  # a VM that won't start its application: start afresh
    rabbitmq_start(node)


# --- PostgreSQL --------------------------------------------------------------------------------


def _pg_ctl(cluster: PgCluster, *action: str) -> None:
    require("pg_ctlcluster")
    run_tool(
        "pg_ctlcluster",
        "--skip-systemctl-redirect",
        cluster.version,
        cluster.name,
        *action,
        timeout_s=120,
    )


def postgres_restart(cluster: PgCluster) -> None:
    """A fast restart: sessions terminated, the server stopped and started again."""
    _pg_ctl(cluster, "restart", "-m", "fast")
    wait_port(cluster.address)


def postgres_stop(cluster: PgCluster) -> None:
    _pg_ctl(cluster, "stop", "-m", "fast")
    wait_port(cluster.address, open_=False)


def postgres_start(cluster: PgCluster) -> None:
    _pg_ctl(cluster, "start")
    wait_port(cluster.address)


def ensure_postgres(cluster: PgCluster) -> None:
    if not port_open(cluster.address):
        postgres_start(cluster)
