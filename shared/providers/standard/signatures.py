"""Standard Webhooks signatures: `v1,` + base64 HMAC-SHA256(key, `{id}.{timestamp}.{body}`),
the key being the base64 after `whsec_`; one header may hold several, space-separated."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence

from shared.providers.base import comma_separated
from shared.providers.standard import (
    ID_HEADER,
    SECRET_PREFIX,
    SIGNATURE_HEADER,
    SIGNATURE_VERSION,
    TIMESTAMP_HEADER,
)

_MAX_SIGNATURES = 16  # more in one header is no rotation, only work for us


def parse_secrets(raw: str) -> tuple[bytes, ...]:
    """STANDARD_WEBHOOK_SECRETS (comma-separated `whsec_<base64>`, the prefix optional) as
    keys; ValueError naming the shape, never the value."""
    keys = []
    for secret in comma_separated(raw):
        encoded = secret.removeprefix(SECRET_PREFIX)
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("must be comma-separated whsec_<base64> secrets") from None
        if not key:
            raise ValueError("must be comma-separated whsec_<base64> secrets")
        keys.append(key)
    if not keys:
        raise ValueError("must hold at least one secret")
    return tuple(keys)


def sign(key: bytes, event_id: str, timestamp: str, body: bytes) -> str:
    """One `v1,<base64>` signature."""
    content = f"{event_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, content, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


def matching_secret(
    keys: Sequence[bytes], event_id: str, timestamp: str, body: bytes, signature: str
) -> int | None:
    """The position in `keys` of the first key one of the header's v1 signatures matches
    under, or None. Every key against every v1 signature, each compared in constant time,
    so the timing says nothing about which matched."""
    given = []
    for entry in signature.split()[:_MAX_SIGNATURES]:
        version, _, encoded = entry.partition(",")
        if version != SIGNATURE_VERSION:
            continue  # v1a (asymmetric) or a future version: not ours to check
        try:
            given.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    matched: int | None = None
    content = f"{event_id}.{timestamp}.".encode() + body
    for index, key in enumerate(keys):
        expected = hmac.new(key, content, hashlib.sha256).digest()
        for candidate in given:
            if hmac.compare_digest(expected, candidate) and matched is None:
                matched = index
    return matched


def signed_headers(key: bytes, event_id: str, body: bytes, now_s: float) -> dict[str, str]:
    """The headers a Standard Webhooks sender sends with `body` (tools, tests)."""
    timestamp = str(int(now_s))
    return {
        ID_HEADER: event_id,
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: sign(key, event_id, timestamp, body),
        "Content-Type": "application/json",
    }
