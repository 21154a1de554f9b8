"""Stripe as a `Provider` (shared/providers/base.py): the registry's entry for it. Its event
id is the body's `id` and its timestamp the signature header's `t=`; the reconciler asks its
API (`GET /v1/payment_intents/{id}`) through the shared client, with Stripe's path, version
header and reading (payments.py)."""

from __future__ import annotations

from shared.providers.base import PaymentApi, Provider
from shared.providers.stripe import (
    API_KEY_VARIABLE,
    API_URL_DEFAULT,
    API_URL_VARIABLE,
    LIVEMODE_VARIABLE,
    PROVIDER,
    SECRETS_VARIABLE,
    SIGNATURE_HEADER,
    WEBHOOK_PATH,
)
from shared.providers.stripe.events import canonical_body, encode, headline, parse_mode, screen
from shared.providers.stripe.payments import (
    API_VERSION,
    ROUTE,
    answer,
    parse_payment_intent,
    payment_path,
)
from shared.providers.stripe.signatures import (
    matching_secret,
    parse_secrets,
    signed_headers,
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
    # Asked when STRIPE_API_KEY is set (the reconciler has no client for it otherwise).
    has_payment_api=True,
    has_settlement=False,
    payment_api=PaymentApi(
        url_variable=API_URL_VARIABLE,
        url_default=API_URL_DEFAULT,
        key_variable=API_KEY_VARIABLE,
        path=payment_path,
        parse=parse_payment_intent,
        headers={"Stripe-Version": API_VERSION},
        route=ROUTE,
        answer=answer,
    ),
    timestamp_in_signature=timestamp_in_signature,
    options={LIVEMODE_VARIABLE: parse_mode},
    screen=screen,
    encode=encode,
    signed_headers=signed_headers,
)
