"""The inbox: each verified webhook stored once per (provider, event id), with its publish claim."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
import orjson

from shared.db import Executor


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """A verified webhook about to be stored."""

    event_id: str
    event_type: str
    payment_id: str | None
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class StoredEntry:
    id: int
    event_id: str
    inserted: bool
    published: bool
    # True when this call holds the row's publish claim: the row is not yet confirmed by the
    # broker and nobody else is publishing it right now.
    must_publish: bool


# One statement stores a whole batch: new ids are inserted with a publish claim; ids already
# stored count a duplicate and take the claim only if the row is unpublished and unclaimed
# (its first publish failed, its claim expired, or its claim is one the caller knows was
# abandoned, $9). `xmax = 0` tells an insert from an update.
_STORE_BATCH = """
INSERT INTO inbox AS i
    (provider, event_id, event_type, payment_id, body, headers, claim_token, claimed_until)
SELECT $1, t.event_id, t.event_type, t.payment_id, t.body, t.headers::jsonb,
       $7, now() + make_interval(secs => $8)
FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[])
     AS t(event_id, event_type, payment_id, body, headers)
ON CONFLICT (provider, event_id) DO UPDATE SET
    duplicates = i.duplicates + 1,
    last_seen_at = now(),
    claim_token = CASE WHEN i.published_at IS NULL
                        AND (i.claimed_until IS NULL OR i.claimed_until < now()
                             OR i.claim_token = ANY($9::uuid[]))
                       THEN EXCLUDED.claim_token ELSE i.claim_token END,
    claimed_until = CASE WHEN i.published_at IS NULL
                          AND (i.claimed_until IS NULL OR i.claimed_until < now()
                               OR i.claim_token = ANY($9::uuid[]))
                         THEN EXCLUDED.claimed_until ELSE i.claimed_until END
RETURNING i.id, i.event_id, (i.xmax = 0) AS inserted, (i.published_at IS NOT NULL) AS published,
          (i.published_at IS NULL AND i.claim_token = $7) AS must_publish
"""


def storable_text(value: str) -> str:
    """PostgreSQL text and jsonb can't hold NUL or lone surrogates (undecodable header
    bytes); the exact bytes stay in `body`, this copy is for lookups and reading."""
    if "\x00" in value or not value.isascii():
        value = value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode()
    return value


def _storable_headers(headers: dict[str, str]) -> str:
    return orjson.dumps({storable_text(k): storable_text(v) for k, v in headers.items()}).decode()


async def store_batch(
    db: Executor,
    provider: str,
    entries: Sequence[InboxEntry],
    claim: uuid.UUID,
    lease_s: float,
    abandoned: Sequence[uuid.UUID] = (),
) -> list[StoredEntry]:
    """Store entries (distinct event ids) in one statement; one StoredEntry per entry."""
    rows = await db.fetch(
        _STORE_BATCH,
        provider,
        [storable_text(e.event_id) for e in entries],
        [storable_text(e.event_type) for e in entries],
        [None if e.payment_id is None else storable_text(e.payment_id) for e in entries],
        [e.body for e in entries],
        [_storable_headers(e.headers) for e in entries],
        claim,
        lease_s,
        list(abandoned),
    )
    return [
        StoredEntry(r["id"], r["event_id"], r["inserted"], r["published"], r["must_publish"])
        for r in rows
    ]


async def mark_published(db: Executor, ids: Sequence[int]) -> None:
    await db.execute(
        "UPDATE inbox SET published_at = now(), claim_token = NULL, claimed_until = NULL"
        " WHERE id = ANY($1::bigint[])",
        list(ids),
    )


async def release_claims(db: Executor, ids: Sequence[int], claim: uuid.UUID) -> None:
    """Give up a publish claim after a failed publish, so the next retry may publish at once."""
    await db.execute(
        "UPDATE inbox SET claimed_until = NULL"
        " WHERE id = ANY($1::bigint[]) AND claim_token = $2 AND published_at IS NULL",
        list(ids),
        claim,
    )


@dataclass(frozen=True, slots=True)
class ClaimState:
    published: bool
    # Unpublished and claimable now, by the same rule as _STORE_BATCH's ON CONFLICT.
    free: bool


async def claim_state(db: Executor, id: int, abandoned: Sequence[uuid.UUID]) -> ClaimState:
    """How a stored row's publish stands (one primary-key lookup: cheap enough to poll)."""
    row = await db.fetchrow(
        "SELECT published_at IS NOT NULL AS published,"
        " published_at IS NULL AND (claimed_until IS NULL OR claimed_until < now()"
        "                           OR claim_token = ANY($2::uuid[])) AS free"
        " FROM inbox WHERE id = $1",
        id,
        list(abandoned),
    )
    if row is None:  # retention deletes published rows only
        return ClaimState(published=True, free=False)
    return ClaimState(row["published"], row["free"])


async def take_over_claim(
    db: Executor, id: int, claim: uuid.UUID, lease_s: float, abandoned: Sequence[uuid.UUID]
) -> bool:
    """Claim a row whose holder let go (or whose lease ran out); False if it is published or
    someone else claimed it first. One conditional UPDATE, so at most one caller wins."""
    status = await db.execute(
        "UPDATE inbox SET claim_token = $2, claimed_until = now() + make_interval(secs => $3)"
        " WHERE id = $1 AND published_at IS NULL"
        " AND (claimed_until IS NULL OR claimed_until < now() OR claim_token = ANY($4::uuid[]))",
        id,
        claim,
        lease_s,
        list(abandoned),
    )
    return status == "UPDATE 1"


@dataclass(frozen=True, slots=True)
class Unpublished:
    id: int
    provider: str
    event_id: str
    event_type: str
    body: bytes


_CLAIM_UNPUBLISHED = """
UPDATE inbox SET claim_token = $1, claimed_until = now() + make_interval(secs => $2)
WHERE id IN (
    SELECT id FROM inbox
    WHERE published_at IS NULL AND (claimed_until IS NULL OR claimed_until < now())
    ORDER BY received_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
RETURNING id, provider, event_id, event_type, body
"""


async def claim_unpublished(
    db: Executor, claim: uuid.UUID, lease_s: float, limit: int
) -> list[Unpublished]:
    """Claim stored rows nobody is publishing (safe with several ingest replicas)."""
    rows = await db.fetch(_CLAIM_UNPUBLISHED, claim, lease_s, limit)
    return [Unpublished(**dict(r)) for r in rows]


async def webhooks_for_payment(conn: Executor, payment_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT i.event_id, i.event_type, i.body, i.received_at, i.duplicates, i.published_at,"
        " p.outcome AS processed_outcome"
        " FROM inbox i LEFT JOIN processed_events p"
        "   ON p.worker = 'orders' AND p.event_id = i.event_id"
        " WHERE i.payment_id = $1 ORDER BY i.received_at, i.id",
        payment_id,
    )


async def unpublished_count(conn: Executor) -> int:
    """Stored webhooks not yet confirmed by RabbitMQ (walks a partial index of those only)."""
    return int(await conn.fetchval("SELECT count(*) FROM inbox WHERE published_at IS NULL"))
