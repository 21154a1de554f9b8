"""Inbox retention with an archive (docs/retention.md): a day past RETENTION_DAYS is written to
a checksummed archive, read back, recorded and only then dropped; its events stay duplicates
while the provider may retry them, and `payhooks archive` gives them back byte for byte."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from services.ingest.app import create_app
from services.reconciler.jobs import housekeeping_once
from shared.amqp.broker import BROKER
from shared.amqp.topology import Topology
from shared.config import Settings
from shared.db import create_pool
from shared.metrics import ReconcilerMetrics
from shared.migrate import load_migrations
from shared.ops.archive import UNRECORDED_KEPT_S, ArchivesUnreachableError, day_range
from shared.ops.archive_files import event_of, lines
from shared.ops.erasure import MARKER, parse_selector
from shared.ops.operator_actions import Edge, Operator, erase_recorded
from shared.queries import partitions as partitions_sql
from tests.conftest import TEST_SECRETS
from tests.helpers import delivery, drain, payment_event
from tests.integration.inbox_events import store_events
from tests.integration.test_cli_operators import PAYHOOKS, REPO, cli_env, run_payhooks
from tests.integration.test_migrate import FreshDsn, fresh_dsn  # noqa: F401 (a fixture)

AGE = dt.timedelta(days=40)  # past the 35 days of retention
# Not UTF-8, CRLF, trailing spaces: what only a byte-exact archive gives back.
RAW_BODY = b'{"event":"payment.status_changed","payment_id":"pay_arch","note":"\xff\xfe"}\r\n  '


async def housekeeping(
    settings: Settings, archive_dir: Path | None, metrics: ReconcilerMetrics | None = None
) -> dict[str, int]:
    pool = await create_pool(settings.database_url)
    metrics = metrics or ReconcilerMetrics.create(CollectorRegistry())
    try:
        return await housekeeping_once(
            pool, retention_days=35, archive_dir=archive_dir, metrics=metrics
        )
    finally:
        await pool.close()


async def received_long_ago(db: Any, event_ids: list[str]) -> None:
    """Move the events' rows (and keys) to AGE ago: into the default partition, which the
    housekeeping's partitions ahead then move into their own day's."""
    at = dt.datetime.now(dt.UTC) - AGE
    await db.execute("UPDATE inbox SET received_at = $2 WHERE event_id = ANY($1)", event_ids, at)
    await db.execute(
        "UPDATE inbox_keys SET received_at = $2 WHERE event_id = ANY($1)", event_ids, at
    )


async def payhooks_bytes(env: dict[str, str], *args: str) -> tuple[int, bytes, str]:
    process = await asyncio.create_subprocess_exec(
        str(PAYHOOKS),
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out, err.decode()


async def test_an_archived_day_is_dropped_and_archive_show_gives_the_raw_event_back(
    settings: Settings, db: Any, tmp_path: Path
) -> None:
    [old] = await store_events(db, body=RAW_BODY, payment_id="pay_arch")
    [recent] = await store_events(db)
    await received_long_ago(db, [old])

    deleted = await housekeeping(settings, tmp_path)

    assert deleted["inbox"] == 1
    assert [r["event_id"] for r in await db.fetch("SELECT event_id FROM inbox")] == [recent]
    [record] = await db.fetch("SELECT * FROM inbox_archives")
    assert record["rows"] == 1
    # The file, and no temporary one left.
    assert await asyncio.to_thread(os.listdir, tmp_path) == [record["file_name"]]
    env = cli_env(settings, ARCHIVE_DIR=str(tmp_path))
    code, out, err = await payhooks_bytes(env, "archive", "show", old, "--raw")
    assert (code, err) == (0, "")
    assert out == RAW_BODY
    shown = await run_payhooks(env, "archive", "show", old, "--provider", "xhub", "--json")
    assert shown.code == 0, shown
    assert shown.json()["payment_id"] == "pay_arch"
    assert shown.json()["headers"]["X-Webhook-Id"] == old
    listed = await run_payhooks(env, "archive", "list", "--json")
    assert listed.code == 0, listed
    [entry] = listed.json()["archives"]
    assert (entry["file"], entry["rows"], entry["ok"]) == (record["file_name"], 1, True)
    missing = await run_payhooks(env, "archive", "show", recent)
    assert missing.code == 1


@pytest.fixture
async def ingest(aiohttp_client: Any, settings: Settings, amqp: Any) -> TestClient:
    app = create_app(settings, sweep_interval_s=0.2)
    client: TestClient = await aiohttp_client(app)
    await app[BROKER].wait_connected(10)
    return client


async def test_a_retry_of_an_archived_event_within_the_retry_horizon_is_a_duplicate(
    ingest: TestClient, settings: Settings, db: Any, amqp: Any, topology: Topology, tmp_path: Path
) -> None:
    body, headers = delivery(payment_event(), TEST_SECRETS[0], event_id="evt_archived_retry")
    first = await ingest.post("/webhooks/xhub", data=body, headers=headers)
    assert await first.json() == {"status": "accepted"}
    assert len(await drain(amqp, topology.work["orders"].name)) == 1
    await received_long_ago(db, ["evt_archived_retry"])
    assert (await housekeeping(settings, tmp_path))["inbox"] == 1
    assert await db.fetchval("SELECT count(*) FROM inbox") == 0

    # X-Hub retries for up to 30 days after the delivery's creation; its key is kept longer.
    again = await ingest.post("/webhooks/xhub", data=body, headers=headers)

    assert again.status == 200
    assert await again.json() == {"status": "duplicate"}
    assert await drain(amqp, topology.work["orders"].name) == []
    assert await db.fetchval("SELECT count(*) FROM inbox") == 0


async def test_a_corrupted_archive_is_reported_by_list_and_show(
    settings: Settings, db: Any, tmp_path: Path
) -> None:
    [old] = await store_events(db)
    await received_long_ago(db, [old])
    await housekeeping(settings, tmp_path)
    file_name = await db.fetchval("SELECT file_name FROM inbox_archives")
    path = tmp_path / file_name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    env = cli_env(settings, ARCHIVE_DIR=str(tmp_path))

    listed = await run_payhooks(env, "archive", "list")
    shown = await run_payhooks(env, "archive", "show", old)

    assert listed.code == 1, listed
    assert "BAD" in listed.out
    assert "sha256" in listed.err
    assert shown.code == 1, shown
    assert file_name in shown.err
    assert shown.out == ""


async def test_without_an_archive_directory_nothing_is_expired(settings: Settings, db: Any) -> None:
    [old] = await store_events(db)
    await received_long_ago(db, [old])

    with capture_logs() as logs:
        deleted = await housekeeping(settings, None)

    assert deleted["inbox"] == 0
    assert await db.fetchval("SELECT count(*) FROM inbox") == 1
    assert any(e["event"] == "inbox.expiry_refused" for e in logs)


async def test_a_day_with_a_row_never_published_is_not_archived(
    settings: Settings, db: Any, tmp_path: Path
) -> None:
    [old] = await store_events(db, published=False)
    await received_long_ago(db, [old])
    await db.execute("UPDATE inbox_unpublished SET received_at = now() - interval '40 days'")
    registry = CollectorRegistry()

    deleted = await housekeeping(settings, tmp_path, ReconcilerMetrics.create(registry))

    assert deleted["inbox"] == 0
    assert expiries(registry)["postponed"] == 1
    assert await db.fetchval("SELECT count(*) FROM inbox") == 1
    assert await db.fetchval("SELECT count(*) FROM inbox_archives") == 0


async def test_the_migration_moves_an_existing_inbox_into_partitions_and_keys(
    fresh_dsn: FreshDsn,  # noqa: F811 (the fixture imported above)
) -> None:
    dsn = await fresh_dsn()
    conn = await asyncpg.connect(dsn)
    try:
        for migration in load_migrations():
            if migration.version < 21:
                await conn.execute(migration.sql)
        await conn.execute(
            "INSERT INTO inbox (provider, event_id, event_type, body, headers, received_at,"
            " duplicates) SELECT 'xhub', 'evt_' || g, 'payment.status_changed', '\\x00ff',"
            " '{}', now() - make_interval(days => g), g FROM generate_series(0, 9) g"
        )
        before = await conn.fetch("SELECT * FROM inbox ORDER BY id")
        [partitioning] = [m for m in load_migrations() if m.version == 21]
        await conn.execute(partitioning.sql)

        after = await conn.fetch("SELECT * FROM inbox ORDER BY id")
        keys = await conn.fetch("SELECT * FROM inbox_keys ORDER BY id")
        default_rows = await conn.fetchval("SELECT count(*) FROM inbox_default")
        new_id = await conn.fetchval(
            "INSERT INTO inbox (provider, event_id, event_type, body, headers)"
            " VALUES ('xhub', 'evt_new', 't', '', '{}') RETURNING id"
        )
    finally:
        await conn.close()

    # The row's columns as they were; its copies counted on its key now.
    assert [dict(r) for r in after] == [
        {k: v for k, v in r.items() if k not in ("duplicates", "last_seen_at")} for r in before
    ]
    columns = ("event_id", "id", "received_at", "duplicates", "last_seen_at")
    assert [[k[c] for c in columns] for k in keys] == [[r[c] for c in columns] for r in before]
    assert default_rows == 0  # each day in a partition of its own
    assert new_id == before[-1]["id"] + 1  # the id sequence goes on


async def test_an_erasure_rewrites_the_archives_holding_the_address(
    settings: Settings, db: Any, tmp_path: Path
) -> None:
    address = "Jane.Doe@Example.com"
    body = b'{"event":"payment.status_changed","customer":{"email":"jane.doe@example.COM"}}'
    [held] = await store_events(db, body=body, payment_id="pay_erase")
    [other] = await store_events(db)
    await received_long_ago(db, [held, other])
    await housekeeping(settings, tmp_path)
    [before] = await db.fetch("SELECT * FROM inbox_archives")
    selector = parse_selector(address, None, None)
    by = Operator("tester", Edge.CLI)

    erased = await erase_recorded(db, selector, by, tmp_path)
    again = await erase_recorded(db, selector, by, tmp_path)

    assert erased.rows["inbox_archives"] == 1
    assert again.rows["inbox_archives"] == 0  # idempotent: nothing left, no new file
    [after] = await db.fetch("SELECT * FROM inbox_archives")
    assert after["file_name"] != before["file_name"]
    assert after["sha256"] != before["sha256"]
    assert after["rewritten_at"] is not None
    assert await asyncio.to_thread(os.listdir, tmp_path) == [after["file_name"]]
    content = await asyncio.to_thread(_decompressed, tmp_path / after["file_name"])
    assert b"example.com" not in content.lower()
    env = cli_env(settings, ARCHIVE_DIR=str(tmp_path))
    listed = await run_payhooks(env, "archive", "list", "--json")
    assert [a["ok"] for a in listed.json()["archives"]] == [True]
    code, out, _ = await payhooks_bytes(env, "archive", "show", held, "--raw")
    assert (code, out) == (0, body.replace(b"jane.doe@example.COM", MARKER.encode()))
    code, out, _ = await payhooks_bytes(env, "archive", "show", other, "--raw")
    assert code == 0  # the other event of the day, as it was
    audit = await db.fetchval(
        "SELECT filter FROM operator_actions WHERE action = 'person.erase' ORDER BY id LIMIT 1"
    )
    assert audit["rows"]["inbox_archives"] == 1


def _decompressed(path: Path) -> bytes:
    """Every line as it is and with its body decoded (base64 would hide the address)."""
    events = [event_of(line) for line in lines(path)]
    return b"".join(lines(path)) + b"".join(e["body"] + orjson.dumps(e["headers"]) for e in events)


async def test_an_erasure_that_cannot_reach_the_archives_erases_nothing(
    settings: Settings, db: Any, tmp_path: Path
) -> None:
    body = b'{"customer":{"email":"gone@example.com"}}'
    [archived] = await store_events(db, body=body)
    await received_long_ago(db, [archived])
    await housekeeping(settings, tmp_path)
    [live] = await store_events(db, body=body)  # a recent event with the address
    selector = parse_selector("gone@example.com", None, None)

    with pytest.raises(ArchivesUnreachableError):
        await erase_recorded(db, selector, Operator("tester", Edge.CLI), None)
    (tmp_path / await db.fetchval("SELECT file_name FROM inbox_archives")).write_bytes(b"")
    refused = await run_payhooks(
        cli_env(settings, ARCHIVE_DIR=str(tmp_path)), "erase", "--email", "gone@example.com"
    )

    assert refused.code == 1, refused  # the archive is corrupt: nothing erased
    assert "nothing erased" in refused.err
    assert await db.fetchval("SELECT body FROM inbox WHERE event_id = $1", live) == body
    assert await db.fetchval("SELECT count(*) FROM operator_actions") == 0


async def test_files_no_archive_records_are_removed_once_an_hour_old(
    settings: Settings, db: Any, tmp_path: Path
) -> None:
    """A file an erasure replaced and a crash left behind still holds the address."""
    [old] = await store_events(db)
    await received_long_ago(db, [old])
    await housekeeping(settings, tmp_path)
    recorded = await db.fetchval("SELECT file_name FROM inbox_archives")
    stale, fresh = tmp_path / "inbox-20200101-0123456789ab.jsonl.gz", tmp_path / ".inbox-x.tmp"
    stale.write_bytes(b"replaced")
    fresh.write_bytes(b"being written")
    an_hour_ago = time.time() - UNRECORDED_KEPT_S - 60
    os.utime(stale, (an_hour_ago, an_hour_ago))

    await housekeeping(settings, tmp_path)

    assert sorted(await asyncio.to_thread(os.listdir, tmp_path)) == sorted([recorded, fresh.name])


async def test_two_reconcilers_archive_a_day_once(
    settings: Settings, db: Any, tmp_path: Path
) -> None:
    [old] = await store_events(db)
    await received_long_ago(db, [old])

    both = await asyncio.gather(housekeeping(settings, tmp_path), housekeeping(settings, tmp_path))

    assert sorted(d["inbox"] for d in both) == [0, 1]
    assert await db.fetchval("SELECT count(*) FROM inbox_archives") == 1
    assert len(await asyncio.to_thread(os.listdir, tmp_path)) == 1


async def test_an_archive_that_cannot_be_written_keeps_the_day_and_the_rest_goes_on(
    settings: Settings, db: Any, tmp_path: Path
) -> None:
    [old] = await store_events(db)
    await received_long_ago(db, [old])
    not_a_directory = tmp_path / "file"
    not_a_directory.write_bytes(b"")
    await db.execute(
        "INSERT INTO processed_events (worker, event_id, outcome, processed_at)"
        " VALUES ('orders', 'old', 'ok', now() - interval '40 days')"
    )

    registry = CollectorRegistry()

    with capture_logs() as logs:
        deleted = await housekeeping(settings, not_a_directory, ReconcilerMetrics.create(registry))

    assert (deleted["inbox"], deleted["processed_events"]) == (0, 1)
    assert expiries(registry) == {"archived": 0, "refused": 0, "failed": 1, "postponed": 0}
    assert await db.fetchval("SELECT count(*) FROM inbox") == 1
    assert [e["log_level"] for e in logs if e["event"] == "inbox.expiry_failed"] == ["error"]


async def test_a_drop_waiting_behind_a_reader_gives_up_and_the_next_pass_archives(
    settings: Settings, db: Any, tmp_path: Path
) -> None:
    [old] = await store_events(db)
    await received_long_ago(db, [old])
    await housekeeping(settings, None)  # its partition made
    reader = await asyncpg.connect(settings.database_url)
    try:
        transaction = reader.transaction()
        await transaction.start()
        await reader.fetchval("SELECT count(*) FROM inbox")  # holds a lock the drop waits for

        registry = CollectorRegistry()
        with capture_logs() as logs:
            first = await housekeeping(settings, tmp_path, ReconcilerMetrics.create(registry))
        await transaction.rollback()
    finally:
        await reader.close()
    second = await housekeeping(settings, tmp_path)

    assert first["inbox"] == 0
    assert any(e.get("reason") == "lock_timeout" for e in logs)
    assert (expiries(registry)["postponed"] or 0) >= 1  # earlier tests' empty days wait too
    assert second["inbox"] == 1
    recorded = await db.fetchval("SELECT file_name FROM inbox_archives")
    assert await asyncio.to_thread(os.listdir, tmp_path) == [recorded]


async def test_the_oldest_day_held_is_measured_until_its_archive_and_drop(
    settings: Settings, db: Any, tmp_path: Path
) -> None:
    """What PayhooksInboxRetentionBehind alerts on: without ARCHIVE_DIR a day past the
    retention stays, and its age with it; archived, the age falls back within a day of it."""
    await housekeeping(settings, tmp_path)  # earlier tests' empty days past the retention
    [old] = await store_events(db)
    await received_long_ago(db, [old])
    day = (dt.datetime.now(dt.UTC) - AGE).date()
    # Before a pass, the row waits in the default partition: its day is held all the same.
    assert await partitions_sql.oldest_day(db) == day
    registry = CollectorRegistry()
    metrics = ReconcilerMetrics.create(registry)

    def gauge(name: str) -> float:
        value = registry.get_sample_value(name)
        assert value is not None, name
        return value

    with capture_logs() as logs:
        await housekeeping(settings, None, metrics)
    held_s = gauge("payhooks_inbox_oldest_day_age_seconds")
    expected_s = (dt.datetime.now(dt.UTC) - day_range(day)[0]).total_seconds()
    assert any(e["event"] == "inbox.expiry_refused" for e in logs)
    assert gauge("payhooks_inbox_retention_seconds") == 35 * 86_400
    assert expected_s - 60 < held_s <= expected_s
    assert expiries(registry) == {"archived": 0, "refused": 1, "failed": 0, "postponed": 0}

    await housekeeping(settings, tmp_path, metrics)

    assert await db.fetchval("SELECT count(*) FROM inbox_archives") >= 1
    assert 0 < gauge("payhooks_inbox_oldest_day_age_seconds") < 36 * 86_400
    assert expiries(registry) == {"archived": 1, "refused": 1, "failed": 0, "postponed": 0}


def expiries(registry: CollectorRegistry) -> dict[str, float | None]:
    return {
        outcome: registry.get_sample_value("payhooks_inbox_expiry_total", {"outcome": outcome})
        for outcome in ("archived", "refused", "failed", "postponed")
    }
