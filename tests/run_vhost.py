"""A RabbitMQ vhost of a test or bench run's own, made with rabbitmqctl on this machine: it is
deleted at the end with every queue in it, and by the next run when the process owning it died.

Queues left in the broker's `/` by interrupted runs once piled up to a few hundred quorum
queues, and RabbitMQ 3.10 stopped answering new connections (docs/rabbitmq-limits.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import aio_pika

_PREFIX = "payhooks_run_"
_NAME = re.compile(rf"^{_PREFIX}[a-z]+_([0-9]+)$")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_CTL_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class RunVhost:
    name: str
    url: str  # the run's AMQP URL: the base URL with this vhost


class RabbitmqctlError(Exception):
    pass


def _rabbitmqctl(*args: str) -> str:
    executable = shutil.which("rabbitmqctl")
    if executable is None:
        raise RabbitmqctlError("rabbitmqctl is not installed")
    try:
        done = subprocess.run(
            [executable, "-q", *args],
            capture_output=True,
            text=True,
            timeout=_CTL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RabbitmqctlError(f"rabbitmqctl {args[0]}: {e!r}") from e
    if done.returncode != 0:
        raise RabbitmqctlError(f"rabbitmqctl {args[0]}: {done.stderr.strip()[:300]}")
    return done.stdout


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a run's leftovers are cleaned up when it does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete(name: str) -> None:
    with contextlib.suppress(RabbitmqctlError):  # already gone
        _rabbitmqctl("delete_vhost", name)


def delete_vhosts_of_dead_runs() -> list[str]:
    """Delete every run vhost whose process is gone (killed runs); returns their names."""
    dead = []
    for line in _rabbitmqctl("list_vhosts", "name").splitlines():
        match = _NAME.match(line.strip())
        if match and not alive(int(match.group(1))):
            _delete(line.strip())
            dead.append(line.strip())
    return dead


async def _connects(url: str) -> bool:
    try:
        connection = await aio_pika.connect(url, timeout=10)
    except (TimeoutError, aio_pika.exceptions.AMQPError, OSError):
        return False
    await connection.close()
    return True


def create(base_url: str, purpose: str, max_queues: int) -> RunVhost | None:
    """This process's vhost for `purpose` on the broker of `base_url`, or None where none can be
    made: a broker elsewhere, a URL naming a vhost, no rabbitmqctl or no access to the node,
    or a node that is not the one `base_url` reaches. The caller then uses `base_url` as is.

    `max_queues` caps the vhost (RabbitMQ refuses the declare beyond it), so that even a run
    gone wrong cannot pile up queues by the hundred."""
    parts = urlsplit(base_url)
    if parts.hostname not in _LOOPBACK or unquote(parts.path) not in ("", "/"):
        return None
    name = f"{_PREFIX}{purpose}_{os.getpid()}"
    user = unquote(parts.username or "guest")
    try:
        delete_vhosts_of_dead_runs()
        _delete(name)  # the leftover of a dead run whose pid this process now has
        _rabbitmqctl("add_vhost", name)
        _rabbitmqctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
        _rabbitmqctl("set_vhost_limits", "-p", name, f'{{"max-queues": {max_queues}}}')
    except RabbitmqctlError:
        _delete(name)
        return None
    url = urlunsplit(parts._replace(path="/" + quote(name, safe="")))
    if not asyncio.run(_connects(url)):  # rabbitmqctl's node is not the one at base_url
        _delete(name)
        return None
    return RunVhost(name, url)


def delete(vhost: RunVhost) -> None:
    """Delete the vhost and with it every queue and exchange the run declared."""
    _delete(vhost.name)


@contextlib.contextmanager
def own_vhost(base_url: str, purpose: str, max_queues: int) -> Iterator[str]:
    """The AMQP URL to use for a run: a vhost of its own where one can be made (deleted
    afterwards), else `base_url` unchanged."""
    vhost = create(base_url, purpose, max_queues)
    try:
        yield base_url if vhost is None else vhost.url
    finally:
        if vhost is not None:
            delete(vhost)
