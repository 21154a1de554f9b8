"""RabbitMQ's memory alarm on the local node, set off for a while and always cleared again
(used by the overload tests and bench/overload.py).

With the memory high watermark near zero the node raises its memory alarm and blocks every
connection that publishes (AMQP connection.blocked). The watermark the node had before is put
back in a `finally`, exactly as it was (relative or absolute).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator

_TINY_WATERMARK = "0.000001"


def _rabbitmqctl(*args: str) -> str:
    done = subprocess.run(
        ["rabbitmqctl", *args], check=True, capture_output=True, text=True, timeout=60
    )
    return done.stdout.strip()


def _watermark() -> str:
    """The node's live watermark as an Erlang term: `0.4` or `{absolute,1073741824}`."""
    return _rabbitmqctl("eval", "vm_memory_monitor:get_vm_memory_high_watermark().")


def unavailable_reason() -> str | None:
    """Why the alarm cannot be set off here, or None if it can."""
    if shutil.which("rabbitmqctl") is None:
        return "rabbitmqctl is not on PATH (RabbitMQ is not on this machine)"
    with contextlib.suppress(ValueError):
        if float(watermark := _watermark()) < 0.01:
            return f"RabbitMQ's memory watermark is {watermark} already: another run's alarm"
    return None


@contextlib.contextmanager
def memory_alarm() -> Iterator[None]:
    """RabbitMQ blocks publishers inside the block (check unavailable_reason() first)."""
    before = _watermark()
    try:
        _rabbitmqctl("set_vm_memory_high_watermark", _TINY_WATERMARK)
        yield
    finally:
        _rabbitmqctl("eval", f"vm_memory_monitor:set_vm_memory_high_watermark({before}).")
        if (after := _watermark()) != before:
            raise RuntimeError(f"RabbitMQ's memory watermark is {after}, was {before}: fix it")
