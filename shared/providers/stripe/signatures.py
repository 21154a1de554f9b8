"""Stripe signatures: `Stripe-Signature: t=<Unix seconds>,v1=<hex>,...`, each v1 the hex
HMAC-SHA256 of `{t}.{body}` keyed with the endpoint secret exactly as given (`whsec_...`, the
prefix included: Stripe's libraries key with the whole string). Several v1 entries may come
at once (while Stripe rolls an endpoint's secret it signs with both); v0 is ignored."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from shared.providers.base import comma_separated
from shared.providers.stripe import SECRET_PREFIX, SIGNATURE_HEADER, SIGNATURE_SCHEME

_MAX_ENTRIES = 32  # more in one header is no rotation, only work for us


def parse_secrets(raw: str) -> tuple[bytes, ...]:
    """STRIPE_WEBHOOK_SECRETS (comma-separated `whsec_...`) as keys, as given; ValueError
    naming the shape, never the value (an API key pasted here, `sk_...`, is caught)."""
    keys = []
    for secret in comma_separated(raw):
        if not secret.startswith(SECRET_PREFIX) or len(secret) == len(SECRET_PREFIX):
            raise ValueError("must be comma-separated whsec_... endpoint secrets")
        keys.append(secret.encode())
    if not keys:
        raise ValueError("must hold at least one secret")
    return tuple(keys)


def _entries(header: str) -> list[tuple[str, str]]:
    pairs = []
    for item in header.split(",")[:_MAX_ENTRIES]:
        key, sep, value = item.strip().partition("=")
        if sep:
            pairs.append((key.strip(), value.strip()))
    return pairs


def timestamp_in_signature(header: str) -> str:
    """The header's `t=` ("" when it has none)."""
    return next((value for key, value in _entries(header) if key == "t"), "")


def sign(key: bytes, timestamp: str, body: bytes) -> str:
    """One v1 signature (hex)."""
    return hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def matching_secret(
    keys: Sequence[bytes], event_id: str, timestamp: str, body: bytes, signature: str
) -> int | None:
    """The position in `keys` of the first key one of the header's v1 signatures matches
    under, or None. Every key against every v1 signature, each compared in constant time.
    `event_id` is not signed by Stripe (it is in the body, which is)."""
    del event_id
    given = [
        value.encode("ascii", "replace")
        for key, value in _entries(signature)
        if key == SIGNATURE_SCHEME
    ]
    matched: int | None = None
    for index, key in enumerate(keys):
        expected = sign(key, timestamp, body).encode()
        for candidate in given:
            if hmac.compare_digest(expected, candidate) and matched is None:
                matched = index
    return matched


def signed_headers(key: bytes, event_id: str, body: bytes, now_s: float) -> dict[str, str]:
    """The headers Stripe sends with `body` (tools, tests); `event_id` is in the body, not
    in a header."""
    del event_id
    timestamp = str(int(now_s))
    return {
        SIGNATURE_HEADER: f"t={timestamp},{SIGNATURE_SCHEME}={sign(key, timestamp, body)}",
        "Content-Type": "application/json; charset=utf-8",
    }
