"""Subprocesses the benchmarks own: free ports, the payhooks console script, the services'
environment, starting with a log file and stopping with SIGTERM."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# Ports for the servers a benchmark or a test starts: below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range, 32768-60999 here), which bind(("", 0)) also draws from, so
# neither another pick nor the outgoing connections of what already runs can take a port
# between its choice and the server's bind; and above 25672, RabbitMQ's distribution port,
# which must be free when a test starts a stopped RabbitMQ again. Bind-to-0 once gave two
# services of one `payhooks run all` the same port, the second failing to bind for good.
_PORTS = range(26_000, 32_000)


def free_ports(n: int) -> list[int]:
    """`n` distinct ports nothing is bound to now, each held until all are found."""
    held: list[socket.socket] = []
    try:
        while len(held) < n:
            s = socket.socket()
            try:
                s.bind(("0.0.0.0", random.choice(_PORTS)))
            except OSError:  # taken: another one
                s.close()
                continue
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def ports_for(names: Iterable[str]) -> dict[str, int]:
    """A free port for each name, all distinct (free_ports)."""
    names = list(names)
    return dict(zip(names, free_ports(len(names)), strict=True))


def payhooks(*args: str) -> list[str]:
    """The command line of `payhooks ARGS`: the console script next to this python."""
    script = shutil.which("payhooks", path=str(Path(sys.executable).parent)) or "payhooks"
    return [script, *args]


def migrate(database_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "WARNING"}
    subprocess.run(payhooks("migrate"), env=env, check=True, stdout=subprocess.DEVNULL)


def service_env(
    drop: tuple[str, ...],
    *,
    database_url: str,
    amqp_url: str,
    prefix: str,
    secret: str,
    log_level: str,
    **extra: str,
) -> dict[str, str]:
    """This environment less the variables starting with `drop`, set up for owned services.

    The timestamp tolerance is wide because the deliveries are signed before the run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        DATABASE_URL=database_url,
        AMQP_URL=amqp_url,
        AMQP_PREFIX=prefix,
        XHUB_WEBHOOK_SECRETS=secret,
        XHUB_TIMESTAMP_TOLERANCE="3600",
        LOG_LEVEL=log_level,
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


class OwnedProcess:
    """A subprocess we start (`process` is set then) and stop at the end."""

    process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self) -> None:
        terminate(self.process)


def spawn(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start `command` in the repository, its output appended to `log_path`."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def terminate(
    process: subprocess.Popen[bytes] | None,
    timeout_s: float = 20.0,
    signum: signal.Signals = signal.SIGTERM,
) -> None:
    """`signum`, so the process shuts down cleanly; killed if it has not within `timeout_s`."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signum)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
