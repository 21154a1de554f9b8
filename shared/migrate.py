"""Schema migrations: numbered SQL files applied in order, once, under an advisory lock."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import structlog

log = structlog.get_logger(__name__)

# Arbitrary constant shared by every payhooks process: "the migration lock".
_LOCK_KEY = 0x7061796B  # "payk"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


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


async def migrate(dsn: str) -> list[str]:
    """Apply pending migrations; safe to run from several processes at once."""
    await ensure_database(dsn)
    conn: asyncpg.Connection[Any] = await asyncpg.connect(dsn, timeout=5)
    applied: list[str] = []
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
        try:
            await conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       version    integer     PRIMARY KEY,
                       name       text        NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            for migration in load_migrations():
                if migration.version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(migration.sql)
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                        migration.version,
                        migration.name,
                    )
                applied.append(migration.name)
                log.info("migration.applied", migration=migration.name)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
    finally:
        await conn.close()
    return applied
