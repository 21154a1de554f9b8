"""X-Hub webhook signatures: lowercase hex HMAC-SHA256 over `timestamp + "." + raw_body`."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from shared.providers.xhub import ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def matching_secret(
    secrets: Iterable[bytes], timestamp: str, body: bytes, signature: str
) -> int | None:
    """The position in `secrets` of the first secret `signature` matches under, or None.

    Every secret is compared in constant time, and all of them are always tried, so the
    answer's timing says nothing about which secret matched or how much of it did. The
    position (never the secret) tells an operator which one X-Hub still signs with (rotation).
    """
    given = signature.strip().lower().encode("utf-8", "replace")
    matched: int | None = None
    for index, secret in enumerate(secrets):
        if hmac.compare_digest(sign(secret, timestamp, body).encode(), given) and matched is None:
            matched = index
    return matched


def verify(secrets: Iterable[bytes], timestamp: str, body: bytes, signature: str) -> bool:
    """True when `signature` matches under any configured secret (rotation)."""
    return matching_secret(secrets, timestamp, body, signature) is not None


def signed_headers(secret: bytes, event_id: str, body: bytes, now_s: float) -> dict[str, str]:
    """The headers X-Hub sends with `body` (the simulator's, the tests')."""
    timestamp = str(int(now_s))
    return {
        ID_HEADER: event_id,
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: sign(secret, timestamp, body),
        "Content-Type": "application/json",
    }
