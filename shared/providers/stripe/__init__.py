"""Stripe (https://docs.stripe.com/webhooks) in one place: its names here, signatures, the
mapping of its events onto payhooks' canonical ones, its API client and the registry's entry
beside."""

from __future__ import annotations

from typing import Final

PROVIDER: Final = "stripe"  # the inbox's provider column, the metrics' provider label
WEBHOOK_PATH: Final = "/webhooks/stripe"
SECRETS_VARIABLE: Final = "STRIPE_WEBHOOK_SECRETS"
API_KEY_VARIABLE: Final = "STRIPE_API_KEY"
API_URL_VARIABLE: Final = "STRIPE_API_URL"
API_URL_DEFAULT: Final = "https://api.stripe.com"
# Which mode's events this deployment applies: live, test, or any (unset). An event of the
# other mode is stored under its Stripe type and applied by no worker (docs/providers.md).
LIVEMODE_VARIABLE: Final = "STRIPE_LIVEMODE"

# `t=<Unix seconds>,v1=<hex>[,v1=<hex>...][,v0=<hex>]`; the event id is the body's `id`.
SIGNATURE_HEADER: Final = "Stripe-Signature"
SECRET_PREFIX: Final = "whsec_"
SIGNATURE_SCHEME: Final = "v1"  # HMAC-SHA256; v0 (test-only, SHA1-era) is ignored
