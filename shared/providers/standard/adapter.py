"""Standard Webhooks as a `Provider` (shared/providers/base.py): the registry's entry for it.
It has no standard API, so the reconciler never asks about its payments."""

from __future__ import annotations

from shared.providers.base import Provider
from shared.providers.standard import (
    ID_HEADER,
    PROVIDER,
    SECRETS_VARIABLE,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WEBHOOK_PATH,
)
from shared.providers.standard.events import canonical_body, encode, headline
from shared.providers.standard.signatures import matching_secret, parse_secrets, signed_headers

STANDARD = Provider(
    name=PROVIDER,
    webhook_path=WEBHOOK_PATH,
    secrets_variable=SECRETS_VARIABLE,
    parse_secrets=parse_secrets,
    id_header=ID_HEADER,
    timestamp_header=TIMESTAMP_HEADER,
    signature_header=SIGNATURE_HEADER,
    matching_secret=matching_secret,
    headline=headline,
    message_id_prefix=f"{PROVIDER}:",
    canonical_body=canonical_body,
    has_payment_api=False,
    encode=encode,
    signed_headers=signed_headers,
)
