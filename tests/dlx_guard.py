"""A guard against RabbitMQ 3.10's dead-letter supervisor dying while tests delete queues.

`rabbit_fifo_dlx_sup` (intensity 1 per 5 s) gives up when two at-least-once dead-letter
workers crash within 5 s, which they do when their quorum queue is deleted while they start;
it is never restarted, and from then on every at-least-once queue declared crashes on start
(a consume on it closes the connection, 541 INTERNAL_ERROR). Tests, benches and `make chaos`
delete their queues all the time, so while they run this restarts it within seconds.
rabbitmq/rabbitmq-server#16652; docs/rabbitmq-limits.md.
"""

from __future__ import annotations

import shutil
import subprocess
import threading

_CHECK = (
    "case whereis(rabbit_fifo_dlx_sup) of"
    " undefined -> supervisor:restart_child(rabbit_sup, rabbit_fifo_dlx_sup), restarted;"
    " _ -> alive end."
)
INTERVAL_S = 5.0


def available() -> bool:
    return shutil.which("rabbitmqctl") is not None


def ensure(node: str | None = None) -> bool:
    """Restart the supervisor of `node` (None: rabbitmqctl's default, the machine's broker) if
    it died; True if it had to (False also when unreachable)."""
    command = ["rabbitmqctl", "-q", *(["-n", node] if node else []), "eval", _CHECK]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.stdout.strip() == "restarted"


class Guard:
    """Checks every INTERVAL_S on a daemon thread until stopped."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dlx-guard", daemon=True)
        self.restarts = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=35)

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self.restarts += ensure()
