"""Schema migrations: numbered SQL files applied in order, once, under an advisory lock; the
sha256 of each is recorded, and a file changed after it was applied stops migrate."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import structlog

from shared.config_values import several_hosts

log = structlog.get_logger(__name__)

# Arbitrary constant shared by every payhooks process: "the migration lock".
_LOCK_KEY = 0x7061796B  # "payk"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


class MigrationChangedError(Exception):
    """Applied migrations whose files changed since: the schema is not what the files say."""

    def __init__(self, changed: Iterable[MigrationState]) -> None:
        names = ", ".join(m.name for m in changed)
        super().__init__(
            f"migration file(s) changed after they were applied: {names}. An applied migration"
            " never changes: restore the file (git log shared/migrations/) and put the change"
            " in a new migration"
        )


# What `payhooks migrate --status` says about each migration.
APPLIED = "applied"
PENDING = "pending"
CHANGED = "changed"  # applied, and its file changed since
UNRECORDED = "unrecorded"  # applied before checksums were kept: the next migrate records it
NO_FILE = "no file"  # applied, but this payhooks has no such migration (a newer one's?)


@dataclass(frozen=True, slots=True)
class MigrationState:
    version: int
    name: str
    state: str
    applied_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class MigrateResult:
    applied: list[str] = field(default_factory=list)
    # Applied before checksums were kept: their files' checksums are recorded as they are now.
    checksums_recorded: list[str] = field(default_factory=list)


def states(
    migrations: Iterable[Migration], rows: Iterable[Mapping[str, Any]]
) -> list[MigrationState]:
    """Each migration, file or bookkeeping row, compared with the other, by version."""
    recorded = {row["version"]: row for row in rows}
    found = []
    for migration in migrations:
        row = recorded.pop(migration.version, None)
        if row is None:
            found.append(MigrationState(migration.version, migration.name, PENDING))
            continue
        checksum = row.get("checksum")  # absent in a table from before checksums
        if checksum is None:
            state = UNRECORDED
        else:
            state = APPLIED if checksum == migration.checksum else CHANGED
        found.append(MigrationState(migration.version, migration.name, state, row["applied_at"]))
    for version, row in recorded.items():
        found.append(MigrationState(version, row["name"], NO_FILE, row["applied_at"]))
    return sorted(found, key=lambda m: m.version)


def load_migrations() -> list[Migration]:
    folder = resources.files("shared") / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append(Migration(version, entry.name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration numbers in {versions}")
    return found


async def ensure_database(dsn: str) -> None:
    """Create the database named in `dsn` if it does not exist (dev and test convenience)."""
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except asyncpg.InvalidCatalogNameError:
        name = urlsplit(dsn).path.lstrip("/")
        admin = await asyncpg.connect(dsn, database="postgres", timeout=5)
        try:
            # Identifiers cannot be bound as parameters; quote_ident makes the name safe.
            quoted = await admin.fetchval("SELECT quote_ident($1)", name)
            await admin.execute(f"CREATE DATABASE {quoted}")
            log.info("database.created", database=name)
        except (asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
            # Another process created it first: fine. (Two CREATE DATABASE racing for one
            # name fail on pg_database's unique index rather than with duplicate_database.)
            pass
        finally:
            await admin.close()
    else:
        await conn.close()


# A database just created on the primary reaches a standby once the standby has replayed it,
# and asyncpg stops at a listed host that lacks the database (no "next host" for that error):
# with several hosts, the connection is tried again meanwhile.
_NEW_DATABASE_WAIT_S = 10.0


async def _connect_created(dsn: str) -> asyncpg.Connection[Any]:
    deadline = time.monotonic() + (_NEW_DATABASE_WAIT_S if several_hosts(dsn) else 0.0)
    while True:
        try:
            conn: asyncpg.Connection[Any] = await asyncpg.connect(dsn, timeout=5)
        except asyncpg.InvalidCatalogNameError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
        else:
            return conn


async def migrate(dsn: str) -> list[str]:
    """Apply pending migrations (their names); safe to run from several processes at once."""
    return (await run_migrations(dsn)).applied


async def run_migrations(dsn: str) -> MigrateResult:
    """Apply pending migrations, or raise MigrationChangedError (then nothing is applied)."""
    await ensure_database(dsn)
    conn = await _connect_created(dsn)
    result = MigrateResult()
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
        try:
            await conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       version    integer     PRIMARY KEY,
                       name       text        NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now(),
                       checksum   text)"""
            )
            # Tables created before checksums were kept; a no-op afterwards.
            await conn.execute(
                "ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS checksum text"
            )
            migrations = load_migrations()
            found = states(migrations, await conn.fetch("SELECT * FROM schema_migrations"))
            changed = [m for m in found if m.state == CHANGED]
            if changed:
                raise MigrationChangedError(changed)
            state = {m.version: m.state for m in found}
            for migration in migrations:
                if state[migration.version] == UNRECORDED:
                    await conn.execute(
                        "UPDATE schema_migrations SET checksum = $2 WHERE version = $1",
                        migration.version,
                        migration.checksum,
                    )
                    result.checksums_recorded.append(migration.name)
                    log.info("migration.checksum_recorded", migration=migration.name)
                if state[migration.version] != PENDING:
                    continue
                async with conn.transaction():
                    await conn.execute(migration.sql)
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum)"
                        " VALUES ($1, $2, $3)",
                        migration.version,
                        migration.name,
                        migration.checksum,
                    )
                result.applied.append(migration.name)
                log.info("migration.applied", migration=migration.name)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
    finally:
        await conn.close()
    return result


async def status(dsn: str) -> list[MigrationState]:
    """Every migration, applied (with when) or pending; reads only, creates nothing."""
    try:
        conn: asyncpg.Connection[Any] = await asyncpg.connect(dsn, timeout=5)
    except asyncpg.InvalidCatalogNameError:
        return states(load_migrations(), [])  # no database yet: everything is pending
    try:
        rows: Iterable[Mapping[str, Any]] = await conn.fetch("SELECT * FROM schema_migrations")
    except asyncpg.UndefinedTableError:
        rows = []
    finally:
        await conn.close()
    return states(load_migrations(), rows)
