"""X-Hub webhook signatures: lowercase hex HMAC-SHA256 over `timestamp + "." + raw_body`."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def verify(secrets: Iterable[bytes], timestamp: str, body: bytes, signature: str) -> bool:
    """True when `signature` matches under any configured secret (rotation).

    Every secret is compared in constant time, and all of them are always tried, so the
    answer's timing says nothing about which secret matched or how much of it did.
    """
    given = signature.strip().lower().encode("utf-8", "replace")
    matched = False
    for secret in secrets:
        matched |= hmac.compare_digest(sign(secret, timestamp, body).encode(), given)
    return matched
