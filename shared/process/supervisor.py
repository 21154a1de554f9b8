"""N copies of one service on one port (SO_REUSEPORT): the command that was run starts them
again as its children, forwards SIGTERM/SIGINT to them once, and ends with them. One child
that exits on its own ends the rest (its exit code is the supervisor's): a process manager
then restarts the whole, as it would a single process.

The children share a Prometheus multiprocess directory, so /metrics on any of them
answers for all (counters and histograms summed; `process_*` left out, being per process).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import types

import structlog

log = structlog.get_logger(__name__)

# Set in a child's environment: the supervisor's pid (a child whose parent is gone stops).
SUPERVISOR_ENV = "PAYHOOKS_SUPERVISOR_PID"
# prometheus_client reads it when imported: its values then live in files there.
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def supervised_by() -> int | None:
    """The supervisor's pid when this process is one of its children."""
    value = os.environ.get(SUPERVISOR_ENV)
    return int(value) if value else None


def supervise(name: str, processes: int) -> int:
    """Run `processes` copies of this very command; return when all have exited."""
    with tempfile.TemporaryDirectory(prefix=f"payhooks-{name}-metrics-") as metrics_dir:
        env = dict(os.environ, **{SUPERVISOR_ENV: str(os.getpid()), METRICS_DIR_ENV: metrics_dir})
        command = [sys.executable, *sys.orig_argv[1:]]
        # Children not yet reaped, by pid. Only the loop below reaps (os.wait), so a pid here
        # is never one the system gave to another process meanwhile.
        children: dict[int, subprocess.Popen[bytes]] = {}
        stopping = False

        def stop(signum: int = signal.SIGTERM, _: types.FrameType | None = None) -> None:
            nonlocal stopping
            if stopping:  # each child is asked once: a second signal would cut its shutdown
                return
            stopping = True
            for pid in children:
                with contextlib.suppress(ProcessLookupError):  # exited, not yet reaped
                    os.kill(pid, signal.SIGTERM)

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, stop)
        # Their own session: a terminal's Ctrl-C reaches the supervisor, which asks each once.
        for _ in range(processes):
            if stopping:  # asked to stop while starting them
                break
            child = subprocess.Popen(command, env=env, start_new_session=True)
            children[child.pid] = child
        if stopping:
            stopping = False
            stop()
        log.info("service.processes_started", service=name, pids=sorted(children))
        code = 0
        while children:
            pid, status = os.wait()
            if pid not in children:
                continue
            child = children.pop(pid)
            exit_code = child.returncode = os.waitstatus_to_exitcode(status)
            if not stopping:
                log.error("service.process_exited", service=name, pid=pid, exit_code=exit_code)
                code = exit_code or 1
                stop()
            elif exit_code not in (0, -signal.SIGTERM):
                code = code or exit_code
        return code if code >= 0 else 1
