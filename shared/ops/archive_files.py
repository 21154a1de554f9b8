"""Inbox archive files: gzip-compressed JSON lines, one stored webhook a line (raw body in
base64, so the original bytes come back exactly), written to a temporary name, fsynced,
renamed and read back before anyone relies on them. Blocking file I/O: callers run it in a
thread."""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import hashlib
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

SUFFIX = ".jsonl.gz"
# What an archived line holds: every inbox column, the body as base64 under "body_base64".
COLUMNS = (
    "id",
    "provider",
    "event_id",
    "event_type",
    "payment_id",
    "received_at",
    "last_seen_at",
    "duplicates",
    "headers",
)


class ArchiveCorruptError(Exception):
    """An archive file is missing, or its checksum or row count is not what was recorded."""


@dataclass(frozen=True, slots=True)
class Written:
    file_name: str
    rows: int
    sha256: str


def line_of(row: Any) -> bytes:
    """One stored webhook (an inbox row: a record or a mapping) as an archive line."""
    record = {c: row[c] for c in COLUMNS}
    for c in ("received_at", "last_seen_at"):
        record[c] = record[c].isoformat()
    record["body_base64"] = base64.b64encode(bytes(row["body"])).decode()
    return orjson.dumps(record) + b"\n"


def event_of(line: bytes) -> dict[str, Any]:
    """An archive line back as the inbox row: `body` the original bytes, times as datetimes."""
    record: dict[str, Any] = orjson.loads(line)
    record["body"] = base64.b64decode(record.pop("body_base64"))
    for c in ("received_at", "last_seen_at"):
        record[c] = dt.datetime.fromisoformat(record[c])
    return record


class _Hashing:
    """The file under the gzip stream: hashes what reaches the disk."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return int(self._file.write(data))

    def flush(self) -> None:
        self._file.flush()


class ArchiveWriter:
    """One archive being written: lines go to a temporary file in `directory`; `finish` names it
    `<stem>-<first 12 hex of its SHA-256>.jsonl.gz`, so a rewrite never takes an old name."""

    def __init__(self, directory: Path, stem: str) -> None:
        self._directory, self._stem = directory, stem
        directory.mkdir(parents=True, exist_ok=True)
        self._temp = directory / f".{stem}.{uuid.uuid4().hex}.tmp"
        self._file = self._temp.open("xb")
        self._hashing = _Hashing(self._file)
        # mtime 0 and no file name in the header: the same rows make the same bytes.
        self._gzip = gzip.GzipFile(filename="", mode="wb", fileobj=self._hashing, mtime=0)
        self.rows = 0

    def write(self, lines: Iterable[bytes]) -> None:
        for line in lines:
            self._gzip.write(line)
            self.rows += 1

    def finish(self) -> Written:
        """Close, fsync, rename into place and fsync the directory; then read it back."""
        self._gzip.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        sha256 = self._hashing.digest.hexdigest()
        name = f"{self._stem}-{sha256[:12]}{SUFFIX}"
        os.replace(self._temp, self._directory / name)
        _fsync_directory(self._directory)
        written = Written(name, self.rows, sha256)
        verify(self._directory, written)
        return written

    def abandon(self) -> None:
        """Close and remove the temporary file (nothing was recorded)."""
        self._gzip.close()
        self._file.close()
        self._temp.unlink(missing_ok=True)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checksum(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def verify(directory: Path, expected: Written) -> None:
    """ArchiveCorruptError unless the file is there with the checksum and the row count."""
    path = directory / expected.file_name
    try:
        sha256 = checksum(path)
        if sha256 != expected.sha256:
            raise ArchiveCorruptError(f"{expected.file_name}: sha256 {sha256} != recorded")
        rows = sum(1 for _ in lines(path))
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise ArchiveCorruptError(f"{expected.file_name}: {e}") from e
    if rows != expected.rows:
        raise ArchiveCorruptError(f"{expected.file_name}: {rows} rows != {expected.rows}")


def lines(path: Path) -> Iterator[bytes]:
    with gzip.open(path, "rb") as file:
        yield from file
