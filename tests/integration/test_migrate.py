"""`payhooks migrate` against throwaway databases: idempotent and safe to run concurrently;
`--status`, and checksums that stop a migrate when an applied file changed."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from prometheus_client import CollectorRegistry

from shared import migrate as migrations
from shared.db import pool_ctx
from shared.migrate import MigrationChangedError, load_migrations, migrate, run_migrations
from shared.process.web import base_app
from tests.conftest import database_url, run_database_name

REPO = Path(__file__).resolve().parents[2]
PAYHOOKS = Path(sys.executable).parent / "payhooks"
MIGRATIONS = [m.name for m in load_migrations()]

Snapshot = dict[str, list[tuple[Any, ...]]]


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(database_url("postgres"))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


FreshDsn = Callable[..., Awaitable[str]]


@pytest.fixture
async def fresh_dsn(migrated_database: str) -> AsyncIterator[FreshDsn]:
    """Make DSNs of throwaway databases (created or not); every one is dropped at teardown.

    `migrated_database` is only asked for its check that PostgreSQL is reachable.
    """
    names: list[str] = []

    async def make(*, create: bool = True) -> str:
        name = run_database_name(f"migrate_{uuid.uuid4().hex[:12]}")
        names.append(name)
        if create:
            await _admin(f'CREATE DATABASE "{name}"')
        return database_url(name)

    yield make
    for name in names:
        await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def snapshot(dsn: str) -> Snapshot:
    """The public schema as comparable rows: columns, indexes, constraints, applied versions."""
    conn = await asyncpg.connect(dsn)
    try:
        columns = await conn.fetch(
            """SELECT table_name, column_name, data_type, is_nullable, column_default
               FROM information_schema.columns WHERE table_schema = 'public'
               ORDER BY table_name, column_name"""
        )
        indexes = await conn.fetch(
            """SELECT tablename, indexname, indexdef FROM pg_indexes
               WHERE schemaname = 'public' ORDER BY tablename, indexname"""
        )
        constraints = await conn.fetch(
            """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
               FROM pg_constraint WHERE connamespace = 'public'::regnamespace
               ORDER BY 1, 2"""
        )
        versions = await conn.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
    finally:
        await conn.close()
    return {
        "columns": [tuple(r) for r in columns],
        "indexes": [tuple(r) for r in indexes],
        "constraints": [tuple(r) for r in constraints],
        "schema_migrations": [tuple(r) for r in versions],
    }


@pytest.fixture
async def reference(fresh_dsn: FreshDsn) -> Snapshot:
    """The schema one plain migrate produces on an empty database."""
    dsn = await fresh_dsn()
    await migrate(dsn)
    return await snapshot(dsn)


def test_there_is_at_least_one_migration_and_versions_are_unique() -> None:
    versions = [m.version for m in load_migrations()]

    assert MIGRATIONS
    assert versions == sorted(set(versions))


async def test_reference_schema_has_the_inbox_and_its_dedup_key(reference: Snapshot) -> None:
    tables = {row[0] for row in reference["columns"]}

    assert {"inbox", "inbox_keys", "schema_migrations"} <= tables
    # The dedup key: the inbox is partitioned by day, its keys in a table of their own (021).
    assert any(row[1] == "inbox_keys_pkey" for row in reference["constraints"])
    assert reference["schema_migrations"] == [(m.version, m.name) for m in load_migrations()]


async def test_second_migrate_applies_nothing_and_changes_nothing(
    fresh_dsn: FreshDsn, reference: Snapshot
) -> None:
    dsn = await fresh_dsn()

    first = await migrate(dsn)
    after_first = await snapshot(dsn)
    second = await migrate(dsn)

    assert first == MIGRATIONS
    assert second == []
    assert await snapshot(dsn) == after_first == reference


async def test_five_concurrent_migrates_apply_each_migration_once(
    fresh_dsn: FreshDsn, reference: Snapshot
) -> None:
    dsn = await fresh_dsn()

    results = await asyncio.gather(*(migrate(dsn) for _ in range(5)))

    applied = sorted(name for result in results for name in result)
    assert applied == sorted(MIGRATIONS)
    assert await snapshot(dsn) == reference


async def test_concurrent_migrates_create_a_missing_database_once(
    fresh_dsn: FreshDsn, reference: Snapshot
) -> None:
    dsn = await fresh_dsn(create=False)

    results = await asyncio.gather(*(migrate(dsn) for _ in range(5)))

    assert sorted(name for result in results for name in result) == sorted(MIGRATIONS)
    assert await snapshot(dsn) == reference


async def run_migrate_command(dsn: str, *args: str) -> tuple[int, str, str]:
    env = {"PATH": os.environ.get("PATH", ""), "DATABASE_URL": dsn, "LOG_LEVEL": "WARNING"}
    process = await asyncio.create_subprocess_exec(
        str(PAYHOOKS),
        "migrate",
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_three_concurrent_migrate_commands_succeed(
    fresh_dsn: FreshDsn, reference: Snapshot
) -> None:
    dsn = await fresh_dsn()

    results = await asyncio.gather(*(run_migrate_command(dsn) for _ in range(3)))

    assert [code for code, _, _ in results] == [0, 0, 0], results
    assert sorted(out for _, out, _ in results) == sorted(
        [f"migrations applied: {', '.join(MIGRATIONS)}\n"]
        + ["migrations applied: none (schema is current)\n"] * 2
    )
    assert await snapshot(dsn) == reference


async def test_a_service_is_not_ready_until_its_schema_is_migrated(
    fresh_dsn: FreshDsn, aiohttp_client: Any
) -> None:
    """/readyz holds traffic back from a pod that started before its migrate job finished
    (first install, or an upgrade that brings a new migration)."""
    dsn = await fresh_dsn()
    app = base_app(CollectorRegistry())
    app.cleanup_ctx.append(pool_ctx(dsn))
    client = await aiohttp_client(app)

    empty = await client.get("/readyz")
    assert empty.status == 503
    assert (await empty.json())["failing"] == ["schema"]

    await migrate(dsn)
    newest = max(m.version for m in load_migrations())
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "DELETE FROM schema_migrations WHERE version = $1 RETURNING *", newest
        )
        behind = await client.get("/readyz")  # as if one migration behind the code
        assert behind.status == 503
        await conn.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            newest,
            row["name"],  # type: ignore[index]
        )
    finally:
        await conn.close()

    ready = await client.get("/readyz")
    assert ready.status == 200


async def test_one_story_migration_ties_the_old_ledger_rows_to_their_transitions(
    fresh_dsn: FreshDsn,
) -> None:
    """A database written under the old (payment, kind) ledger: 007 ties each row to the
    transition the new rule gives it, so the bonus worker's replay adds only what is missing
    (here the second clawback of refund -> reversal -> refund, which the old key had no room
    for)."""
    dsn = await fresh_dsn()
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for m in load_migrations():
            if m.version < 7:
                await conn.execute(m.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    m.version,
                    m.name,
                )
        await conn.execute(
            "INSERT INTO order_transitions (payment_id, from_status, to_status, event_id) VALUES"
            " ('p', 'PENDING', 'PAID', 'e1'), ('p', 'PAID', 'REFUNDED', 'e2'),"
            " ('p', 'REFUNDED', 'PAID', 'e3'), ('p', 'PAID', 'REFUNDED', 'e4'),"
            " ('q', 'PENDING', 'SETTLED', 'e5')"
        )
        await conn.execute(
            "INSERT INTO bonus_ledger (payment_id, user_id, kind, points, event_id) VALUES"
            " ('p', 'u', 'grant', 500, 'm1'), ('p', 'u', 'clawback', -500, 'm2'),"
            " ('p', 'u', 'restore', 500, 'm3'), ('q', 'u', 'grant', 500, 'm5')"
        )
        assert [m.split("_", 1)[0] for m in await migrate(dsn)] == [
            m.split("_", 1)[0] for m in MIGRATIONS if int(m.split("_", 1)[0]) >= 7
        ]
        rows = await conn.fetch(
            "SELECT b.payment_id, b.kind, t.event_id FROM bonus_ledger b"
            " JOIN order_transitions t ON t.id = b.transition_id ORDER BY b.id"
        )
        assert [tuple(r) for r in rows] == [
            ("p", "grant", "e1"),
            ("p", "clawback", "e2"),
            ("p", "restore", "e3"),
            ("q", "grant", "e5"),
        ]
        with pytest.raises(asyncpg.UniqueViolationError):  # one grant per payment, still
            await conn.execute(
                "INSERT INTO bonus_ledger (payment_id, user_id, kind, points, event_id,"
                " transition_id) SELECT 'p', 'u', 'grant', 500, 'mx', id FROM order_transitions"
                " WHERE event_id = 'e4'"
            )
    finally:
        await conn.close()


# --- checksums and --status -------------------------------------------------------------------


async def fetch(dsn: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def migrated_as_before_checksums(dsn: str) -> None:
    """Every migration applied by a payhooks that kept no checksums (its table had none)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for m in load_migrations():
            await conn.execute(m.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name
            )
    finally:
        await conn.close()


async def file_changed_after_applied(dsn: str, version: int) -> None:
    """As if migration `version`'s file had been edited since: its recorded sha256 differs."""
    await fetch(
        dsn, "UPDATE schema_migrations SET checksum = $2 WHERE version = $1", version, "0" * 64
    )


NEWEST = max(m.version for m in load_migrations())


async def test_each_migration_applied_records_the_sha256_of_its_file(fresh_dsn: FreshDsn) -> None:
    dsn = await fresh_dsn()

    await migrate(dsn)

    rows = await fetch(dsn, "SELECT version, checksum FROM schema_migrations ORDER BY version")
    assert [(r["version"], r["checksum"]) for r in rows] == [
        (m.version, hashlib.sha256(m.sql.encode()).hexdigest()) for m in load_migrations()
    ]


async def test_status_lists_applied_with_when_and_pending(fresh_dsn: FreshDsn) -> None:
    dsn = await fresh_dsn()
    await migrate(dsn)
    await fetch(dsn, "DELETE FROM schema_migrations WHERE version = $1", NEWEST)

    found = await migrations.status(dsn)

    assert [(m.version, m.name) for m in found] == [(m.version, m.name) for m in load_migrations()]
    assert [m.state for m in found] == [migrations.APPLIED] * (len(found) - 1) + [
        migrations.PENDING
    ]
    assert all(m.applied_at is not None for m in found[:-1])
    assert found[-1].applied_at is None


async def test_status_of_a_database_not_created_yet_is_all_pending_and_creates_nothing(
    fresh_dsn: FreshDsn,
) -> None:
    dsn = await fresh_dsn(create=False)

    found = await migrations.status(dsn)

    assert {m.state for m in found} == {migrations.PENDING}
    with pytest.raises(asyncpg.InvalidCatalogNameError):
        await fetch(dsn, "SELECT 1")


async def test_rows_applied_before_checksums_get_the_current_one_recorded_once(
    fresh_dsn: FreshDsn, reference: Snapshot
) -> None:
    dsn = await fresh_dsn()
    await migrated_as_before_checksums(dsn)

    before = await migrations.status(dsn)
    first = await run_migrations(dsn)
    second = await run_migrations(dsn)

    assert {m.state for m in before} == {migrations.UNRECORDED}
    assert (first.applied, first.checksums_recorded) == ([], MIGRATIONS)
    assert (second.applied, second.checksums_recorded) == ([], [])
    assert {m.state for m in await migrations.status(dsn)} == {migrations.APPLIED}
    assert await snapshot(dsn) == reference


async def test_a_migration_changed_after_it_was_applied_stops_migrate_before_anything(
    fresh_dsn: FreshDsn,
) -> None:
    dsn = await fresh_dsn()
    await migrate(dsn)
    await fetch(dsn, "DELETE FROM schema_migrations WHERE version = $1", NEWEST)
    changed = load_migrations()[2]
    await file_changed_after_applied(dsn, changed.version)

    with pytest.raises(MigrationChangedError, match=changed.name):
        await migrate(dsn)

    states = {m.name: m.state for m in await migrations.status(dsn)}
    assert states[changed.name] == migrations.CHANGED
    assert states[MIGRATIONS[-1]] == migrations.PENDING  # nothing applied after the refusal


async def test_migrate_status_command_prints_a_table_or_json(fresh_dsn: FreshDsn) -> None:
    dsn = await fresh_dsn()
    await migrate(dsn)
    await fetch(dsn, "DELETE FROM schema_migrations WHERE version = $1", NEWEST)

    code, out, err = await run_migrate_command(dsn, "--status")
    json_code, json_out, _ = await run_migrate_command(dsn, "--status", "--json")

    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["VERSION", "MIGRATION", "STATE", "APPLIED_AT"]
    rows = {line.split()[1]: line.split()[2:] for line in lines[1 : 1 + len(MIGRATIONS)]}
    assert rows[MIGRATIONS[0]][0] == "applied"
    assert rows[MIGRATIONS[0]][1].startswith("20")  # when: an ISO date
    assert rows[MIGRATIONS[-1]] == ["pending", "-"]
    assert f"{len(MIGRATIONS) - 1} applied, 1 pending" in out
    assert json_code == 0
    shown = orjson.loads(json_out)
    assert shown["pending"] == [MIGRATIONS[-1]]
    assert shown["changed"] == []
    assert [m["state"] for m in shown["migrations"]][-2:] == ["applied", "pending"]


async def test_a_changed_migration_fails_the_command_and_its_status_with_exit_2(
    fresh_dsn: FreshDsn,
) -> None:
    dsn = await fresh_dsn()
    await migrate(dsn)
    changed = load_migrations()[0]
    await file_changed_after_applied(dsn, changed.version)

    code, out, err = await run_migrate_command(dsn)
    status_code, status_out, _ = await run_migrate_command(dsn, "--status")

    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("payhooks: migration file(s) changed after they were applied:")
    assert changed.name in err
    assert status_code == 2
    assert f"{changed.name}: changed after it was applied" in status_out


async def test_migrate_command_says_when_it_records_checksums_of_older_rows(
    fresh_dsn: FreshDsn,
) -> None:
    dsn = await fresh_dsn()
    await migrated_as_before_checksums(dsn)

    code, out, err = await run_migrate_command(dsn)

    assert code == 0, err
    assert out.splitlines() == [
        "migrations applied: none (schema is current)",
        "checksums recorded for migrations applied before payhooks kept them: "
        + ", ".join(MIGRATIONS),
    ]
