"""Worker benchmark: N paid payments pushed through ingest, orders, bonuses and email.

    python -m bench.workers [--n 10000] [--concurrency 64] [--warmup 500]
    python -m bench.workers --n 2000 --profile email   # py-spy one service while measuring

It owns everything it runs and removes it at the end: an aiosmtpd SMTP sink in its own
process (it notes the Message-ID and arrival time of every email in a file), the four services
as subprocesses (`payhooks run ingest|orders|bonuses|email` on free ports, database
`payhooks_bench_workers`, AMQP prefix `benchw.`, LOG_LEVEL=WARNING, one log file each in
--log-dir) and the load client processes. It registers N+warm-up orders in bulk (COPY), drives
a warm-up, waits for the machine to be quiet (and for a running `bench.ingest` to end), then
drives N signed `payment.status_changed` paid webhooks (matching amount and currency) at
concurrency C, noting when each was accepted, and waits for the N emails.

Figures: payments fully processed/s = N / (last email received - first webhook accepted),
end-to-end latency per payment from its 200 answer to its email arriving at the sink, ingest
accepted/s, CPU per process group and peak RSS per service. The load is open-ended (every
webhook is sent as fast as ingest accepts it), so the latency mostly measures the backlog
queued behind the slowest worker; --rate caps the offered load to see the latency at a rate.

It also prints where the backlog waited (peak depth of each work queue, sampled every
second), each worker's mean handling time and outcomes (from its /metrics), PostgreSQL commits
per payment, CPU with no load for reference, and with --profile a py-spy summary of one
service (raw stacks in --log-dir). The bench database keeps the run's rows until the next run
truncates them; the queues and exchanges are deleted at the end.

Exit status 1 if a check fails: exactly N bonus grants, N emails_sent rows and N emails
received by the sink for the measured payments, and no message in any DLQ or `unrouted`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import multiprocessing
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import aio_pika
import aiohttp
import asyncpg
import orjson
import uvloop

from bench.ingest import ROOT, _free_port, _migrate, server_command
from bench.load import REQUEST_TIMEOUT_S, Delivery, Summary, Tally, _drive, summarize
from bench.observe import CLK_TCK, busy_idle, cpu_ticks, cpu_used, peak_rss_mb, wait_quiet
from services.ingest.signatures import sign
from services.ingest.webhook import ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER
from shared.config import Settings
from shared.topology import Topology, build_topology, delete

BENCH_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/payhooks_bench_workers"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_PREFIX = "benchw."
# Issue 3's target. Measured on the 2-core machine (n=10,000, C=64, quiet): 164-170/s, with
# ~10 ms of CPU per payment over all processes (email worker ~3.4 ms, RabbitMQ ~1.8 ms,
# PostgreSQL ~1.7 ms, orders ~1.2 ms, bonuses ~0.9 ms, SMTP sink ~0.7 ms, ingest ~0.6 ms);
# 1,500/s on 2 cores leaves 1.3 ms.
TARGET_PER_S = 1500.0
CLIENT_PROCESSES = 2
SERVICES = ("ingest", "orders", "bonuses", "email")
PORT_VARIABLES = {
    "ingest": "INGEST_PORT",
    "orders": "ORDERS_PORT",
    "bonuses": "BONUSES_PORT",
    "email": "EMAIL_PORT",
}
WORKERS = {"orders": "orders", "bonuses": "bonuses", "email": "emails"}  # service -> queue
TABLES = "inbox, orders, order_transitions, processed_events, outbox, bonus_ledger, emails_sent"
EMAIL_FROM = "payments@bench.payhooks.localhost"
TEMPLATE = "payment_succeeded"
# CPU (% of one core) used meanwhile by processes that are not part of the benchmark, above
# which the figures say more about the neighbours than about payhooks.
DISTURBED_PCT = 20.0


# --- the SMTP sink (runs in its own process) --------------------------------------------------

_MESSAGE_ID = re.compile(rb"^Message-ID:[ \t]*(\S+)", re.IGNORECASE | re.MULTILINE)
_SINK_MAIN = (
    "import sys; from bench.workers import run_sink; run_sink(int(sys.argv[1]), sys.argv[2])"
)


class _Recorder:
    """aiosmtpd handler: one line per accepted message, `<message-id> <unix time received>`.

    Lines are flushed 20 ms after the first unflushed one: the arrival time is taken on
    arrival, and an idle sink costs nothing."""

    FLUSH_AFTER_S = 0.02

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._flush: asyncio.TimerHandle | None = None

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        received = time.time()
        match = _MESSAGE_ID.search(envelope.original_content or envelope.content or b"")
        message_id = match.group(1).decode(errors="replace") if match else "?"
        self._out.write(f"{message_id} {received:.6f}\n")
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(self.FLUSH_AFTER_S, self.flush)
        return "250 Message accepted for delivery"

    def flush(self) -> None:
        self._flush = None
        self._out.flush()


def run_sink(port: int, path: str) -> None:
    """The sink process: an aiosmtpd server on uvloop until SIGTERM."""
    from aiosmtpd.smtp import SMTP

    async def serve(out: IO[str]) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        recorder = _Recorder(out)
        server = await loop.create_server(
            lambda: SMTP(recorder, hostname="bench-sink", loop=loop),
            "127.0.0.1",
            port,
            backlog=256,
        )
        await stop.wait()
        server.close()
        recorder.flush()

    with open(path, "w", buffering=1 << 16) as out:
        uvloop.run(serve(out))


class Sink:
    """The sink subprocess we own, and what it has received so far."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.port = _free_port()
        self.path = log_dir / "sink-received.txt"
        self._log_path = log_dir / "sink.log"
        self._env = env
        self._offset = 0
        self._partial = b""
        self.received: dict[str, float] = {}  # payment id -> first arrival (unix time)
        self.repeats: Counter[str] = Counter()  # payment ids received more than once
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 15.0) -> None:
        self.path.write_bytes(b"")
        with open(self._log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _SINK_MAIN, str(self.port), str(self.path)],
                cwd=ROOT,
                env=self._env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"SMTP sink exited at startup, see {self._log_path}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            time.sleep(0.1)
        raise RuntimeError(f"SMTP sink not listening in {timeout_s}s")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def poll(self) -> int:
        """Read the lines written since the last call; return how many payments have mail."""
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            message_id, _, at = line.decode().rpartition(" ")
            payment_id = _payment_of(message_id)
            if payment_id in self.received:
                self.repeats[payment_id] += 1
            else:
                self.received[payment_id] = float(at)
        return len(self.received)

    def stop(self) -> None:
        _terminate(self.process)


def _payment_of(message_id: str) -> str:
    """`<payment_succeeded.PAYMENT@domain>` (services.email.templates.message_id) -> PAYMENT."""
    local = message_id.strip("<>").rpartition("@")[0]
    return local.partition(".")[2] or message_id


def _terminate(process: subprocess.Popen[bytes] | None, timeout_s: float = 20.0) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


# --- the services -----------------------------------------------------------------------------


class Service:
    """One `payhooks run NAME` subprocess we own, on its own free port."""

    def __init__(self, name: str, port: int, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.base_url = f"http://127.0.0.1:{port}"
        self._env = env
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        # server_command("run") is [payhooks, "run"]: the console script next to this python.
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*server_command("run"), self.name],
                env=self._env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

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

    def stop(self) -> None:
        _terminate(self.process)


def scrape_labelled(base_url: str) -> dict[str, float]:
    """Every Prometheus sample of a service, keyed by its name with labels."""
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


# --- the database and the broker --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Payment:
    order_id: str
    payment_id: str
    amount: str  # "12.34"

    @property
    def event_id(self) -> str:
        return f"evt_{self.payment_id}"


def make_payments(run_id: str, kind: str, n: int) -> list[Payment]:
    return [
        Payment(
            order_id=f"ord_{run_id}_{kind}{i:07d}",
            payment_id=f"pay_{run_id}_{kind}{i:07d}",
            amount=f"{(i * 7919) % 99_900 / 100 + 1:.2f}",
        )
        for i in range(n)
    ]


async def _reset(database_url: str, amqp_url: str, topology: Topology) -> None:
    """Empty the tables and remove the services' topology (left over by a killed run)."""
    conn = await asyncpg.connect(database_url, timeout=5)
    try:
        await conn.execute(f"TRUNCATE {TABLES} RESTART IDENTITY")
    finally:
        await conn.close()
    connection = await aio_pika.connect(amqp_url, timeout=5)
    async with connection:
        await delete(await connection.channel(), topology)


async def _register(database_url: str, payments: list[Payment]) -> None:
    """The shop's orders, in bulk (COPY): the state PENDING, the money the webhooks carry."""
    records = [
        (
            p.order_id,
            p.payment_id,
            f"user_{i % 1000:04d}",
            f"buyer{i}@example.com",
            Decimal(p.amount),
            "USD",
        )
        for i, p in enumerate(payments)
    ]
    conn = await asyncpg.connect(database_url, timeout=5)
    try:
        await conn.copy_records_to_table(
            "orders",
            records=records,
            columns=["order_id", "payment_id", "user_id", "email", "amount", "currency"],
        )
        await conn.execute("ANALYZE orders")
    finally:
        await conn.close()


async def _commits(database_url: str) -> int:
    """Transactions committed in the bench database so far (PostgreSQL's statistics)."""
    conn = await asyncpg.connect(database_url, timeout=5)
    try:
        value = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
    finally:
        await conn.close()
    return int(value or 0)


async def _consumers(amqp_url: str, queues: list[str]) -> dict[str, tuple[int, int]]:
    """(messages, consumers) per queue; a queue that does not exist counts as (-1, 0)."""
    found: dict[str, tuple[int, int]] = {}
    connection = await aio_pika.connect(amqp_url, timeout=5)
    async with connection:
        for name in queues:
            channel = await connection.channel()
            try:
                declared = await channel.declare_queue(name, passive=True)
            except aio_pika.exceptions.ChannelClosed:
                found[name] = (-1, 0)
                continue
            result = declared.declaration_result
            found[name] = (result.message_count or 0, result.consumer_count or 0)
            await channel.close()
    return found


@dataclass(frozen=True, slots=True)
class Effects:
    """What the database holds for the measured payments."""

    paid_orders: int
    grants: int
    grant_points: int
    emails_sent: int
    last_grant_at: float | None  # unix time of the last measured grant's transaction


async def _effects(database_url: str, measured_prefix: str) -> Effects:
    conn = await asyncpg.connect(database_url, timeout=5)
    try:
        ledger = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE payment_id LIKE $1) AS grants,"
            " coalesce(sum(points) FILTER (WHERE payment_id LIKE $1), 0) AS points,"
            " max(created_at) FILTER (WHERE payment_id LIKE $1) AS last_at"
            " FROM bonus_ledger WHERE kind = 'grant'",
            measured_prefix + "%",
        )
        emails = await conn.fetchrow(
            "SELECT count(*) AS sent FROM emails_sent WHERE payment_id LIKE $1 AND template = $2",
            measured_prefix + "%",
            TEMPLATE,
        )
        paid = await conn.fetchval(
            "SELECT count(*) FROM orders WHERE payment_id LIKE $1 AND status = 'PAID'",
            measured_prefix + "%",
        )
    finally:
        await conn.close()
    assert ledger is not None
    assert emails is not None
    last_at: dt.datetime | None = ledger["last_at"]
    return Effects(
        paid_orders=paid,
        grants=ledger["grants"],
        grant_points=ledger["points"],
        emails_sent=emails["sent"],
        last_grant_at=None if last_at is None else last_at.timestamp(),
    )


# --- load -------------------------------------------------------------------------------------


def make_deliveries(payments: list[Payment], secret: bytes) -> list[Delivery]:
    """One signed `payment.status_changed` paid webhook per payment, its order's money."""
    timestamp = str(int(time.time()))
    created_at = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
    deliveries: list[Delivery] = []
    for p in payments:
        body = orjson.dumps(
            {
                "event": "payment.status_changed",
                "payment_id": p.payment_id,
                "external_id": p.order_id,
                "status": "paid",
                "amount": p.amount,
                "currency": "USD",
                "created_at": created_at,
            }
        )
        headers = {
            ID_HEADER: p.event_id,
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: sign(secret, timestamp, body),
            "Content-Type": "application/json",
        }
        deliveries.append((headers, body))
    return deliveries


class _Stamped(set[str]):
    """The `ok_ids` of bench.load._drive, noting when each event id was first answered 200."""

    def __init__(self) -> None:
        super().__init__()
        self.at: dict[str, float] = {}

    def add(self, event_id: str) -> None:
        self.at.setdefault(event_id, time.time())
        super().add(event_id)


async def _drive_paced(
    session: aiohttp.ClientSession,
    url: str,
    deliveries: list[Delivery],
    concurrency: int,
    rate: float,
    deadline: float,
    tally: Tally,
    ok_ids: _Stamped,
) -> None:
    """Like bench.load._drive, but delivery i leaves no earlier than i/rate s after the start."""
    started = time.monotonic()
    limit = asyncio.Semaphore(concurrency)

    async def one(headers: dict[str, str], body: bytes) -> None:
        async with limit:
            await _drive(session, url, [(headers, body)], 1, deadline, tally, ok_ids)

    tasks = []
    for i, (headers, body) in enumerate(deliveries):
        if (delay := started + i / rate - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        if time.monotonic() > deadline:
            break
        tasks.append(asyncio.create_task(one(headers, body)))
    await asyncio.gather(*tasks)


async def _client(
    url: str,
    deliveries: list[Delivery],
    concurrency: int,
    rate: float,
    max_seconds: float,
    barrier: Any,
) -> tuple[Tally, dict[str, float]]:
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        health = url.replace("/webhooks/xhub", "/healthz")

        async def touch() -> None:  # open the keep-alive connections before the start
            async with session.get(health) as response:
                await response.read()

        await asyncio.gather(*(touch() for _ in range(concurrency)))
        barrier.wait(timeout=max_seconds)  # blocks the loop on purpose: nothing else to do
        tally = Tally(started=time.monotonic())
        stamped = _Stamped()
        cpu_started = time.process_time()
        deadline = tally.started + max_seconds
        if rate > 0:
            await _drive_paced(
                session, url, deliveries, concurrency, rate, deadline, tally, stamped
            )
        else:
            await _drive(session, url, deliveries, concurrency, deadline, tally, stamped)
        tally.finished = time.monotonic()
        tally.cpu_s = time.process_time() - cpu_started
        tally.ok_ids = set(stamped)
    return tally, stamped.at


def _client_process(
    url: str,
    deliveries: list[Delivery],
    concurrency: int,
    rate: float,
    max_seconds: float,
    barrier: Any,
    results: Any,
) -> None:
    results.put(uvloop.run(_client(url, deliveries, concurrency, rate, max_seconds, barrier)))


class Clients:
    """Client processes sharing the deliveries, the concurrency and the rate (as bench.load's,
    but each also returns when each of its events was accepted)."""

    def __init__(
        self,
        url: str,
        deliveries: list[Delivery],
        concurrency: int,
        rate: float,
        processes: int,
        max_seconds: float,
    ) -> None:
        context = multiprocessing.get_context("fork")  # the deliveries are inherited, not copied
        self._barrier = context.Barrier(processes + 1)
        self._results = context.Queue()
        self._max_seconds = max_seconds
        self._processes = [
            context.Process(
                target=_client_process,
                args=(
                    url,
                    deliveries[i::processes],
                    concurrency // processes + (i < concurrency % processes),
                    rate / processes,
                    max_seconds,
                    self._barrier,
                    self._results,
                ),
                daemon=True,
            )
            for i in range(processes)
        ]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.pid is not None]

    def start(self) -> None:
        for process in self._processes:
            process.start()

    def wait_started(self) -> None:
        self._barrier.wait(timeout=60)

    def join(self) -> list[tuple[Tally, dict[str, float]]]:
        results = [
            self._results.get(timeout=self._max_seconds + REQUEST_TIMEOUT_S + 30)
            for _ in self._processes
        ]
        for process in self._processes:
            process.join(timeout=10)
        return results

    def stop(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5)


async def _warm_up(url: str, deliveries: list[Delivery], concurrency: int) -> Tally:
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    tally = Tally()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        deadline = time.monotonic() + 120
        await _drive(session, url, deliveries, concurrency, deadline, tally, set())
    return tally


# --- the profiler -----------------------------------------------------------------------------


class Profiler:
    """`py-spy record` of one service during the measured phase; a text summary at the end."""

    def __init__(self, pid: int, name: str, log_dir: Path, rate: int) -> None:
        self.output = log_dir / f"profile-{name}.txt"
        self._log = log_dir / "py-spy.log"
        self.name = name
        self._command = [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--nonblocking",
            "--function",
            "--format",
            "raw",
            "--output",
            str(self.output),
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self._log, "ab") as log:
            self.process = subprocess.Popen(self._command, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)

    def summary(self, top: int = 25) -> str:
        """The functions with the most samples on CPU: own (leaf) and including callees."""
        own: Counter[str] = Counter()
        inclusive: Counter[str] = Counter()
        total = 0
        with contextlib.suppress(OSError):
            for line in self.output.read_text().splitlines():
                stack, _, count = line.rpartition(" ")
                if not stack or not count.isdigit():
                    continue
                frames = [f.strip() for f in stack.split(";")]
                n = int(count)
                total += n
                if frames:
                    own[frames[-1]] += n
                for frame in set(frames):
                    inclusive[frame] += n
        if not total:
            return f"  no samples from py-spy (see {self._log})"
        lines = [f"  {total:,} samples on CPU; own time (leaf frame):"]
        lines += [f"  {100 * n / total:6.1f}%  {frame}" for frame, n in own.most_common(top)]
        lines.append("  including callees:")
        lines += [f"  {100 * n / total:6.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
        return "\n".join(lines)


# --- CPU -------------------------------------------------------------------------------------

Snapshot = tuple[float, tuple[int, int], dict[int, tuple[str, int]]]


class CpuGroups:
    """CPU per process group: ours by pid, the rest as bench.observe groups them."""

    def __init__(self, groups: dict[int, str], skip: list[int], database: str) -> None:
        self._groups = groups
        self._skip = skip
        self._database = database

    def snapshot(self) -> Snapshot:
        ticks = cpu_ticks(None, self._skip, self._database)
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


# --- waiting ----------------------------------------------------------------------------------


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


def wait_for_emails(
    sink: Sink,
    expected: set[str],
    timeout_s: float,
    every_second: Callable[[], None] | None = None,
) -> float | None:
    """Poll the sink until every expected payment has mail; the time it did (unix), or None."""
    deadline = time.monotonic() + timeout_s
    next_call = time.monotonic() + 1.0
    while True:
        sink.poll()
        if expected.issubset(sink.received.keys()):
            return time.time()
        if time.monotonic() > deadline:
            return None
        if every_second is not None and time.monotonic() >= next_call:
            every_second()
            next_call = time.monotonic() + 1.0
        time.sleep(0.02)


# --- one run ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    n: int
    summary: Summary
    accepted_at: dict[str, float]  # event id -> unix time of its 200 answer
    emailed_at: dict[str, float]  # payment id -> unix time its email reached the sink
    window_s: float  # CPU sampling window: load start -> last email seen
    cpu_pct: dict[str, float]  # % of one core over the window
    idle_pct: dict[str, float]  # the same with no load, before it
    peak_rss_mb: dict[str, float | None]
    handling_ms: dict[str, float | None]
    outcomes: dict[str, dict[str, int]]
    effects: Effects
    queues: dict[str, tuple[int, int]]
    dead_letter_queues: list[str]
    email_repeats: int
    commits: int  # PostgreSQL transactions in the bench database from the load to the end
    peak_depth: dict[str, int]  # most messages seen waiting in each work queue
    profile: str | None = None


def _worker_metrics(
    before: dict[str, float], after: dict[str, float], worker: str
) -> tuple[float | None, dict[str, int]]:
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


def run(args: argparse.Namespace) -> Result:
    run_id = f"bw{uuid.uuid4().hex[:6]}"
    secret = secrets.token_hex(16)
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    ports = {name: _free_port() for name in SERVICES}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("INGEST_", "XHUB_", "AMQP_", "SMTP_", "EMAIL_", "RETRY_", "BONUS"))
    }
    env.update(
        DATABASE_URL=args.database_url,
        AMQP_URL=args.amqp_url,
        AMQP_PREFIX=args.prefix,
        XHUB_WEBHOOK_SECRETS=secret,
        XHUB_TIMESTAMP_TOLERANCE="3600",
        EMAIL_FROM=EMAIL_FROM,
        LOG_LEVEL=args.log_level,
        PYTHONPATH=str(ROOT),
        **{PORT_VARIABLES[name]: str(port) for name, port in ports.items()},
    )
    sink = Sink(log_dir, env)
    env.update(SMTP_HOST="127.0.0.1", SMTP_PORT=str(sink.port))
    settings = Settings.from_env(env)  # the names the services will declare (retry tiers too)
    topology = build_topology(settings.amqp_prefix, settings.retry_delays_s)
    database = urlsplit(args.database_url).path.lstrip("/")

    warm = make_payments(run_id, "w", args.warmup)
    measured = make_payments(run_id, "m", args.n)
    asyncio.run(_reset(args.database_url, args.amqp_url, topology))
    started = time.monotonic()
    asyncio.run(_register(args.database_url, warm + measured))
    print(f"  {len(warm) + len(measured):,} orders registered in {time.monotonic() - started:.1f}s")
    warm_deliveries = make_deliveries(warm, secret.encode())
    deliveries = make_deliveries(measured, secret.encode())

    services = {name: Service(name, ports[name], env, log_dir) for name in SERVICES}
    clients: Clients | None = None
    profiler: Profiler | None = None
    try:
        sink.start()
        for service in services.values():
            service.start()
        deadline = time.monotonic() + 60
        pending = set(SERVICES)
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready in 60 s: {sorted(pending)}")
            pending = {name for name in pending if not services[name].ready()}
            time.sleep(0.2)
        work_queues = [topology.work_queue(q).name for q in WORKERS.values()]
        while any(c < 1 for _, c in asyncio.run(_consumers(args.amqp_url, work_queues)).values()):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers are not consuming their queues")
            time.sleep(0.2)
        pids = {name: s.pid for name, s in services.items()}
        print(f"  services up: {pids}, SMTP sink pid {sink.pid}")
        url = f"{services['ingest'].base_url}/webhooks/xhub"

        if warm_deliveries:
            tally = asyncio.run(_warm_up(url, warm_deliveries, args.concurrency))
            if tally.accepted != len(warm):
                raise RuntimeError(f"warm-up: {tally.accepted} accepted: {dict(tally.statuses)}")
            if wait_for_emails(sink, {p.payment_id for p in warm}, args.timeout) is None:
                raise RuntimeError("warm-up emails did not all arrive")
            print(f"  warm-up: {len(warm):,} payments through")

        wait_for_other_benchmarks(args.other_wait)
        wait_quiet(args.quiet_wait)
        groups = {pid: name for name, pid in pids.items()}
        groups.update({sink.pid: "sink", os.getpid(): "driver"})
        idle_cpu = CpuGroups(groups, [], database)
        idle_start = idle_cpu.snapshot()
        time.sleep(args.idle_seconds)  # what everything costs with no load, for reference
        idle_pct = idle_cpu.pct(idle_start, idle_cpu.snapshot())
        metrics_before = {n: scrape_labelled(services[n].base_url) for n in WORKERS}
        if args.profile:
            profiler = Profiler(pids[args.profile], args.profile, log_dir, args.profile_rate)
            profiler.start()
            time.sleep(0.5)  # attached before the load starts
        commits_before = asyncio.run(_commits(args.database_url))
        clients = Clients(
            url, deliveries, args.concurrency, args.rate, args.clients, args.max_seconds
        )
        clients.start()
        clients.wait_started()
        # Clients are counted from their own process time; the profiler is not counted.
        skip = [*clients.pids, *([profiler.process.pid] if profiler and profiler.process else [])]
        cpu = CpuGroups(groups, skip, database)
        cpu_before = cpu.snapshot()
        peak_depth: Counter[str] = Counter()

        def sample_depths() -> None:  # where the backlog waits: one AMQP round trip a second
            for name, (messages, _) in asyncio.run(_consumers(args.amqp_url, work_queues)).items():
                peak_depth[name] = max(peak_depth[name], messages)

        done_at = wait_for_emails(
            sink, {p.payment_id for p in measured}, args.timeout, sample_depths
        )
        cpu_after = cpu.snapshot()
        if profiler is not None:
            profiler.stop()
        results = clients.join()
        if done_at is None:
            print(f"  WARNING: not every email arrived within {args.timeout:.0f}s")
        metrics_after = {n: scrape_labelled(services[n].base_url) for n in WORKERS}

        # Bonuses run beside email: give the ledger a moment to catch up before checking.
        deadline = time.monotonic() + 30
        while (effects := asyncio.run(_effects(args.database_url, f"pay_{run_id}_m"))).grants < len(
            measured
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
        queue_names = [
            *work_queues,
            *(topology.work_queue(q).dlq for q in WORKERS.values()),
            topology.unrouted,
        ]
        queues = asyncio.run(_consumers(args.amqp_url, queue_names))
        peak = {name: peak_rss_mb(pid) for name, pid in pids.items()}
        peak["sink"] = peak_rss_mb(sink.pid)
    finally:
        if profiler is not None:
            profiler.stop()
        if clients is not None:
            clients.stop()
        for service in services.values():  # SIGTERM them all, then wait for each
            if service.process is not None and service.process.poll() is None:
                service.process.send_signal(signal.SIGTERM)
        for service in services.values():
            service.stop()
        sink.stop()
        with contextlib.suppress(Exception):
            asyncio.run(_reset_queues(args.amqp_url, topology))

    # An idle backend may hold its statistics up to 10 s; one that exits flushes them at once.
    time.sleep(0.5)
    commits = asyncio.run(_commits(args.database_url)) - commits_before

    window_s = cpu_after[0] - cpu_before[0]
    cpu_pct = CpuGroups.pct(cpu_before, cpu_after)
    summary = summarize([tally for tally, _ in results])
    cpu_pct["clients"] = 100 * summary.client_cpu_s / window_s

    handling: dict[str, float | None] = {}
    outcomes: dict[str, dict[str, int]] = {}
    for name in WORKERS:
        handling[name], outcomes[name] = _worker_metrics(
            metrics_before[name], metrics_after[name], name
        )
    accepted_at: dict[str, float] = {}
    for _, stamps in results:
        accepted_at.update(stamps)
    measured_ids = {p.payment_id for p in measured}
    return Result(
        n=len(measured),
        summary=summary,
        accepted_at=accepted_at,
        emailed_at={k: v for k, v in sink.received.items() if k in measured_ids},
        window_s=window_s,
        cpu_pct=cpu_pct,
        idle_pct=idle_pct,
        peak_rss_mb=peak,
        handling_ms=handling,
        outcomes=outcomes,
        effects=effects,
        queues=queues,
        dead_letter_queues=[
            *(topology.work_queue(q).dlq for q in WORKERS.values()),
            topology.unrouted,
        ],
        email_repeats=sum(sink.repeats.values()),
        commits=commits,
        peak_depth=dict(peak_depth),
        profile=profiler.summary() if profiler is not None else None,
    )


async def _reset_queues(amqp_url: str, topology: Topology) -> None:
    connection = await aio_pika.connect(amqp_url, timeout=5)
    async with connection:
        await delete(await connection.channel(), topology)


# --- output -----------------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def report(r: Result, args: argparse.Namespace) -> bool:
    """Print the figures and the checks; True when every check passed."""
    latencies: list[float] = []
    for payment_id, emailed in r.emailed_at.items():
        accepted = r.accepted_at.get(f"evt_{payment_id}")
        if accepted is not None:
            latencies.append((emailed - accepted) * 1000)
    latencies.sort()
    first_accept = min(r.accepted_at.values(), default=float("nan"))
    last_email = max(r.emailed_at.values(), default=float("nan"))
    span_s = last_email - first_accept
    per_s = len(r.emailed_at) / span_s if span_s > 0 else float("nan")
    e = r.effects
    s = r.summary

    def row(label: str, value: str) -> None:
        print(f"{label:<40}{value}")

    print()
    row("payments fully processed/s", f"{per_s:,.0f}  (N / (last email - first accept))")
    row("  N, span s", f"{len(r.emailed_at):,} in {span_s:.2f}")
    if e.last_grant_at is not None and e.grants == r.n:
        last = max(last_email, e.last_grant_at)
        row("  with bonus grants too", f"{r.n / (last - first_accept):,.0f}/s")
    row(
        "end-to-end ms (accept -> email)",
        f"p50 {_quantile(latencies, 0.5):,.0f}  p99 {_quantile(latencies, 0.99):,.0f}"
        f"  max {latencies[-1] if latencies else float('nan'):,.0f}"
        f"  min {latencies[0] if latencies else float('nan'):,.0f}",
    )
    row("ingest accepted/s", f"{s.accepted_per_s:,.0f}  ({s.accepted:,} in {s.elapsed_s:.2f}s)")
    row("ingest answer ms", f"p50 {s.p50_ms:.1f}  p99 {s.p99_ms:.1f}  max {s.max_ms:.1f}")
    for name in WORKERS:
        mean = r.handling_ms[name]
        outcomes = ", ".join(f"{k} {v:,}" for k, v in sorted(r.outcomes[name].items()))
        row(f"{name} worker", f"{'-' if mean is None else f'{mean:.1f}'} ms/message; {outcomes}")
    row("peak work queue depth", "  ".join(f"{q} {n:,}" for q, n in r.peak_depth.items()))
    cores = os.cpu_count() or 1
    groups = ["ingest", "orders", "bonuses", "email", "postgres", "rabbitmq", "sink", "clients"]
    groups += ["driver", "other"]
    row(
        f"CPU % of a core (all {r.cpu_pct.get('all', 0):.0f} / {100 * cores})",
        "  ".join(f"{g} {r.cpu_pct.get(g, 0):.0f}" for g in groups),
    )
    attributed = sum(r.cpu_pct.get(g, 0) for g in groups)
    row("  unattributed (kernel, gone)", f"{r.cpu_pct.get('all', 0) - attributed:.0f}")
    row(
        f"  with no load (all {r.idle_pct.get('all', 0):.0f})",
        "  ".join(f"{g} {r.idle_pct.get(g, 0):.0f}" for g in groups if g != "clients"),
    )
    known = [g for g in groups[:7] if g in r.cpu_pct]
    us = {g: r.cpu_pct[g] * 10_000 * r.window_s / max(1, r.n) for g in known}
    row("CPU us per payment", "  ".join(f"{g} {v:,.0f}" for g, v in us.items()))
    total_us = max(1.0, sum(us.values()))
    row("  total", f"{total_us:,.0f} us: at most {cores * 1e6 / total_us:,.0f}/s on {cores} cores")
    row("PostgreSQL commits per payment", f"{r.commits / r.n:.1f}  ({r.commits:,})")
    row(
        "peak RSS MB",
        "  ".join(f"{k} {'-' if v is None else f'{v:.0f}'}" for k, v in r.peak_rss_mb.items()),
    )

    checks = [
        ("webhooks accepted == N", s.accepted, r.n),
        ("orders PAID == N", e.paid_orders, r.n),
        ("bonus grants == N", e.grants, r.n),
        ("bonus points == N * BONUS_POINTS", e.grant_points, r.n * args.bonus_points),
        ("emails_sent rows == N", e.emails_sent, r.n),
        ("emails received by the sink == N", len(r.emailed_at), r.n),
        ("emails received twice == 0", r.email_repeats, 0),
    ]
    for name in r.dead_letter_queues:
        checks.append((f"{name} depth == 0", r.queues[name][0], 0))
    ok = True
    print()
    for label, got, want in checks:
        good = got == want
        ok &= good
        row(f"check {label}", f"{got:,}  {'ok' if good else 'WRONG, expected ' + f'{want:,}'}")
    left = {q: m for q, (m, _) in r.queues.items() if q not in r.dead_letter_queues and m}
    if left:
        print(f"  note: messages still in work queues: {left}")
    if s.errors:
        print(f"  non-200 answers: {s.statuses}")
    foreign = r.cpu_pct.get("other", 0) + r.cpu_pct.get("all", 0) - attributed
    if foreign > DISTURBED_PCT:
        print(
            f"WARNING: other processes (some gone by the end) took {foreign:.0f}% of a core:"
            " figures are low, run again on a quiet machine"
        )
    met = per_s >= TARGET_PER_S and ok
    print()
    print(
        f"target (>= {TARGET_PER_S:,.0f} payments/s, correct): {'MET' if met else 'NOT MET'}"
        f"  - {per_s:,.0f} payments/s, checks {'passed' if ok else 'FAILED'}"
    )
    if r.profile:
        print(f"\npy-spy profile of {args.profile} over the measured phase:\n{r.profile}")
    return ok


# --- command line -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=10_000, help="measured payments (default 10000)")
    p.add_argument("--concurrency", "-c", type=int, default=64, help="open connections")
    p.add_argument("--warmup", type=int, default=500, help="payments sent through first")
    p.add_argument(
        "--rate", type=float, default=0.0, help="offered webhooks/s (default 0: unlimited)"
    )
    p.add_argument("--clients", type=int, default=CLIENT_PROCESSES, help="client processes")
    p.add_argument("--max-seconds", type=float, default=300.0, help="time cap on the load")
    p.add_argument(
        "--timeout",
        type=float,
        help="wait this long for the emails (default 120 s + 20 ms per payment)",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=120.0,
        help="wait up to this long for the (shared) machine to be idle before measuring",
    )
    p.add_argument(
        "--other-wait",
        type=float,
        default=1800.0,
        help="wait up to this long for a running bench.ingest to end",
    )
    p.add_argument(
        "--idle-seconds", type=float, default=3.0, help="CPU sample with no load, for reference"
    )
    p.add_argument("--database-url", default=BENCH_DATABASE_URL)
    p.add_argument("--amqp-url", default=os.environ.get("AMQP_URL", DEFAULT_AMQP_URL))
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="AMQP prefix (its queues are deleted)")
    p.add_argument(
        "--log-dir",
        default=os.path.join(tempfile.gettempdir(), "payhooks-bench-workers"),
        help="service, sink and profile files",
    )
    p.add_argument("--log-level", default="WARNING", help="LOG_LEVEL of the services")
    p.add_argument("--profile", choices=SERVICES, help="py-spy this service while measuring")
    p.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second")
    args = p.parse_args(argv)
    if args.n < 1 or args.warmup < 0 or args.concurrency < args.clients or args.rate < 0:
        p.error("need --n >= 1, --warmup >= 0, --rate >= 0 and --concurrency >= --clients")
    if not args.prefix:
        p.error("need a non-empty --prefix (its queues are deleted)")
    args.timeout = args.timeout or 120 + args.n / 50
    args.bonus_points = Settings.from_env({}).bonus_points
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rate = f"{args.rate:,.0f}/s" if args.rate else "unlimited"
    print(
        f"n={args.n:,} concurrency={args.concurrency} warmup={args.warmup} rate={rate}"
        f" client processes={args.clients} logs in {args.log_dir}",
        flush=True,
    )
    wait_for_other_benchmarks(args.other_wait)
    _migrate(args.database_url)
    result = run(args)
    return 0 if report(result, args) else 1


if __name__ == "__main__":
    sys.exit(main())
