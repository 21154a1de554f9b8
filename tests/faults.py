"""Real faults of the local backing services, for the broker-restart test and `make chaos`.

RabbitMQ is stopped and started with `rabbitmqctl stop_app` / `start_app` (the node keeps
running, the AMQP listener and every connection go away), or killed and started again;
PostgreSQL is restarted with `pg_ctlcluster`. Each waits until the service answers again.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

AMQP_ADDRESS = ("127.0.0.1", 5672)
POSTGRES_ADDRESS = ("127.0.0.1", 5432)


class FaultUnavailableError(Exception):
    """This machine can't inject the fault (no rabbitmqctl, a remote broker, ...)."""


def _run(*command: str, timeout_s: float = 60.0) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=timeout_s)


def require_rabbitmqctl() -> None:
    if shutil.which("rabbitmqctl") is None:
        raise FaultUnavailableError("rabbitmqctl is not installed here (the broker is remote)")


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


def rabbitmq_stop_app() -> None:
    """Stop RabbitMQ's application (connections closed, port closed); the node stays up."""
    require_rabbitmqctl()
    _run("rabbitmqctl", "-q", "stop_app")
    wait_port(AMQP_ADDRESS, open_=False)


def rabbitmq_start_app() -> None:
    require_rabbitmqctl()
    _run("rabbitmqctl", "-q", "start_app", timeout_s=120)
    wait_rabbitmq()


def wait_rabbitmq(timeout_s: float = 120.0) -> None:
    """Until the AMQP listener accepts connections (`ping` answers while it is still booting;
    `await_startup` fails at once while the node itself is not up yet)."""
    require_rabbitmqctl()
    deadline = time.monotonic() + timeout_s
    while (
        subprocess.run(
            ["rabbitmqctl", "-q", "await_startup"], capture_output=True, timeout=timeout_s
        ).returncode
        != 0
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"RabbitMQ not started after {timeout_s:g} s")
        time.sleep(1)
    wait_port(AMQP_ADDRESS, timeout_s=max(1.0, deadline - time.monotonic()))


def rabbitmq_pid() -> int:
    out = subprocess.run(
        ["rabbitmqctl", "-q", "eval", "list_to_integer(os:getpid())."],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return int(out.stdout.strip())


def rabbitmq_kill() -> None:
    """Kill the node the hard way (SIGKILL of the Erlang VM); ensure_rabbitmq starts it."""
    require_rabbitmqctl()
    os.kill(rabbitmq_pid(), 9)
    wait_port(AMQP_ADDRESS, open_=False)


def ensure_rabbitmq() -> None:
    """Whatever happened, leave RabbitMQ running (the application and the node)."""
    if port_open(AMQP_ADDRESS):
        return
    probe = subprocess.run(["rabbitmqctl", "-q", "ping"], capture_output=True, timeout=30)
    if probe.returncode == 0:
        rabbitmq_start_app()
    else:
        subprocess.run(["rabbitmq-server", "-detached"], capture_output=True, timeout=60)
        wait_rabbitmq()


def _pg_cluster() -> str:
    versions = sorted(os.listdir("/etc/postgresql"))
    if not versions or shutil.which("pg_ctlcluster") is None:
        raise FaultUnavailableError("no local PostgreSQL cluster to restart")
    return versions[-1]


def _pg_ctl(action: str) -> None:
    _run("pg_ctlcluster", "--skip-systemctl-redirect", _pg_cluster(), "main", action)


def postgres_restart() -> None:
    _pg_ctl("restart")
    wait_port(POSTGRES_ADDRESS)


def postgres_stop() -> None:
    _pg_ctl("stop")
    wait_port(POSTGRES_ADDRESS, open_=False)


def postgres_start() -> None:
    _pg_ctl("start")
    wait_port(POSTGRES_ADDRESS)


def ensure_postgres() -> None:
    if not port_open(POSTGRES_ADDRESS):
        postgres_start()
