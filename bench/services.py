"""The payhooks services `bench.workers` runs: one `payhooks run NAME` subprocess each, on a
free port, the wait until all of them are ready, and stopping them side by side."""

from __future__ import annotations

import contextlib
import signal
import time
import urllib.request
from pathlib import Path

from bench.processes import OwnedProcess, payhooks, spawn

SERVICES = ("ingest", "orders", "bonuses", "email")
PORT_VARIABLES = {
    "ingest": "INGEST_PORT",
    "orders": "ORDERS_PORT",
    "bonuses": "BONUSES_PORT",
    "email": "EMAIL_PORT",
}
WORKERS = {"orders": "orders", "bonuses": "bonuses", "email": "emails"}  # service -> queue


class Service(OwnedProcess):
    """One `payhooks run NAME` subprocess we own, on its own free port; `copy` numbers the
    copies of one service (bench.copies runs two of each), from 1."""

    def __init__(
        self, name: str, port: int, env: dict[str, str], log_dir: Path, copy: int = 1
    ) -> None:
        self.name = name
        self.base_url = f"http://127.0.0.1:{port}"
        self._env = env if copy == 1 else {**env, PORT_VARIABLES[name]: str(port)}
        self.log_path = log_dir / (f"{name}.log" if copy == 1 else f"{name}-{copy}.log")

    def start(self) -> None:
        self.process = spawn(payhooks("run", self.name), self._env, self.log_path)

    def ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            tail = self.log_path.read_bytes()[-3000:].decode(errors="replace")
            raise RuntimeError(f"{self.name} exited at startup:\n{tail}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{self.base_url}/readyz", timeout=2) as response,
        ):
            return bool(response.status == 200)
        return False


def wait_ready(services: dict[str, Service], deadline: float) -> None:
    """Until every service answers /readyz; RuntimeError past `deadline` (monotonic)."""
    pending = set(services)
    while pending:
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready in 60 s: {sorted(pending)}")
        pending = {name for name in pending if not services[name].ready()}
        time.sleep(0.2)


def stop_all(services: dict[str, Service]) -> None:
    """SIGTERM them all first, so they shut down side by side, then wait for each."""
    for service in services.values():
        if service.process is not None and service.process.poll() is None:
            service.process.send_signal(signal.SIGTERM)
    for service in services.values():
        service.stop()
