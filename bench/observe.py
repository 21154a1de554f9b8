"""What the benchmark watches besides the answers: CPU per process group, the machine's load,
the ingest's peak RSS and its Prometheus samples. Linux /proc only (psutil is not needed)."""

from __future__ import annotations

import contextlib
import os
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


def _group(entry: Path, comm: str, server_pid: int | None, database: str) -> str:
    if int(entry.name) == server_pid:
        return "ingest"
    if comm.startswith("postgres"):
        # A backend's title is "postgres: 15/main: user database host(port) state": backends
        # of other databases (other people's tests on a shared machine) are not ours.
        with contextlib.suppress(OSError):
            title = (entry / "cmdline").read_bytes().decode(errors="replace").split(": ")
            words = title[2].split() if len(title) > 2 else []
            if len(words) > 2 and "(" in words[2] and words[1] != database:
                return "other"
        return "postgres"
    if comm in {"beam.smp", "erl_child_setup", "epmd", "inet_gethost"}:
        return "rabbitmq"
    return "other"


def cpu_ticks(server_pid: int | None, skip: list[int], database: str) -> dict[int, tuple[str, int]]:
    """Per process: its group (ingest, postgres, rabbitmq, other) and CPU ticks used so far."""
    ticks: dict[int, tuple[str, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        group = _group(entry, comm, server_pid, database)
        ticks[int(entry.name)] = (group, int(fields[11]) + int(fields[12]))
    return ticks


def cpu_used(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]) -> Counter[str]:
    """Ticks per group between two snapshots (processes that ended meanwhile are not seen)."""
    used: Counter[str] = Counter()
    for pid, (group, ticks) in after.items():
        used[group] += ticks - before.get(pid, (group, 0))[1]
    return used


def busy_idle() -> tuple[int, int]:
    """(busy, idle) ticks of the whole machine so far."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = values[3] + values[4]
    return sum(values) - idle, idle


def busy_share(seconds: float) -> float:
    busy0, idle0 = busy_idle()
    time.sleep(seconds)
    busy1, idle1 = busy_idle()
    return (busy1 - busy0) / max(1, busy1 - busy0 + idle1 - idle0)


def wait_quiet(max_wait_s: float, max_busy: float = 0.15) -> None:
    """On a shared machine, start measuring only when nothing else is busy (or say so)."""
    deadline = time.monotonic() + max_wait_s
    while (busy := busy_share(2.0)) > max_busy and time.monotonic() < deadline:
        pass
    note = "" if busy <= max_busy else "  WARNING: machine not quiet, figures will be low"
    print(f"  machine busy before the run: {busy:.0%} of {os.cpu_count()} cores{note}", flush=True)


def scrape(base_url: str) -> dict[str, float]:
    """The server's unlabelled Prometheus samples (empty if /metrics cannot be read)."""
    samples: dict[str, float] = {}
    with (
        contextlib.suppress(OSError, urllib.error.URLError, ValueError),
        urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as response,
    ):
        for line in response.read().decode().splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.split()[:2]
                samples[name] = float(value)
    return samples


def mean_delta(before: dict[str, float], after: dict[str, float], metric: str) -> float | None:
    count = after.get(f"{metric}_count", 0) - before.get(f"{metric}_count", 0)
    if count <= 0:
        return None
    return (after.get(f"{metric}_sum", 0) - before.get(f"{metric}_sum", 0)) / count
