"""What the benchmarks watch besides the answers: CPU per process group, the machine's load
(and other benchmarks running), peak RSS and Prometheus samples. Linux /proc only."""

from __future__ import annotations

import contextlib
import os
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


def children(pid: int) -> list[int]:
    """The pids of `pid`'s children (INGEST_PROCESSES copies under their supervisor)."""
    with contextlib.suppress(OSError):
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def peak_rss_per_process_mb(pid: int) -> float | None:
    """The highest peak RSS of `pid` and its children (each copy of a supervised ingest)."""
    peaks = [peak for p in (pid, *children(pid)) if (peak := peak_rss_mb(p)) is not None]
    return max(peaks, default=None)


@dataclass(frozen=True, slots=True)
class Servers:
    """The broker and database processes a bench counts, by root: each RabbitMQ node's
    beam.smp and each PostgreSQL cluster's postmaster pid -> a group `rabbitmq/<node>` or
    `postgres/<cluster>`. Their children (erl_child_setup, backends, walsenders) count with
    them; other beam.smp and postgres processes (other people's servers) count as `other`.
    Without it, every beam.smp is `rabbitmq` and every postgres process `postgres`."""

    roots: Mapping[int, str]


def _ppid(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    return 0


def _root_group(pid: int, ppid: int, servers: Servers) -> str | None:
    """The group of the server `pid` belongs to (itself, its parent or grandparent: a
    beam.smp's inet_gethost sits under erl_child_setup), if any."""
    for candidate in (pid, ppid, _ppid(ppid) if ppid > 1 else 0):
        if candidate in servers.roots:
            return servers.roots[candidate]
    return None


def _other_database(entry: Path, database: str) -> bool:
    """A backend of another database (other people's tests on a shared server). Its title is
    "postgres: 15/main: user database host(port) state"; a walsender's is "walsender user
    host(port) state": the server's own work, not another database's."""
    with contextlib.suppress(OSError):
        title = (entry / "cmdline").read_bytes().decode(errors="replace").split(": ")
        words = title[2].split() if len(title) > 2 else []
        return (
            len(words) > 2
            and "(" in words[2]
            and words[0] != "walsender"
            and (words[1] != database)
        )
    return False


def _group(
    entry: Path,
    comm: str,
    ppid: int,
    server_pid: int | None,
    database: str,
    servers: Servers | None = None,
) -> str:
    if server_pid is not None and server_pid in (int(entry.name), ppid):
        return "ingest"
    if servers is not None:
        group = _root_group(int(entry.name), ppid, servers)
        if group is None:
            return "other"
        if group.startswith("postgres") and _other_database(entry, database):
            return "other"
        return group
    if comm.startswith("postgres"):
        return "other" if _other_database(entry, database) else "postgres"
    if comm in {"beam.smp", "erl_child_setup", "epmd", "inet_gethost"}:
        return "rabbitmq"
    return "other"


def cpu_ticks(
    server_pid: int | None, skip: list[int], database: str, servers: Servers | None = None
) -> dict[int, tuple[str, int]]:
    """Per process: its group (ingest, postgres, rabbitmq, other; with `servers`, the
    servers' own groups) and CPU ticks used so far."""
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
        group = _group(entry, comm, int(fields[1]), server_pid, database, servers)
        ticks[int(entry.name)] = (group, int(fields[11]) + int(fields[12]))
    return ticks


def cpu_used(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]) -> Counter[str]:
    """Ticks per group between two snapshots (processes that ended meanwhile are not seen)."""
    used: Counter[str] = Counter()
    for pid, (group, ticks) in after.items():
        delta = ticks - before.get(pid, (group, 0))[1]
        used[group] += delta
        if "/" in group:  # rabbitmq/ha1 also counts in rabbitmq, postgres/ha_a in postgres
            used[group.split("/", 1)[0]] += delta
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


def scrape_labelled(base_url: str) -> dict[str, float]:
    """Every Prometheus sample of a service, keyed by its name with labels (empty if /metrics
    cannot be read)."""
    samples: dict[str, float] = {}
    with (
        contextlib.suppress(OSError, urllib.error.URLError, ValueError),
        urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as response,
    ):
        for line in response.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
    return samples


def scrape(base_url: str) -> dict[str, float]:
    """The server's unlabelled Prometheus samples (empty if /metrics cannot be read)."""
    return {k: v for k, v in scrape_labelled(base_url).items() if "{" not in k}


def mean_delta(before: dict[str, float], after: dict[str, float], metric: str) -> float | None:
    count = after.get(f"{metric}_count", 0) - before.get(f"{metric}_count", 0)
    if count <= 0:
        return None
    return (after.get(f"{metric}_sum", 0) - before.get(f"{metric}_sum", 0)) / count


def worker_metrics(
    before: dict[str, float], after: dict[str, float], worker: str
) -> tuple[float | None, dict[str, int]]:
    """A worker's mean handling time in ms (None if it handled nothing) and its outcome
    counts between two labelled scrapes."""

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    label = f'{{worker="{worker}"}}'
    count = delta(f"payhooks_processing_duration_seconds_count{label}")
    total_s = delta(f"payhooks_processing_duration_seconds_sum{label}")
    outcomes: dict[str, int] = {}
    pattern = re.compile(r"payhooks_messages_processed_total\{(.*)\}")
    for key in after:
        match = pattern.fullmatch(key)
        if match and f'worker="{worker}"' in match.group(1):
            outcome = re.search(r'outcome="([^"]*)"', match.group(1))
            if outcome and (n := int(delta(key))):
                outcomes[outcome.group(1)] = n
    return (total_s / count * 1000 if count > 0 else None), outcomes


Snapshot = tuple[float, tuple[int, int], dict[int, tuple[str, int]]]


class CpuGroups:
    """CPU per process group: ours by pid, the rest as cpu_ticks groups them."""

    def __init__(
        self,
        groups: dict[int, str],
        skip: list[int],
        database: str,
        servers: Servers | None = None,
    ) -> None:
        self._groups = groups
        self._skip = skip
        self._database = database
        self._servers = servers

    def snapshot(self) -> Snapshot:
        ticks = cpu_ticks(None, self._skip, self._database, self._servers)
        relabelled = {pid: (self._groups.get(pid, g), t) for pid, (g, t) in ticks.items()}
        return time.monotonic(), busy_idle(), relabelled

    @staticmethod
    def pct(before: Snapshot, after: Snapshot) -> dict[str, float]:
        """% of one core per group between two snapshots, and `all` for the whole machine."""
        wall = after[0] - before[0]
        used = cpu_used(before[2], after[2])
        pct = {group: 100 * ticks / CLK_TCK / wall for group, ticks in used.items()}
        pct["all"] = 100 * (after[1][0] - before[1][0]) / CLK_TCK / wall
        return pct


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return pids


def other_benchmarks() -> list[int]:
    """Pids running `bench.ingest` (what `pgrep -f bench.ingest` finds, less shells that only
    mention it: the module name must be a whole argument)."""
    found, mine = [], _ancestors()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"bench.ingest" in argv or any(a.endswith(b"bench/ingest.py") for a in argv):
                found.append(int(entry.name))
    return found


def wait_for_other_benchmarks(max_wait_s: float) -> None:
    deadline = time.monotonic() + max_wait_s
    announced = False
    while (pids := other_benchmarks()) and time.monotonic() < deadline:
        if not announced:
            print(f"  waiting for bench.ingest (pids {pids}) to end...", flush=True)
            announced = True
        time.sleep(5)
    if pids:
        print(f"  WARNING: bench.ingest still running (pids {pids}): figures will be low")
