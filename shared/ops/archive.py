"""Inbox retention with an archive (docs/retention.md): a day's partition past RETENTION_DAYS
is written to a checksummed gzip JSON-lines file in ARCHIVE_DIR, read back, recorded in
`inbox_archives` and only then dropped, all in one transaction; without ARCHIVE_DIR nothing
is expired (a payment's raw events are never dropped unarchived). Also what `payhooks archive`
reads: the archives and their checks, and one archived event."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import structlog

from shared.db import Executor
from shared.ops import archive_files
from shared.ops.archive_files import ArchiveCorruptError, ArchiveWriter, Written
from shared.queries import archives as archives_sql
from shared.queries import partitions as partitions_sql

log = structlog.get_logger(__name__)

_CHUNK = 1000


def day_range(day: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) of a UTC day: a partition's bounds."""
    start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    return start, start + dt.timedelta(days=1)


def stem(day: dt.date) -> str:
    return f"inbox-{day:%Y%m%d}"


@dataclass(frozen=True, slots=True)
class Expiry:
    """What one pass did with the days past the retention (counted by outcome: a day kept
    is met again by the next pass)."""

    archived: list[Written]
    refused: int = 0  # days kept for want of ARCHIVE_DIR
    postponed: int = 0  # days kept for the next pass: unpublished rows, a lock timeout


class DayPostponedError(Exception):
    """The day holds rows the sweeper still owes a publish: it is kept for a later pass."""

    def __init__(self, unpublished: int) -> None:
        super().__init__(f"{unpublished} row(s) not yet published")
        self.unpublished = unpublished


async def expire(pool: asyncpg.Pool[Any], retention_days: int, archive_dir: Path | None) -> Expiry:
    """Archive, then drop, every partition whose whole day is older than the retention; the
    archives written and the days kept. A day with rows the sweeper still owes a publish is
    kept (and logged). Without an archive directory nothing is dropped: logged as a warning
    each time."""
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=retention_days)
    async with pool.acquire() as conn:
        due = [d for d in await partitions_sql.days(conn) if day_range(d)[1] <= cutoff]
    if not due:
        return Expiry([])
    if archive_dir is None:
        log.warning(
            "inbox.expiry_refused",
            reason="ARCHIVE_DIR is not set: partitions past the retention are kept",
            days=[d.isoformat() for d in due],
        )
        return Expiry([], refused=len(due))
    written, postponed = [], 0
    for day in due:
        try:
            async with pool.acquire() as conn:
                archive = await archive_day(conn, day, archive_dir)
        except DayPostponedError as e:
            log.warning("inbox.expiry_postponed", day=day.isoformat(), unpublished=e.unpublished)
            postponed += 1
            continue
        except asyncpg.LockNotAvailableError:
            # The drop waited lock_timeout behind ingest's transactions: the next pass.
            log.info("inbox.expiry_postponed", day=day.isoformat(), reason="lock_timeout")
            postponed += 1
            continue
        if archive is not None:
            written.append(archive)
    return Expiry(written, postponed=postponed)


# Files in ARCHIVE_DIR no record names (a temporary file of a write that failed, a file an
# erasure replaced whose removal a crash cut short, which still holds the address) go once
# they are this old: any write of a file and its record's commit take far less.
UNRECORDED_KEPT_S = 3600.0


async def remove_unrecorded(pool: asyncpg.Pool[Any], archive_dir: Path) -> list[str]:
    """Remove the archive directory's files older than UNRECORDED_KEPT_S that no archive
    record names, under the archive lock (no archive is being written meanwhile); their
    names."""
    async with pool.acquire() as conn, conn.transaction():
        await archives_sql.lock_archives(conn)
        recorded = {r["file_name"] for r in await archives_sql.all_archives(conn)}
        removed = await asyncio.to_thread(_remove_unrecorded, archive_dir, recorded)
    if removed:
        log.warning("inbox.archive_files_removed", files=removed, reason="unrecorded")
    return removed


def _remove_unrecorded(directory: Path, recorded: set[str]) -> list[str]:
    if not directory.is_dir():
        return []
    cutoff = time.time() - UNRECORDED_KEPT_S
    removed = []
    for path in directory.iterdir():
        ours = path.name.startswith(("inbox-", ".inbox-"))
        if ours and path.name not in recorded and path.stat().st_mtime < cutoff:
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return sorted(removed)


async def archive_day(
    conn: asyncpg.Connection[Any] | asyncpg.pool.PoolConnectionProxy[Any],
    day: dt.date,
    archive_dir: Path,
) -> Written | None:
    """One day: its rows to a new archive file (verified), the file recorded and the
    partition dropped in one transaction; None if another reconciler archived it meanwhile.
    DayPostponedError (nothing changed) if the sweeper still owes a row of it a publish. A
    failure leaves the partition and at most an unrecorded file."""
    start, end = day_range(day)
    async with conn.transaction():
        # An erasure rewriting archives waits, and one in progress finishes first: it then
        # finds the day's rows in the inbox or in this archive, never in neither. Another
        # reconciler that archived the day meanwhile leaves nothing to do.
        await archives_sql.lock_archives(conn)
        if day not in await partitions_sql.days(conn):
            return None
        unpublished = await partitions_sql.unpublished_between(conn, start, end)
        if unpublished:
            raise DayPostponedError(unpublished)
        writer = await asyncio.to_thread(ArchiveWriter, archive_dir, stem(day))
        try:
            async for rows in archives_sql.day_rows(conn, start, end, _CHUNK):
                lines = [archive_files.line_of(r) for r in rows]
                await asyncio.to_thread(writer.write, lines)
            written = await asyncio.to_thread(writer.finish)
        except BaseException:
            await asyncio.to_thread(writer.abandon)
            raise
        try:
            await archives_sql.record(
                conn, written.file_name, start, end, written.rows, written.sha256
            )
            await partitions_sql.drop(conn, day)
        except BaseException:
            # Not recorded after all (the next pass writes the day again).
            await asyncio.to_thread((archive_dir / written.file_name).unlink, missing_ok=True)
            raise
    log.info(
        "inbox.archived",
        day=day.isoformat(),
        file=written.file_name,
        rows=written.rows,
        sha256=written.sha256,
    )
    return written


@dataclass(frozen=True, slots=True)
class ArchiveCheck:
    file_name: str
    range_from: dt.datetime
    range_to: dt.datetime
    rows: int
    sha256: str
    problem: str | None  # None: the file is there, its checksum and row count as recorded

    def as_json(self) -> dict[str, Any]:
        return {
            "file": self.file_name,
            "from": self.range_from.isoformat(),
            "to": self.range_to.isoformat(),
            "rows": self.rows,
            "sha256": self.sha256,
            "ok": self.problem is None,
            "problem": self.problem,
        }


async def checked(conn: Executor, archive_dir: Path) -> list[ArchiveCheck]:
    """Every recorded archive, each file read and checked against its record."""
    checks = []
    for r in await archives_sql.all_archives(conn):
        record = Written(r["file_name"], r["rows"], r["sha256"])
        try:
            await asyncio.to_thread(archive_files.verify, archive_dir, record)
            problem = None
        except ArchiveCorruptError as e:
            problem = str(e)
        checks.append(
            ArchiveCheck(
                r["file_name"], r["range_from"], r["range_to"], r["rows"], r["sha256"], problem
            )
        )
    return checks


class EventNotArchivedError(LookupError):
    """No archive holds the event."""


async def find_event(
    conn: Executor, archive_dir: Path, event_id: str, provider: str | None
) -> tuple[str, dict[str, Any]]:
    """The archived event (its file's name and the row, body as the original bytes). Its key
    names the day when it is still kept; otherwise every archive is read, newest first. A
    file is checked before it is believed: ArchiveCorruptError if one that would be read is
    not as recorded; EventNotArchivedError if none holds the event."""
    when = await archives_sql.key_received_at(conn, provider, event_id)
    records = list(reversed(await archives_sql.all_archives(conn)))
    if when:
        records = [r for r in records if any(r["range_from"] <= w < r["range_to"] for w in when)]
    for r in records:
        record = Written(r["file_name"], r["rows"], r["sha256"])
        await asyncio.to_thread(archive_files.verify, archive_dir, record)
        found = await asyncio.to_thread(_search, archive_dir / r["file_name"], event_id, provider)
        if found is not None:
            return r["file_name"], found
    raise EventNotArchivedError(event_id)


def _search(path: Path, event_id: str, provider: str | None) -> dict[str, Any] | None:
    needle = event_id.encode()
    for line in archive_files.lines(path):
        if needle not in line:
            continue
        event = archive_files.event_of(line)
        if event["event_id"] == event_id and provider in (None, event["provider"]):
            return event
    return None


class ArchivesUnreachableError(RuntimeError):
    """Archives are recorded but this process has no ARCHIVE_DIR to rewrite them in."""


Change = Callable[[dict[str, Any]], dict[str, Any] | None]


async def rewrite_archives(
    conn: Executor, archive_dir: Path | None, change: Change
) -> tuple[int, list[Path]]:
    """Pass every archived event through `change` (None: unchanged) and rewrite each archive
    with a changed event as a new file (verified, recorded with its checksum); run it in the
    caller's transaction, which holds the archives until it ends. The events changed and the
    replaced files, which the caller removes once the transaction committed. Every archive is
    checked first: ArchiveCorruptError if one is not as recorded (it can't be rewritten
    safely), ArchivesUnreachableError if there are archives and no directory."""
    await archives_sql.lock_archives(conn)
    records = await archives_sql.lock_all(conn)
    if not records:
        return 0, []
    if archive_dir is None:
        raise ArchivesUnreachableError("archives are recorded but ARCHIVE_DIR is not set")
    changed, replaced = 0, []
    for r in records:
        record = Written(r["file_name"], r["rows"], r["sha256"])
        await asyncio.to_thread(archive_files.verify, archive_dir, record)
        day = r["range_from"].astimezone(dt.UTC).date()
        count, written = await asyncio.to_thread(
            _rewrite_file, archive_dir, r["file_name"], stem(day), change
        )
        if written is None:
            continue
        await archives_sql.rewritten(conn, r["id"], written.file_name, written.sha256)
        changed += count
        replaced.append(archive_dir / r["file_name"])
    return changed, replaced


def _rewrite_file(
    directory: Path, file_name: str, file_stem: str, change: Change
) -> tuple[int, Written | None]:
    writer = ArchiveWriter(directory, file_stem)
    changed = 0
    try:
        for line in archive_files.lines(directory / file_name):
            new = change(archive_files.event_of(line))
            if new is None:
                writer.write([line])
            else:
                writer.write([archive_files.line_of(new)])
                changed += 1
    except BaseException:
        writer.abandon()
        raise
    if not changed:
        writer.abandon()
        return 0, None
    return changed, writer.finish()
