"""X-Hub as a `Provider` (shared/providers/base.py): the registry's entry for it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from shared.providers.base import Headline, MalformedWebhookError, Provider, comma_separated
from shared.providers.xhub import (
    ID_HEADER,
    PROVIDER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WEBHOOK_PATH,
)
from shared.providers.xhub.signatures import matching_secret, signed_headers


def parse_secrets(raw: str) -> tuple[bytes, ...]:
    secrets = tuple(part.encode() for part in comma_separated(raw))
    if not secrets:
        raise ValueError("must hold at least one secret")
    return secrets


def _matching_secret(
    secrets: Sequence[bytes], event_id: str, timestamp: str, body: bytes, signature: str
) -> int | None:
    return matching_secret(secrets, timestamp, body, signature)  # X-Hub signs no event id


def headline(payload: Mapping[str, Any]) -> Headline:
    event_type = payload.get("event")
    if not isinstance(event_type, str) or not event_type.strip():
        raise MalformedWebhookError('body has no "event" type')
    return Headline(event_type, payload.get("payment_id"))


def encode(event_id: str, event: Mapping[str, Any]) -> bytes:
    return orjson.dumps(event)  # X-Hub's body is the canonical event; the id is a header


XHUB = Provider(
    name=PROVIDER,
    webhook_path=WEBHOOK_PATH,
    secrets_variable="XHUB_WEBHOOK_SECRETS",
    parse_secrets=parse_secrets,
    id_header=ID_HEADER,
    timestamp_header=TIMESTAMP_HEADER,
    signature_header=SIGNATURE_HEADER,
    matching_secret=_matching_secret,
    headline=headline,
    message_id_prefix="",
    canonical_body=None,  # X-Hub's body is the canonical event
    has_payment_api=True,
    encode=encode,
    signed_headers=signed_headers,
)
