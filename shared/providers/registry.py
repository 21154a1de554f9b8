"""Every provider payhooks speaks, by name. Adding one: its package beside xhub/ and
standard/ (a `Provider` in its adapter.py), one entry here, tests (docs/providers.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from shared.providers.base import Provider
from shared.providers.standard.adapter import STANDARD
from shared.providers.stripe.adapter import STRIPE
from shared.providers.xhub.adapter import XHUB

PROVIDERS: Final[tuple[Provider, ...]] = (XHUB, STANDARD, STRIPE)
BY_NAME: Final[Mapping[str, Provider]] = {p.name: p for p in PROVIDERS}
# Whose event an id given without a provider names (SPEC's webhooks are X-Hub's).
DEFAULT: Final[Provider] = XHUB


def configured(secrets: Mapping[str, tuple[bytes, ...]]) -> tuple[Provider, ...]:
    """The providers with secrets (by name, as Settings.provider_secrets holds them): those
    ingest has a route for. A provider without secrets has none (404)."""
    return tuple(p for p in PROVIDERS if secrets.get(p.name))


def has_payment_api(provider: str) -> bool:
    """Whether the reconciler can ask about a payment of `provider` (an unknown name: as
    before providers had names, yes)."""
    known = BY_NAME.get(provider)
    return known is None or known.has_payment_api


def asks_xhub(provider: str) -> bool:
    """Whether the reconciler asks X-Hub's API about a payment of `provider`: X-Hub's own, and
    (as before providers had names) one unknown to the registry; a provider with its own
    payment API (Stripe) is asked there or, without its key, not at all."""
    known = BY_NAME.get(provider)
    return known is None or (known.has_payment_api and known.payment_api is None)


def worker_id(provider: str, event_id: str) -> str:
    """The id the workers know a stored webhook by (their idempotency key, the transition's
    event id): X-Hub's event id as it is, any other provider's after its prefix."""
    known = BY_NAME.get(provider)
    return event_id if known is None else known.message_id_prefix + event_id


def message_of(provider: str, event_id: str, body: bytes) -> tuple[str, bytes]:
    """A stored webhook as the message the workers read: its id (worker_id) and body
    (payhooks' canonical event, SPEC section 3's X-Hub shape)."""
    known = BY_NAME.get(provider)
    if known is not None and known.canonical_body is not None:
        body = known.canonical_body(body)
    return worker_id(provider, event_id), body


def provider_of(message_id: str) -> str:
    """Whose event a message id (worker_id's) names: the provider whose prefix it carries,
    else X-Hub (its ids are bare; so are the reconciler's synthetic events, made from X-Hub's
    API)."""
    for provider in PROVIDERS:
        if provider.message_id_prefix and message_id.startswith(provider.message_id_prefix):
            return provider.name
    return DEFAULT.name
