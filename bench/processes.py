"""Subprocesses the benchmarks own: free ports, the payhooks console script, the services'
environment, starting with a log file and stopping with SIGTERM."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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
