"""Stripe as a `Provider` (shared/providers/base.py): the registry's entry for it. Its event
id is the body's `id` and its timestamp the signature header's `t=`."""

from __future__ import annotations

from shared.providers.base import Provider
from shared.providers.stripe import PROVIDER, SECRETS_VARIABLE, SIGNATURE_HEADER, WEBHOOK_PATH
from shared.providers.stripe.events import canonical_body, headline
from shared.providers.stripe.signatures import (
    matching_secret,
    parse_secrets,
    timestamp_in_signature,
)

STRIPE = Provider(
    name=PROVIDER,
    webhook_path=WEBHOOK_PATH,
    secrets_variable=SECRETS_VARIABLE,
    parse_secrets=parse_secrets,
    id_header=None,
    timestamp_header=None,
    signature_header=SIGNATURE_HEADER,
    matching_secret=matching_secret,
    headline=headline,
    message_id_prefix=f"{PROVIDER}:",
    canonical_body=canonical_body,
    has_payment_api=False,
    timestamp_in_signature=timestamp_in_signature,
)
