"""Every provider payhooks speaks, by name. Adding one: its package beside xhub/ and
standard/ (a `Provider` in its adapter.py), one entry here, tests (docs/providers.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from shared.providers.base import Provider
from shared.providers.standard.adapter import STANDARD
from shared.providers.xhub.adapter import XHUB

PROVIDERS: Final[tuple[Provider, ...]] = (XHUB, STANDARD)
BY_NAME: Final[Mapping[str, Provider]] = {p.name: p for p in PROVIDERS}


def configured(secrets: Mapping[str, tuple[bytes, ...]]) -> tuple[Provider, ...]:
    """The providers with secrets (by name, as Settings.provider_secrets holds them): those
    ingest has a route for. A provider without secrets has none (404)."""
    return tuple(p for p in PROVIDERS if secrets.get(p.name))


def has_payment_api(provider: str) -> bool:
    """Whether the reconciler can ask about a payment of `provider` (an unknown name: as
    before providers had names, yes)."""
    known = BY_NAME.get(provider)
    return known is None or known.has_payment_api


def message_of(provider: str, event_id: str, body: bytes) -> tuple[str, bytes]:
    """A stored webhook as the message the workers read: its id (their idempotency key) and
    body (payhooks' canonical event, SPEC section 3's X-Hub shape)."""
    known = BY_NAME.get(provider)
    if known is None:
        return event_id, body
    if known.canonical_body is not None:
        body = known.canonical_body(body)
    return known.message_id_prefix + event_id, body
